// Checks of several ranks on the one GPU: gloo-staging (two data-parallel
// ranks) and tp-pp (TP2, PP2), each against one rank (gpu_check.h). One GPU
// cannot host two NCCL ranks (NCCL refuses a communicator whose ranks share
// a device), so the ranks meet over Gloo, their CUDA tensors staged through
// host memory: the path a job takes on GPUs without NCCL.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/gpu_check.h"

namespace loom::gpu_check {
namespace {

// Loss tolerances of several ranks against one, as the largest relative
// difference of any step's loss: the CPU's is the engine's own tests'
// (trainer_test.cc, layout_trainer_test.cc); on a GPU the reductions split
// differently again (the ranks' halves summed on the host), so ten times it.
constexpr double kCpuTolerance = 1e-5;
constexpr double kCudaTolerance = 1e-4;
constexpr int kSteps = 8;

// Every rank's status; "" when all are OK.
std::string Failures(const std::vector<RunResult>& ranks) {
  std::string out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].status.ok()) {
      absl::StrAppend(&out, out.empty() ? "" : "; ", "rank ", r, ": ", ranks[r].status.ToString());
    }
  }
  return out;
}

// `layout`'s ranks against `reference` (one rank), as a PART line.
bool CompareLayout(Report& report, const std::string& part, const engine::TrainerConfig& config,
                   const ParallelLayout& layout, const RunResult& reference, double tolerance) {
  const std::vector<RunResult> ranks = TrainInProcess(config, layout);
  const std::string failures = Failures(ranks);
  if (!failures.empty()) return report.Part(part, false, failures);
  const LossDifference d = CompareLosses(reference.steps, ranks[0].steps);
  return report.Part(
      part, d.compared == kSteps && d.worst <= tolerance,
      absl::StrFormat("%s on %s over Gloo: %s; against one rank: %s; %.1f s",
                      LayoutName(layout), config.device, LossSpan(ranks[0]),
                      Describe(d, tolerance), ranks[0].seconds));
}

// The one-rank reference on `device`, as a PART line; whether it trained.
bool Reference(Report& report, const std::string& part, const engine::TrainerConfig& config,
               RunResult* out) {
  *out = TrainOneRank(config);
  std::string why;
  const bool ok = TrainedWell(*out, &why);
  report.Part(part, ok,
              ok ? absl::StrFormat("one rank on %s: %s, %.1f s", config.device, LossSpan(*out),
                                   out->seconds)
                 : why);
  return ok;
}

}  // namespace

int CheckGlooStaging(const std::vector<std::string>&) {
  Report report("gloo-staging");
  ScratchDir dir;
  absl::StatusOr<std::string> shard = WriteTextShard(dir.path(), 5, 200000);
  if (!shard.ok()) return report.Fail(shard.status().ToString());
  const ParallelLayout two{2, 1, 1};
  RunResult reference;
  const engine::TrainerConfig cpu = SmallGpt(*shard, "cpu", kSteps);
  if (Reference(report, "cpu-one-rank", cpu, &reference)) {
    CompareLayout(report, "cpu", cpu, two, reference, kCpuTolerance);
  }
  if (!CudaAvailable()) return report.SkipNoCuda();
  const engine::TrainerConfig cuda = SmallGpt(*shard, "cuda:0", kSteps);
  if (!Reference(report, "cuda-one-rank", cuda, &reference)) {
    return report.Fail("one rank on cuda:0 did not train");
  }
  const bool ok = CompareLayout(report, "cuda", cuda, two, reference, kCudaTolerance);
  return report.Finish(ok, "two ranks on cuda:0 over Gloo (host staging) train as one rank");
}

int CheckTensorAndPipeline(const std::vector<std::string>&) {
  Report report("tp-pp");
  ScratchDir dir;
  absl::StatusOr<std::string> shard = WriteTextShard(dir.path(), 6, 200000);
  if (!shard.ok()) return report.Fail(shard.status().ToString());
  // As layout_trainer_test.cc: micro-batches of 2 (four per step, so the
  // pipeline has some to overlap), and eps 1e-5, which keeps AdamW's first
  // steps from magnifying the last bits of tiny second moments.
  auto config_on = [&shard](const std::string& device) {
    engine::TrainerConfig c = SmallGpt(*shard, device, kSteps);
    c.micro_batch = 2;
    c.optimizer.eps = 1e-5;
    return c;
  };
  const ParallelLayout tp2{1, 2, 1}, pp2{1, 1, 2};
  RunResult reference;
  if (Reference(report, "cpu-one-rank", config_on("cpu"), &reference)) {
    CompareLayout(report, "cpu-tp2", config_on("cpu"), tp2, reference, kCpuTolerance);
    CompareLayout(report, "cpu-pp2", config_on("cpu"), pp2, reference, kCpuTolerance);
  }
  if (!CudaAvailable()) return report.SkipNoCuda();
  if (!Reference(report, "cuda-one-rank", config_on("cuda:0"), &reference)) {
    return report.Fail("one rank on cuda:0 did not train");
  }
  bool ok = CompareLayout(report, "cuda-tp2", config_on("cuda:0"), tp2, reference,
                          kCudaTolerance);
  ok = CompareLayout(report, "cuda-pp2", config_on("cuda:0"), pp2, reference, kCudaTolerance) &&
       ok;
  return report.Finish(ok, "TP2 and PP2 on cuda:0 over Gloo (host staging) train as one rank");
}

}  // namespace loom::gpu_check
