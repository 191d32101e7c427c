// Checks of training on cuda:0 against the CPU: gpt-precision,
// activation-checkpointing, memory (gpu_check.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/gpu_check.h"
#include "worker/engine/device_memory.h"
#include "worker/engine/gpt.h"

#if LOOM_HAVE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace loom::gpu_check {
namespace {

using engine::Precision;
using engine::TrainerConfig;

// Loss tolerances against the CPU fp32 run of the same model, data and
// seed, as the largest relative difference of any step's loss over 20
// steps. fp32: the same arithmetic in another order (TF32 stays off, as
// LibTorch defaults). bf16 (7 mantissa bits) and fp16 (10, with dynamic loss
// scaling) round the blocks' matrix products; the CPU's bf16 run must meet
// the bf16 bound too, which is what the rehearsal checks on a CPU machine.
// (Debian's CPU bf16 autocast came within 1.6e-4 of CPU fp32 here.)
constexpr double kFp32Tolerance = 1e-4;
constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp16Tolerance = 1e-2;
constexpr int kPrecisionSteps = 20;

double ToleranceOf(Precision p) {
  return p == Precision::kFp32 ? kFp32Tolerance
         : p == Precision::kBf16 ? kBf16Tolerance
                                 : kFp16Tolerance;
}

// Steps the fp16 loss scaler skipped (inf/NaN gradients), as "3, 4" or "none".
std::string SkippedSteps(const RunResult& run) {
  std::string steps;
  for (const loom::v1::StepMetrics& m : run.steps) {
    if (m.optimizer_step_skipped()) absl::StrAppend(&steps, steps.empty() ? "" : ", ", m.step());
  }
  return steps.empty() ? "none" : steps;
}

// One precision's run against the CPU fp32 reference, as a PART line.
bool ComparePrecision(Report& report, const std::string& part, const RunResult& run,
                      const RunResult& reference, Precision precision) {
  std::string why;
  if (!TrainedWell(run, &why)) return report.Part(part, false, why);
  const LossDifference d = CompareLosses(reference.steps, run.steps);
  const double tolerance = ToleranceOf(precision);
  const bool ok = d.compared == kPrecisionSteps && d.worst <= tolerance;
  std::string detail = absl::StrFormat("%s; against CPU fp32: %s; %.1f s", LossSpan(run),
                                       Describe(d, tolerance), run.seconds);
  if (precision == Precision::kFp16) {
    absl::StrAppend(&detail, absl::StrFormat("; loss scale %.0f, steps skipped: %s",
                                             run.steps.back().loss_scale(), SkippedSteps(run)));
  }
  return report.Part(part, ok, detail);
}

#if LOOM_HAVE_TORCH_CUDA
// torch.cuda.max_memory_allocated and friends, straight from the caching
// allocator (index 0 of each statistic is StatType::AGGREGATE).
struct AllocatorFigures {
  int64_t allocated = 0, reserved = 0, peak = 0;
};
AllocatorFigures ReadAllocator() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return {stats.allocated_bytes[0].current, stats.reserved_bytes[0].current,
          stats.allocated_bytes[0].peak};
}
void ResetAllocator() {
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
}
#endif

// The largest device_memory_peak_bytes any step reported.
uint64_t ReportedPeak(const RunResult& run) {
  uint64_t peak = 0;
  for (const loom::v1::StepMetrics& m : run.steps) {
    peak = std::max<uint64_t>(peak, m.device_memory_peak_bytes());
  }
  return peak;
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

int CheckGptPrecision(const std::vector<std::string>&) {
  Report report("gpt-precision");
  ScratchDir dir;
  absl::StatusOr<std::string> shard = WriteTextShard(dir.path(), 1, 200000);
  if (!shard.ok()) return report.Fail(shard.status().ToString());

  const RunResult reference = TrainOneRank(SmallGpt(*shard, "cpu", kPrecisionSteps));
  std::string why;
  const bool reference_ok = TrainedWell(reference, &why);
  if (!report.Part("cpu-fp32", reference_ok,
                   reference_ok ? absl::StrFormat("the reference: %s in %d steps, %.1f s",
                                                  LossSpan(reference), kPrecisionSteps,
                                                  reference.seconds)
                                : why)) {
    return report.Fail("the CPU fp32 reference run failed");
  }
  // The CPU's bf16 autocast against the same bound as CUDA's bf16.
  TrainerConfig cpu_bf16 = SmallGpt(*shard, "cpu", kPrecisionSteps);
  cpu_bf16.model.precision = Precision::kBf16;
  ComparePrecision(report, "cpu-bf16", TrainOneRank(cpu_bf16), reference, Precision::kBf16);

  if (!CudaAvailable()) return report.SkipNoCuda();
  bool ok = true;
  std::string figures;
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    TrainerConfig config = SmallGpt(*shard, "cuda:0", kPrecisionSteps);
    config.model.precision = p;
    const RunResult run = TrainOneRank(config);
    const std::string name = engine::PrecisionName(p);
    ok = ComparePrecision(report, absl::StrCat("cuda-", name), run, reference, p) && ok;
    const LossDifference d = CompareLosses(reference.steps, run.steps);
    absl::StrAppend(&figures, figures.empty() ? "" : ", ",
                    absl::StrFormat("%s %.2g", name, d.worst));
  }
  return report.Finish(ok, absl::StrCat("worst loss difference from CPU fp32 over ",
                                        kPrecisionSteps, " steps: ", figures));
}

