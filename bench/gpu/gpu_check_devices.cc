// Checks of the device's own parts: adamw (the CUDA AdamW kernel through
// FusedAdamW), nvml (the energy counter), nccl (a group of one rank)
// (gpu_check.h).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/gpu_check.h"
#include "worker/engine/ops/fused_adamw_torch.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/telemetry/nvml.h"
#include "worker/telemetry/telemetry.h"

namespace loom::gpu_check {
namespace {

using engine::AdamWStepOptions;
using engine::AdamWStepResult;
using engine::FusedAdamW;

// --- adamw ------------------------------------------------------------------

// The same parameters, moments and gradients on the CPU and on cuda:0, each
// under its own FusedAdamW (the CPU kernel and the CUDA kernel). Sizes as
// fused_adamw_cuda_test.cu's, odd ones and a 1M tensor among them, so that
// chunk boundaries and tails are crossed.
class AdamWPair {
 public:
  explicit AdamWPair(uint64_t seed) {
    torch::manual_seed(seed);
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{33}, int64_t{70001},
                      int64_t{65536}, int64_t{150017}, int64_t{3}, int64_t{1} << 20}) {
      torch::Tensor p = (0.02 * torch::randn({n})).requires_grad_(true);
      cpu_.push_back(p);
      cuda_.push_back(p.detach().to(torch::Device(torch::kCUDA, 0)).requires_grad_(true));
    }
    const auto options = torch::optim::AdamWOptions(3e-3)
                             .betas(std::make_tuple(0.9, 0.95))
                             .eps(1e-8)
                             .weight_decay(0.1);
    cpu_optimizer_ = Make(cpu_, options);
    cuda_optimizer_ = Make(cuda_, options);
  }

  // Gives both sides the same fresh gradients (one NaN at `nan_at` >= 0 of
  // the largest tensor), steps both, returns both results.
  std::pair<AdamWStepResult, AdamWStepResult> Step(const AdamWStepOptions& options,
                                                   int64_t nan_at = -1) {
    for (size_t i = 0; i < cpu_.size(); ++i) {
      torch::Tensor g = torch::randn(cpu_[i].sizes());
      if (nan_at >= 0 && i + 1 == cpu_.size()) {
        g.narrow(0, nan_at, 1).fill_(std::numeric_limits<float>::quiet_NaN());
      }
      cpu_[i].mutable_grad() = g;
      cuda_[i].mutable_grad() = g.to(cuda_[i].device());
    }
    absl::StatusOr<AdamWStepResult> a = cpu_optimizer_->Step(options);
    absl::StatusOr<AdamWStepResult> b = cuda_optimizer_->Step(options);
    if (!a.ok() || !b.ok()) {
      error_ = absl::StrCat(a.status().ToString(), "; ", b.status().ToString());
      return {};
    }
    return {*a, *b};
  }

  // Parameters, then exp_avg and exp_avg_sq of each (when stepped), on the CPU.
  std::vector<torch::Tensor> State(bool cuda) const {
    const auto& params = cuda ? cuda_ : cpu_;
    const FusedAdamW& optimizer = cuda ? *cuda_optimizer_ : *cpu_optimizer_;
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& p : params) {
      out.push_back(p.detach().to(torch::kCPU));
      if (const auto* s = engine::FindAdamWState(optimizer, p)) {
        out.push_back(s->exp_avg().to(torch::kCPU));
        out.push_back(s->exp_avg_sq().to(torch::kCPU));
      }
    }
    return out;
  }

  const char* CudaImplementation() const {
    return cuda_optimizer_->ImplementationFor(cuda_.front().device());
  }
  const std::string& error() const { return error_; }

 private:
  static std::unique_ptr<FusedAdamW> Make(const std::vector<torch::Tensor>& params,
                                          const torch::optim::AdamWOptions& options) {
    absl::StatusOr<std::unique_ptr<FusedAdamW>> made =
        FusedAdamW::Create({torch::optim::OptimizerParamGroup(params)}, options);
    if (!made.ok()) throw std::runtime_error(made.status().ToString());
    return *std::move(made);
  }

  std::vector<torch::Tensor> cpu_, cuda_;
  std::unique_ptr<FusedAdamW> cpu_optimizer_, cuda_optimizer_;
  std::string error_;
};

