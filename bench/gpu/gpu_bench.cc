// GPU benchmark: on one CUDA device, side by side in one
// run, each figure against a reference measured in the same run:
//   1. references: the bf16 matrix-product rate (torch::mm of two bf16
//      8192 x 8192 matrices; the MFU denominator) and the copy bandwidth
//      (dst.copy_(src) of 1 GiB fp32, counting read + write);
//   2. training: a GPT of ~355M parameters (24 layers, d 1024, 16 heads,
//      seq 1024, vocab 50304, dropout 0), precision bf16 (autocast over the
//      blocks, fp32 master weights), the fused LM head + cross-entropy, and
//      the fused AdamW step with clipping (the CUDA kernel when the build has
//      it, else its LibTorch-operations path: the line says which). Tokens/s
//      and MFU = model FLOPs per token x tokens/s / the measured bf16 rate,
//      model FLOPs per token = 6 (12 L d^2 + V d) + 12 L T d as in
//      worker/telemetry/telemetry.cc (no recompute counted). Twice: the LM
//      head as the engine runs it (GptImpl::Loss: fp32 hidden and weight,
//      fp32 matrix products, TF32 off as LibTorch defaults) and in bf16 (the
//      hidden states and wte cast to bf16 before the fused loss);
//   3. fused AdamW on ~268M fp32 parameters (64 tensors of 4M): GB/s at 28
//      bytes per parameter (read p, g, m, v; write p, m, v; as bench/
//      adamw_bench.cc counts, although the step reads g twice) against the
//      copy bandwidth, and the same step as LibTorch operations
//      (FusedAdamWPath::kTorchOps) and as torch::optim::AdamW;
//   4. the fused loss against the unfused one (logits = h W^T, taken to fp32,
//      cross_entropy; forward + backward) on 8192 rows, d 1024, V 50304, with
//      bf16 and fp32 inputs: time and peak allocated memory above what was
//      allocated before, and how far the two losses differ.
//
// Usage: loom_gpu_bench [batch] [steps] [adamw_params]
//   defaults: batch 16 (x seq 1024 tokens per step), 20 timed steps after 3
//   warm-up steps, 268435456 AdamW parameters.
// Exit status: 0 done, 1 a failure, 77 no CUDA device ("no CUDA device" on
// stderr: this LibTorch has no CUDA, or it sees no GPU).
// Last line:
//   gpu: <tok/s> tok/s ratio=<MFU> MFU (...); fused AdamW <x> of copy
//   bandwidth; fused loss <t>x time, <m>x peak memory of unfused (bf16)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "worker/engine/ops/fused_adamw_torch.h"
#include "worker/engine/ops/fused_loss.h"
#include "worker/engine/gpt.h"

// LibTorch with CUDA (bench/gpu/CMakeLists.txt, bench/bench.cmake): peak
// memory from the caching allocator's statistics.
#ifndef LOOM_HAVE_TORCH_CUDA
#define LOOM_HAVE_TORCH_CUDA 0
#endif
#if LOOM_HAVE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace {

using loom::engine::AdamWStepOptions;
using loom::engine::FusedAdamW;
using loom::engine::FusedAdamWPath;
using loom::engine::FusedLinearCrossEntropy;
using loom::engine::Gpt;
using loom::engine::GptConfig;
using loom::engine::Precision;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "gpu_bench: %s\n", what.c_str());
  std::exit(1);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `fn` over `reps` runs after `warmup`, each run timed
// from a synchronised device to a synchronised device.
double TimeSeconds(const std::function<void()>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  torch::cuda::synchronize();
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    torch::cuda::synchronize();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return Median(seconds);
}

// Allocated bytes on the device (current, or the peak since the last
// ResetPeak); 0 without the CUDA allocator's headers.
int64_t AllocatedBytes(int device, bool peak) {
#if LOOM_HAVE_TORCH_CUDA
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto& aggregate = stats.allocated_bytes[0];  // StatType::AGGREGATE
  return peak ? aggregate.peak : aggregate.current;
#else
  (void)device;
  (void)peak;
  return 0;
#endif
}

void ResetPeak(int device) {
#if LOOM_HAVE_TORCH_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
#else
  (void)device;
#endif
}