int CheckActivationCheckpointing(const std::vector<std::string>&) {
  Report report("activation-checkpointing");
  ScratchDir dir;
  absl::StatusOr<std::string> shard = WriteTextShard(dir.path(), 2, 200000);
  if (!shard.ok()) return report.Fail(shard.status().ToString());

  // On the CPU, the small GPT: checkpointed segments of one block.
  {
    TrainerConfig plain = SmallGpt(*shard, "cpu", 4);
    TrainerConfig checkpointed = plain;
    checkpointed.model.activation_checkpointing = 1;
    const RunResult a = TrainOneRank(plain), b = TrainOneRank(checkpointed);
    const LossDifference d = CompareLosses(a.steps, b.steps);
    const bool ok = a.status.ok() && b.status.ok() && d.compared == 4 && d.worst <= 1e-6;
    const std::string parameters =
        BitEqual(a.parameters, b.parameters)
            ? "bit for bit"
            : absl::StrFormat("differ by %.3g", MaxAbsDifference(a.parameters, b.parameters));
    report.Part("cpu", ok,
                ok ? absl::StrCat("4 steps, segments of one block against none: ", Describe(d),
                                  ", parameters ", parameters)
                   : absl::StrCat(a.status.ToString(), "; ", b.status.ToString(), "; ",
                                  Describe(d, 1e-6)));
  }
  if (!CudaAvailable()) return report.SkipNoCuda();
#if LOOM_HAVE_TORCH_CUDA
  // On cuda:0 a model whose activations outweigh its state: 8 blocks, d 256,
  // seq 256, one micro-batch of 8; segments of ceil(sqrt(8)) = 3 blocks.
  bool ok = true;
  std::string figures;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    TrainerConfig plain = SmallGpt(*shard, "cuda:0", 6);
    plain.model.n_layer = 8;
    plain.model.d_model = 256;
    plain.model.seq_len = 256;
    plain.micro_batch = 8;
    plain.model.precision = p;
    TrainerConfig checkpointed = plain;
    checkpointed.model.activation_checkpointing = engine::kActivationCheckpointingSqrt;
    ResetAllocator();
    const RunResult a = TrainOneRank(plain);
    const uint64_t peak_plain = ReportedPeak(a);
    ResetAllocator();
    const RunResult b = TrainOneRank(checkpointed);
    const uint64_t peak_checkpointed = ReportedPeak(b);
    const LossDifference d = CompareLosses(a.steps, b.steps);
    // Bitwise equality is reported, not required. In fp32 the two runs do
    // the same arithmetic in the same order but for attention's backward,
    // whose fp32 accumulation order may differ: 1e-5. In bf16, SDPA runs
    // FlashAttention-2, whose backward sums the query gradient with atomic
    // adds: two runs of the same step, checkpointed or not, need not agree
    // to the last bit, and the difference, a few bf16 roundings (2^-8
    // relative) in some gradient entries, grows through 6 Adam steps. 1e-3
    // is ten times tighter than the gpt-precision check's bf16 bound, which
    // covers all of bf16's rounding, and far looser than that noise; a
    // recompute that changed the arithmetic (wrong segment input, lost
    // dropout state) moves the loss by more.
    const double limit = p == Precision::kBf16 ? 1e-3 : 1e-5;
    const bool bitwise = BitEqual(a.parameters, b.parameters);
    const bool part_ok = a.status.ok() && b.status.ok() && d.compared == 6 && d.worst <= limit &&
                         peak_checkpointed < peak_plain;
    const std::string name = engine::PrecisionName(p);
    report.Part(
        absl::StrCat("cuda-", name), part_ok,
        absl::StrFormat("%s%s6 steps, segments of 3 of 8 blocks against none: %s, parameters "
                        "%s; peak allocated %.0f MiB checkpointed, %.0f MiB plain",
                        a.status.ok() ? "" : a.status.ToString() + "; ",
                        b.status.ok() ? "" : b.status.ToString() + "; ", Describe(d, limit),
                        bitwise ? "bit for bit"
                                : absl::StrFormat("differ by up to %.3g",
                                                  MaxAbsDifference(a.parameters, b.parameters)),
                        peak_checkpointed / kMiB, peak_plain / kMiB));
    ok = ok && part_ok;
    absl::StrAppend(&figures, figures.empty() ? "" : "; ",
                    absl::StrFormat("%s: losses within %.2g, peak %.0f%% of plain", name, d.worst,
                                    100.0 * peak_checkpointed / std::max<uint64_t>(1, peak_plain)));
  }
  return report.Finish(ok, figures);