// Largest |cuda - cpu| over all tensors, relative to each tensor's largest
// |cpu| value.
double RelativeDifference(const std::vector<torch::Tensor>& cpu,
                          const std::vector<torch::Tensor>& cuda) {
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double scale = cpu[i].abs().max().item<double>();
    const double diff = (cuda[i].to(torch::kDouble) - cpu[i].to(torch::kDouble)).abs().max()
                            .item<double>();
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

// --- nccl -------------------------------------------------------------------

// All-reduce (sum) and broadcast from rank 0 on a group of one, on
// `device`: both must leave the tensor as it was. The detail names what ran.
bool OneRankCollectives(c10d::ProcessGroup& group, const torch::Device& device,
                        std::string* detail) {
  const torch::Tensor values =
      torch::arange(int64_t{1} << 20, torch::TensorOptions().dtype(torch::kFloat)).to(device);
  std::vector<torch::Tensor> reduced = {values.clone()};
  c10d::AllreduceOptions sum;
  sum.reduceOp = c10d::ReduceOp::SUM;
  group.allreduce(reduced, sum)->wait();
  std::vector<torch::Tensor> broadcast = {values.clone()};
  c10d::BroadcastOptions root;
  root.rootRank = 0;
  group.broadcast(broadcast, root)->wait();
  const bool ok = torch::equal(reduced[0], values) && torch::equal(broadcast[0], values) &&
                  reduced[0].device() == device;
  *detail = absl::StrCat(group.getBackendName(), " group of ", group.getSize(), " on ",
                         device.str(), ": all-reduce (sum) and broadcast of 1M floats ",
                         ok ? "leave them unchanged" : "CHANGED them");
  return ok;
}

absl::StatusOr<engine::ParallelGroups> GroupOfOne(bool nccl) {
  engine::ParallelGroupOptions options;
  options.timeout_seconds = 60;
  options.local_addr = "127.0.0.1";
  options.nccl = nccl;
  return engine::CreateParallelGroups(c10::make_intrusive<c10d::HashStore>(), 0,
                                      ParallelLayout{1, 1, 1}, options);
}

}  // namespace