void ReleaseCache() {
#if LOOM_HAVE_TORCH_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

constexpr double kMiB = 1024.0 * 1024.0;

// --- 1. References ---------------------------------------------------------

double Bf16MatmulFlopsPerSecond(const torch::Device& device) {
  const int64_t n = 8192;
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  const torch::Tensor a = torch::randn({n, n}, bf16), b = torch::randn({n, n}, bf16);
  torch::Tensor c = torch::empty({n, n}, bf16);
  const double seconds = TimeSeconds([&] { torch::mm_out(c, a, b); }, 3, 20);
  return 2.0 * n * n * n / seconds;
}

double CopyBytesPerSecond(const torch::Device& device) {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of fp32
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  const torch::Tensor src = torch::rand({n}, f32);
  torch::Tensor dst = torch::empty({n}, f32);
  const double seconds = TimeSeconds([&] { dst.copy_(src); }, 3, 20);
  return 2.0 * 4.0 * static_cast<double>(n) / seconds;
}

// --- 2. Training -----------------------------------------------------------

struct TrainFigures {
  double step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;
  double last_loss = 0;
  int64_t peak_bytes = 0;
  std::string adamw;
};

TrainFigures TrainGpt(const GptConfig& config, int batch, int steps, bool bf16_head,
                      double flops_per_token, double peak_flops, const torch::Device& device,
                      int device_index) {
  ReleaseCache();
  ResetPeak(device_index);
  torch::manual_seed(1);
  Gpt model(config);
  model->to(device);
  model->train();
  absl::StatusOr<std::unique_ptr<FusedAdamW>> made = loom::engine::MakeFusedAdamW(
      *model, torch::optim::AdamWOptions(3e-4)
                  .betas(std::make_tuple(0.9, 0.95))
                  .eps(1e-8)
                  .weight_decay(0.1));
  if (!made.ok()) Fail(made.status().ToString());
  std::unique_ptr<FusedAdamW> optimizer = *std::move(made);
  const std::vector<torch::Tensor> parameters = model->parameters();
  torch::Tensor wte;
  for (const auto& item : model->named_parameters()) {
    if (item.key() == "wte.weight") wte = item.value();
  }
  if (!wte.defined()) Fail("the model has no wte.weight");
  const torch::Tensor tokens = torch::randint(
      config.vocab_size, {batch, config.seq_len + 1},
      torch::TensorOptions().dtype(torch::kLong).device(device));
  const torch::Tensor x = tokens.narrow(1, 0, config.seq_len).contiguous();
  const torch::Tensor y = tokens.narrow(1, 1, config.seq_len).contiguous();

  TrainFigures out;
  out.adamw = optimizer->ImplementationFor(device);
  auto step = [&] {
    for (const torch::Tensor& p : parameters) {
      torch::Tensor mutable_p = p;
      mutable_p.mutable_grad() = torch::Tensor();
    }
    torch::Tensor loss =
        bf16_head ? FusedLinearCrossEntropy(model->Hidden(x).to(torch::kBFloat16),
                                            wte.to(torch::kBFloat16), y)
                  : model->Loss(x, y);
    loss.backward();
    AdamWStepOptions options;
    options.max_grad_norm = 1.0;
    absl::StatusOr<loom::engine::AdamWStepResult> stepped = optimizer->Step(options);
    if (!stepped.ok()) Fail(stepped.status().ToString());
    out.last_loss = loss.item<double>();
  };
  for (int i = 0; i < 3; ++i) step();
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  torch::cuda::synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.step_seconds = seconds / steps;
  out.tokens_per_second = static_cast<double>(batch) * config.seq_len / out.step_seconds;
  out.mfu = flops_per_token * out.tokens_per_second / peak_flops;
  out.peak_bytes = AllocatedBytes(device_index, /*peak=*/true);
  return out;
}

// --- 3. Fused AdamW --------------------------------------------------------

struct AdamWFigures {
  int64_t params = 0;
  double fused_bytes_per_second = 0;
  double torch_ops_bytes_per_second = 0;
  double torch_adamw_bytes_per_second = 0;
  std::string fused_implementation;
};

AdamWFigures AdamWBandwidth(int64_t total, const torch::Device& device) {
  ReleaseCache();
  const int64_t per_tensor = int64_t{1} << 22;
  const int64_t tensors = std::max<int64_t>(1, total / per_tensor);
  const double bytes = 28.0 * static_cast<double>(tensors * per_tensor);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  torch::manual_seed(2);
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < tensors; ++i) {
    torch::Tensor p = (torch::randn({per_tensor}, f32) * 0.02).requires_grad_(true);
    p.mutable_grad() = torch::randn({per_tensor}, f32) * 1e-3;
    params.push_back(p);
  }
  const auto options =
      torch::optim::AdamWOptions(1e-4).betas(std::make_tuple(0.9, 0.95)).weight_decay(0.1);
  AdamWFigures out;
  out.params = tensors * per_tensor;
  AdamWStepOptions step_options;
  step_options.max_grad_norm = 1e9;  // computed, never clipping
  for (bool torch_ops : {false, true}) {
    absl::StatusOr<std::unique_ptr<FusedAdamW>> made =
        FusedAdamW::Create({torch::optim::OptimizerParamGroup(params)}, options);
    if (!made.ok()) Fail(made.status().ToString());
    if (torch_ops) (*made)->set_path(FusedAdamWPath::kTorchOps);
    const double seconds = TimeSeconds(
        [&] {
          absl::StatusOr<loom::engine::AdamWStepResult> r = (*made)->Step(step_options);
          if (!r.ok() || !r->applied) Fail("fused AdamW step failed or was skipped");
        },
        3, 20);
    (torch_ops ? out.torch_ops_bytes_per_second : out.fused_bytes_per_second) = bytes / seconds;
    if (!torch_ops) out.fused_implementation = (*made)->ImplementationFor(device);
  }
  {
    torch::optim::AdamW reference(params, options);
    out.torch_adamw_bytes_per_second = bytes / TimeSeconds([&] { reference.step(); }, 3, 20);
  }
  return out;
}