#else
  return report.Fail("unreachable: CUDA without LOOM_HAVE_TORCH_CUDA");
#endif
}

int CheckMemory(const std::vector<std::string>&) {
  Report report("memory");
  if (!CudaAvailable()) return report.SkipNoCuda();
#if LOOM_HAVE_TORCH_CUDA
  ScratchDir dir;
  absl::StatusOr<std::string> shard = WriteTextShard(dir.path(), 3, 400000);
  if (!shard.ok()) return report.Fail(shard.status().ToString());
  TrainerConfig config = SmallGpt(*shard, "cuda:0", 4);
  config.model.n_layer = 8;
  config.model.d_model = 512;
  config.model.n_head = 8;
  config.model.seq_len = 512;
  config.micro_batch = 8;
  ResetAllocator();
  const RunResult run = TrainOneRank(config);
  // Read at once, before anything else runs on the device.
  const AllocatorFigures torch_figures = ReadAllocator();
  const std::optional<engine::DeviceMemory> engine_figures = engine::CudaAllocatorMemory(0);
  if (!run.status.ok()) return report.Fail(run.status.ToString());
  if (!engine_figures) return report.Fail("CudaAllocatorMemory(0) reported nothing");
  const loom::v1::StepMetrics& last = run.steps.back();
  const double parameters = static_cast<double>(engine::GptParameterCount(config.model));
  const double state_bytes = 16.0 * parameters;  // weights, gradients, two moments: fp32
  // The engine reads what torch.cuda.max_memory_allocated() reads.
  report.Part("engine-reader", engine_figures->allocated_bytes == torch_figures.allocated &&
                                   engine_figures->reserved_bytes == torch_figures.reserved &&
                                   engine_figures->peak_allocated_bytes == torch_figures.peak,
              absl::StrFormat("CudaAllocatorMemory(0) allocated %d reserved %d peak %d; the "
                              "allocator's %d %d %d",
                              engine_figures->allocated_bytes, engine_figures->reserved_bytes,
                              engine_figures->peak_allocated_bytes, torch_figures.allocated,
                              torch_figures.reserved, torch_figures.peak));
  // The last step's report: the run's peak (nothing after the last step
  // allocates more), and the training state still held.
  const bool peak_ok = ReportedPeak(run) <= static_cast<uint64_t>(torch_figures.peak) &&
                       ReportedPeak(run) >= 0.95 * torch_figures.peak;
  report.Part("step-metrics-peak", peak_ok,
              absl::StrFormat("device_memory_peak_bytes %.1f MiB, max_memory_allocated %.1f MiB",
                              ReportedPeak(run) / kMiB, torch_figures.peak / kMiB));
  const double allocated = static_cast<double>(last.device_memory_allocated_bytes());
  const bool allocated_ok = allocated >= 12.0 * parameters &&
                            allocated <= 1.25 * state_bytes + 256 * kMiB &&
                            last.device_memory_reserved_bytes() >=
                                last.device_memory_allocated_bytes();
  report.Part("step-metrics-allocated", allocated_ok,
              absl::StrFormat("after step %d: allocated %.1f MiB (fp32 state of %.1fM parameters: "
                              "%.1f MiB), reserved %.1f MiB",
                              last.step(), allocated / kMiB, parameters / 1e6, state_bytes / kMiB,
                              last.device_memory_reserved_bytes() / kMiB));
  report.Part("peak-above-state", torch_figures.peak >= state_bytes,
              absl::StrFormat("peak %.1f MiB >= fp32 training state %.1f MiB",
                              torch_figures.peak / kMiB, state_bytes / kMiB));
  return report.Pass(absl::StrFormat("peak %.0f MiB as torch.cuda.max_memory_allocated reads it; "
                                     "%.0f MiB held after the last step",
                                     torch_figures.peak / kMiB, allocated / kMiB));
#else
  return report.Fail("unreachable: CUDA without LOOM_HAVE_TORCH_CUDA");
#endif
}

}  // namespace loom::gpu_check