int CheckAdamW(const std::vector<std::string>&) {
  Report report("adamw");
  if (!CudaAvailable()) return report.SkipNoCuda();
  if (!FusedAdamW::HasCudaKernel()) {
    return report.Fail("this build has no CUDA AdamW kernel (no nvcc at configure time, or a "
                       "LibTorch without CUDA): CUDA parameters take LibTorch operations");
  }
  bool ok = true;
  {  // No clipping: the same coefficients, so the same bits.
    AdamWPair pair(1);
    AdamWStepOptions options;
    options.max_grad_norm = 0;
    bool applied = true;
    for (int step = 0; step < 3; ++step) {
      const auto [cpu, cuda] = pair.Step(options);
      applied = applied && cpu.applied && cuda.applied;
    }
    const bool same = BitEqual(pair.State(false), pair.State(true));
    ok = report.Part("unclipped", pair.error().empty() && applied && same,
                     absl::StrCat(pair.error(), "3 steps of 9 tensors (1.4M parameters) through ",
                                  pair.CudaImplementation(), ": parameters and moments ",
                                  same ? "equal the CPU kernel's bit for bit"
                                       : absl::StrFormat("differ from the CPU kernel's by %.3g",
                                                         RelativeDifference(pair.State(false),
                                                                            pair.State(true))))) &&
         ok;
  }
  {  // Clipping and unscaling: the norms' last bits depend on summation order.
    AdamWPair pair(2);
    AdamWStepOptions options;
    options.max_grad_norm = 1.0;
    options.inv_scale = 0.5;
    double norm_difference = 0, clip = 1;
    for (int step = 0; step < 3; ++step) {
      const auto [cpu, cuda] = pair.Step(options);
      norm_difference = std::max(norm_difference,
                                 std::abs(cpu.grad_norm - cuda.grad_norm) / cpu.grad_norm);
      clip = cpu.clip_coef;
    }
    const double difference = RelativeDifference(pair.State(false), pair.State(true));
    ok = report.Part("clipped", pair.error().empty() && norm_difference <= 1e-12 && clip < 1 &&
                                    difference <= 1e-6,
                     absl::StrFormat("%s3 steps clipped (factor %.3g) and unscaled: norms agree "
                                     "to %.3g (limit 1e-12), state to %.3g (limit 1e-06)",
                                     pair.error(), clip, norm_difference, difference)) &&
         ok;
  }
  {  // A NaN gradient: both skip the step, and nothing changes.
    AdamWPair pair(3);
    AdamWStepOptions options;
    options.max_grad_norm = 1.0;
    pair.Step(options);
    const std::vector<torch::Tensor> before = pair.State(true);
    const auto [cpu, cuda] = pair.Step(options, /*nan_at=*/123456);
    const bool unchanged = BitEqual(before, pair.State(true));
    ok = report.Part("nan-gradient", pair.error().empty() && !cpu.applied && !cuda.applied &&
                                         std::isnan(cuda.grad_norm) && unchanged,
                     absl::StrCat(pair.error(), "a NaN gradient: the CUDA step was ",
                                  cuda.applied ? "APPLIED" : "skipped", ", its state ",
                                  unchanged ? "unchanged" : "CHANGED")) &&
         ok;
  }
  return report.Finish(ok, "the CUDA kernel equals the CPU kernel bit for bit unclipped, within "
                           "1e-6 clipped, and skips a NaN step");
}

int CheckNvml(const std::vector<std::string>&) {
  Report report("nvml");
  if (!CudaAvailable()) return report.SkipNoCuda();
  absl::StatusOr<std::unique_ptr<telemetry::Nvml>> nvml = telemetry::Nvml::Open();
  if (!nvml.ok()) return report.Fail(absl::StrCat("NVML: ", nvml.status().ToString()));
  absl::StatusOr<std::string> name = (*nvml)->DeviceName(0);
  absl::StatusOr<int> count = (*nvml)->DeviceCount();
  report.Note(absl::StrCat("NVML (", (*nvml)->library(), ") sees ",
                           count.ok() ? absl::StrCat(*count) : count.status().ToString(),
                           " GPU(s); GPU 0 is ", name.ok() ? *name : name.status().ToString()));

  // A rank's power meter for GPU 0 (as loom-rank makes it), and the counter
  // read directly, around ~3 s of bf16 matrix products.
  telemetry::PowerMeter meter(1, static_cast<int>(std::thread::hardware_concurrency()), 0);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<uint64_t> before = (*nvml)->TotalEnergyMillijoules(0);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA, 0);
  const torch::Tensor a = torch::randn({8192, 8192}, bf16), b = torch::randn({8192, 8192}, bf16);
  torch::Tensor c = torch::empty({8192, 8192}, bf16);
  uint32_t loaded_milliwatts = 0;
  auto seconds = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (seconds() < 3.0) {
    for (int i = 0; i < 20; ++i) torch::mm_out(c, a, b);
    torch::cuda::synchronize();
    if (absl::StatusOr<uint32_t> mw = (*nvml)->PowerMilliwatts(0); mw.ok()) {
      loaded_milliwatts = std::max(loaded_milliwatts, *mw);
    }
  }
  absl::StatusOr<uint64_t> after = (*nvml)->TotalEnergyMillijoules(0);
  const double elapsed = seconds();
  const double meter_watts = meter.Account(elapsed);
  if (!before.ok() || !after.ok()) {
    return report.Fail(absl::StrCat("the energy counter: ", before.status().ToString(), "; ",
                                    after.status().ToString()));
  }
  const double counter_joules = (*after - *before) / 1e3;
  const double counter_watts = counter_joules / elapsed;
  report.Part("counter", counter_watts > 30 && counter_watts < 1500,
              absl::StrFormat("nvmlDeviceGetTotalEnergyConsumption: %.0f J in %.2f s of bf16 "
                              "matrix products = %.0f W (power draw read during it: up to %.0f W)",
                              counter_joules, elapsed, counter_watts, loaded_milliwatts / 1e3));
  const bool from_counter = meter.source() == "nvml" && meter.fallback_reason().empty();
  report.Part("power-meter",
              from_counter && std::abs(meter.energy_joules() - counter_joules) <=
                                  0.1 * counter_joules,
              absl::StrFormat("source %s%s; %.0f J (%.0f W) against the counter's %.0f J "
                              "(limit 10%%)",
                              meter.source(),
                              meter.fallback_reason().empty()
                                  ? " (the energy counter)"
                                  : absl::StrCat(" (", meter.fallback_reason(), ")"),
                              meter.energy_joules(), meter_watts, counter_joules));
  return report.Pass(absl::StrFormat("%.0f W under load from the energy counter; the power meter "
                                     "agrees",
                                     counter_watts));
}