// --- 4. Fused loss ---------------------------------------------------------

struct LossFigures {
  double fused_seconds = 0, unfused_seconds = 0;
  int64_t fused_bytes = 0, unfused_bytes = 0;
  double relative_difference = 0;
};

LossFigures FusedLoss(torch::ScalarType dtype, const torch::Device& device, int device_index) {
  ReleaseCache();
  const int64_t rows = 8192, d = 1024, vocab = 50304;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  torch::manual_seed(3);
  torch::Tensor hidden = torch::randn({rows, d}, options).requires_grad_(true);
  torch::Tensor weight = (torch::randn({vocab, d}, options) * 0.05).requires_grad_(true);
  const torch::Tensor targets = torch::randint(
      vocab, {rows}, torch::TensorOptions().dtype(torch::kLong).device(device));
  double fused_loss = 0, unfused_loss = 0;
  auto clear = [&] {
    hidden.mutable_grad() = torch::Tensor();
    weight.mutable_grad() = torch::Tensor();
  };
  auto fused = [&] {
    clear();
    torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets);
    loss.backward();
    fused_loss = loss.item<double>();
  };
  auto unfused = [&] {
    clear();
    torch::Tensor logits = torch::matmul(hidden, weight.t()).to(torch::kFloat);
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits, targets);
    loss.backward();
    unfused_loss = loss.item<double>();
  };
  // Peak memory of one call above what is allocated before it (inputs and
  // nothing else), the gradients it leaves included.
  auto peak_of = [&](const std::function<void()>& fn) {
    clear();
    torch::cuda::synchronize();
    const int64_t before = AllocatedBytes(device_index, /*peak=*/false);
    ResetPeak(device_index);
    fn();
    torch::cuda::synchronize();
    return AllocatedBytes(device_index, /*peak=*/true) - before;
  };
  LossFigures out;
  out.fused_bytes = peak_of(fused);
  out.unfused_bytes = peak_of(unfused);
  out.fused_seconds = TimeSeconds(fused, 2, 10);
  out.unfused_seconds = TimeSeconds(unfused, 2, 10);
  out.relative_difference = std::abs(fused_loss - unfused_loss) / std::abs(unfused_loss);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr,
                 "gpu_bench: no CUDA device (this LibTorch has no CUDA support, or it sees no "
                 "GPU); run bench/gpu/run.sh on a machine with an NVIDIA GPU\n");
    return 77;
  }
  const int batch = argc > 1 ? std::atoi(argv[1]) : 16;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  const int64_t adamw_params = argc > 3 ? std::atoll(argv[3]) : (int64_t{1} << 28);
  if (batch < 1 || steps < 1 || adamw_params < 1) {
    std::fprintf(stderr, "usage: %s [batch] [steps] [adamw_params]\n", argv[0]);
    return 2;
  }
  const int device_index = 0;
  const torch::Device device(torch::kCUDA, device_index);
  std::printf("device: cuda:%d of %zu; LibTorch %s; fused AdamW CUDA kernel in this build: %s\n",
              device_index, torch::cuda::device_count(), TORCH_VERSION,
              FusedAdamW::HasCudaKernel() ? "yes" : "no (LibTorch operations instead)");

  const double mm = Bf16MatmulFlopsPerSecond(device);
  const double copy = CopyBytesPerSecond(device);
  std::printf("reference: bf16 mm 8192^3 %.1f TFLOP/s; copy_ 1 GiB fp32 %.1f GB/s\n", mm / 1e12,
              copy / 1e9);

  GptConfig config;
  config.n_layer = 24;
  config.n_head = 16;
  config.d_model = 1024;
  config.seq_len = 1024;
  config.vocab_size = 50304;
  config.dropout = 0.0;
  config.precision = Precision::kBf16;
  config.on_gpu = true;
  const double l = config.n_layer, dm = config.d_model, v = config.vocab_size,
               t = config.seq_len;
  const double flops_per_token = 6.0 * (12.0 * l * dm * dm + v * dm) + 12.0 * l * t * dm;
  const double params = static_cast<double>(loom::engine::GptParameterCount(config));
  TrainFigures engine_head, bf16_head;
  for (bool bf16 : {false, true}) {
    TrainFigures f = TrainGpt(config, batch, steps, bf16, flops_per_token, mm, device,
                              device_index);
    std::printf(
        "train: GPT %.0fM params (L%d d%d h%d T%d V%d) bf16, batch %d, LM head %s, AdamW %s: "
        "%.1f ms/step, %.0f tok/s, MFU %.3f (%.1f TFLOP/s of %.1f), peak %.0f MiB, loss %.3f\n",
        params / 1e6, config.n_layer, config.d_model, config.n_head, config.seq_len,
        config.vocab_size, batch, bf16 ? "bf16" : "fp32 (as GptImpl::Loss)", f.adamw.c_str(),
        1e3 * f.step_seconds, f.tokens_per_second, f.mfu,
        flops_per_token * f.tokens_per_second / 1e12, mm / 1e12, f.peak_bytes / kMiB,
        f.last_loss);
    (bf16 ? bf16_head : engine_head) = f;
  }

  const AdamWFigures adamw = AdamWBandwidth(adamw_params, device);
  std::printf(
      "adamw: %lld params, fused (%s) %.1f GB/s = %.2f of copy bandwidth; as LibTorch "
      "operations %.1f GB/s; torch::optim::AdamW %.1f GB/s (28 bytes/param)\n",
      static_cast<long long>(adamw.params),
      adamw.fused_implementation.c_str(), adamw.fused_bytes_per_second / 1e9,
      adamw.fused_bytes_per_second / copy, adamw.torch_ops_bytes_per_second / 1e9,
      adamw.torch_adamw_bytes_per_second / 1e9);

  LossFigures bf16_loss;
  for (torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat}) {
    const LossFigures f = FusedLoss(dtype, device, device_index);
    std::printf(
        "loss %s (8192 x 1024 x 50304, fwd+bwd): fused %.2f ms, peak %.0f MiB; unfused %.2f ms, "
        "peak %.0f MiB; fused/unfused time %.2f, memory %.2f; losses differ by %.1e\n",
        dtype == torch::kBFloat16 ? "bf16" : "fp32", 1e3 * f.fused_seconds,
        f.fused_bytes / kMiB, 1e3 * f.unfused_seconds, f.unfused_bytes / kMiB,
        f.fused_seconds / f.unfused_seconds,
        f.unfused_bytes > 0 ? static_cast<double>(f.fused_bytes) / f.unfused_bytes : 0.0,
        f.relative_difference);
    if (dtype == torch::kBFloat16) bf16_loss = f;
  }

  std::printf(
      "gpu: %.0f tok/s ratio=%.3f MFU (bf16 GPT %.0fM, fused step, LM head fp32; %.3f with a "
      "bf16 head; vs bf16 mm %.0f TFLOP/s); fused AdamW %.2f of copy bandwidth; fused loss "
      "%.2fx time, %.2fx peak memory of unfused (bf16)\n",
      engine_head.tokens_per_second, engine_head.mfu, params / 1e6, bf16_head.mfu, mm / 1e12,
      adamw.fused_bytes_per_second / copy, bf16_loss.fused_seconds / bf16_loss.unfused_seconds,
      bf16_loss.unfused_bytes > 0
          ? static_cast<double>(bf16_loss.fused_bytes) / bf16_loss.unfused_bytes
          : 0.0);
  return 0;
}