int CheckNccl(const std::vector<std::string>&) {
  Report report("nccl");
  {  // The same calls on a Gloo group of one on the CPU.
    absl::StatusOr<engine::ParallelGroups> gloo = GroupOfOne(/*nccl=*/false);
    std::string detail = gloo.status().ToString();
    const bool ok = gloo.ok() && OneRankCollectives(*gloo->world, torch::kCPU, &detail);
    report.Part("cpu-gloo", ok, detail);
  }
  if (!CudaAvailable()) return report.SkipNoCuda();
  absl::StatusOr<engine::ParallelGroups> nccl = GroupOfOne(/*nccl=*/true);
  if (!nccl.ok()) return report.Fail(absl::StrCat("an NCCL group: ", nccl.status().ToString()));
  const torch::Device cuda(torch::kCUDA, 0);
  std::string detail;
  const bool collectives = OneRankCollectives(*nccl->world, cuda, &detail);
  report.Part("collectives", collectives && nccl->world->getBackendName() == "nccl", detail);

  // Train over the NCCL group (gradients and loop values through it) and
  // without a group: one rank either way, so the same numbers.
  ScratchDir dir;
  absl::StatusOr<std::string> shard = WriteTextShard(dir.path(), 4, 100000);
  if (!shard.ok()) return report.Fail(shard.status().ToString());
  const engine::TrainerConfig config = SmallGpt(*shard, "cuda:0", 6);
  const RunResult alone = TrainOneRank(config);
  const std::vector<RunResult> grouped = TrainInProcess(config, ParallelLayout{1, 1, 1},
                                                        /*nccl=*/true);
  const LossDifference d = CompareLosses(alone.steps, grouped[0].steps);
  const bool same = BitEqual(alone.parameters, grouped[0].parameters);
  report.Part("train", alone.status.ok() && grouped[0].status.ok() && d.compared == 6 &&
                           d.worst <= 1e-6,
              absl::StrFormat("%s%s6 steps over the NCCL group against none: %s, parameters %s",
                              alone.status.ok() ? "" : alone.status.ToString() + "; ",
                              grouped[0].status.ok() ? "" : grouped[0].status.ToString() + "; ",
                              Describe(d, 1e-6), same ? "bit for bit" : "differ"));
  return report.Pass("an NCCL group of one on cuda:0: all-reduce, broadcast, and training over it");
}

}  // namespace loom::gpu_check
