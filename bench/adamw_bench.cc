// Fused AdamW bandwidth benchmark: on N fp32 parameters, side
// by side in one run, median of several rounds:
//   stream:      a kernel with AdamW's access pattern and trivial arithmetic
//                (read p, g, m, v; write p, m, v): the bandwidth roofline;
//   fused:       AdamWUpdate, the fused AdamW pass (same access pattern; the
//                work of torch::optim::AdamW::step plus unscale/clip scaling);
//   norm pass:   GradSquaredNorm, the global norm + non-finite check that
//                FusedAdamWStep runs before the update (reads g only);
//   fused step:  FusedAdamWStep = norm pass + clip factor + update pass;
//   torch:       torch::optim::AdamW::step() on the same parameters, and
//                torch::nn::utils::clip_grad_norm_ + step() for the full step.
// GB/s counts 28 bytes per parameter everywhere (also for the fused step,
// which reads g twice), so GB/s ratios are time ratios. The kernels take
// turns within each round, so a slow spell on a shared host hits all alike.
//
// Usage: loom_adamw_bench [params] [threads] [rounds]
//   defaults: 100000000 parameters, 2 threads, 5 rounds (+ 1 warm-up).
// Last line (the fused AdamW pass against the stream and torch's step):
//   adamw: <fused GB/s> GB/s ratio=<fused/stream> of same-pattern stream,
//   <fused/torch>x torch
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

#include <omp.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "worker/engine/ops/fused_adamw.h"

namespace {

using loom::engine::AdamWGroup;
using loom::engine::AdamWKernelOptions;
using loom::engine::AdamWStepOptions;
using loom::engine::AdamWTensor;

constexpr double kBytesPerParam = 28;  // read p, g, m, v; write p, m, v
constexpr int64_t kParamsPerTensor = 1000000;

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float[], FreeDeleter>;

FloatBuffer Allocate(int64_t n) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
  return FloatBuffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// The stream kernel: per element the same loads and stores as AdamW, one
// multiply-add each, compiled for the widest vector unit available, with the
// same software prefetch as the fused kernel (2 KiB ahead on each array), so
// that the roofline is the best this access pattern gets, not a handicapped
// baseline.
constexpr int64_t kPrefetchElements = 512;

__attribute__((target_clones("avx512f", "avx2", "default"))) void StreamRange(
    float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
    int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // one 64-byte line of each array
    if (i + kPrefetchElements < n) {
      __builtin_prefetch(p + i + kPrefetchElements);
      __builtin_prefetch(g + i + kPrefetchElements);
      __builtin_prefetch(m + i + kPrefetchElements);
      __builtin_prefetch(v + i + kPrefetchElements);
    }
    for (int64_t j = i; j < i + 16; ++j) {
      const float gj = g[j];
      p[j] = p[j] - 1e-7f * gj;
      m[j] = 0.5f * m[j] + gj;
      v[j] = 0.5f * v[j] + gj * gj;
    }
  }
  for (; i < n; ++i) {
    const float gi = g[i];
    p[i] = p[i] - 1e-7f * gi;
    m[i] = 0.5f * m[i] + gi;
    v[i] = 0.5f * v[i] + gi * gi;
  }
}

// Splits the tensors, laid end to end, into one contiguous range per thread
// (as the fused kernel does) and runs StreamRange on the pieces.
void Stream(const std::vector<AdamWTensor>& tensors, int64_t total, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int index = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t begin = total * index / count / 16 * 16;
    const int64_t end = index + 1 == count ? total : total * (index + 1) / count / 16 * 16;
    int64_t offset = 0;
    for (const AdamWTensor& t : tensors) {
      const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + t.size);
      if (lo < hi) {
        const int64_t i = lo - offset;
        StreamRange(t.param + i, t.grad + i, t.exp_avg + i, t.exp_avg_sq + i, hi - lo);
      }
      offset += t.size;
    }
  }
}

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

const char* SimdName(loom::engine::SimdLevel level) {
  switch (level) {
    case loom::engine::SimdLevel::kAvx512:
      return "avx512";
    case loom::engine::SimdLevel::kAvx2:
      return "avx2";
    default:
      return "scalar";
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t params = argc > 1 ? std::atoll(argv[1]) : 100000000;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  if (params <= 0 || threads <= 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: %s [params>0] [threads>0] [rounds>0]\n", argv[0]);
    return 2;
  }
  at::set_num_threads(threads);
  torch::NoGradGuard no_grad;

  // One set of arrays for stream and fused; torch steps the same parameters
  // and gradients but keeps its own moments (allocated on its first step).
  FloatBuffer p = Allocate(params), g = Allocate(params), m = Allocate(params),
              v = Allocate(params);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < params; ++i) {
    // Deterministic values in the range of real ones; no element is zero.
    const uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    p[i] = 0.02f * (static_cast<float>(h >> 8) / 16777216.0f - 0.5f);
    g[i] = 1e-3f * (static_cast<float>((h >> 4) & 0xffff) / 65536.0f - 0.5f) + 1e-6f;
    m[i] = 0;
    v[i] = 0;
  }

  AdamWGroup group;
  group.hyperparams.lr = 1e-4;
  group.hyperparams.beta1 = 0.9;
  group.hyperparams.beta2 = 0.95;
  group.hyperparams.eps = 1e-8;
  std::vector<torch::Tensor> torch_params;
  for (int64_t offset = 0; offset < params; offset += kParamsPerTensor) {
    const int64_t size = std::min(kParamsPerTensor, params - offset);
    AdamWTensor t;
    t.param = p.get() + offset;
    t.grad = g.get() + offset;
    t.exp_avg = m.get() + offset;
    t.exp_avg_sq = v.get() + offset;
    t.size = size;
    t.weight_decay = 0.1;
    group.tensors.push_back(t);
    torch::Tensor tp = torch::from_blob(p.get() + offset, {size}, torch::kFloat);
    tp.mutable_grad() = torch::from_blob(g.get() + offset, {size}, torch::kFloat);
    torch_params.push_back(tp);
  }
  torch::optim::AdamW torch_adamw(torch_params, torch::optim::AdamWOptions(1e-4)
                                                    .betas(std::make_tuple(0.9, 0.95))
                                                    .eps(1e-8)
                                                    .weight_decay(0.1));

  std::vector<AdamWGroup> groups = {std::move(group)};
  const AdamWKernelOptions kernel{threads, loom::engine::SimdLevel::kAuto};
  AdamWStepOptions step_options;
  step_options.max_grad_norm = 1.0;
  int64_t step = 0;
  bool all_applied = true;
  auto advance_step = [&] {
    ++step;
    for (AdamWTensor& t : groups[0].tensors) t.step = step;
  };

  // Torch's full step: with max_norm far above the norm, clip_grad_norm_
  // only reads the gradients (its cheapest path), so the comparison favours
  // torch.
  const double torch_max_norm = 1e30;
  std::vector<double> stream_s, update_s, norm_s, step_s, torch_s, torch_clip_s;
  for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
    const double stream = Seconds([&] { Stream(groups[0].tensors, params, threads); });
    advance_step();
    const double update = Seconds([&] { loom::engine::AdamWUpdate(groups, 1.0, kernel); });
    double sum_squares = 0;
    const double norm =
        Seconds([&] { sum_squares = loom::engine::GradSquaredNorm(groups, kernel); });
    all_applied &= std::isfinite(sum_squares);
    advance_step();
    const double fused_step = Seconds(
        [&] { all_applied &= loom::engine::FusedAdamWStep(groups, step_options, kernel).applied; });
    const double torch_step = Seconds([&] { torch_adamw.step(); });
    const double torch_clip = Seconds([&] {
      torch::nn::utils::clip_grad_norm_(torch_params, torch_max_norm);
      torch_adamw.step();
    });
    if (round == 0) continue;
    stream_s.push_back(stream);
    update_s.push_back(update);
    norm_s.push_back(norm);
    step_s.push_back(fused_step);
    torch_s.push_back(torch_step);
    torch_clip_s.push_back(torch_clip);
  }
  if (!all_applied) {
    std::fprintf(stderr, "adamw: a fused step was skipped (non-finite gradient?)\n");
    return 1;
  }

  const double bytes = kBytesPerParam * static_cast<double>(params);
  auto gbps = [&](double seconds) { return bytes / seconds / 1e9; };
  const double stream = Median(stream_s), update = Median(update_s), norm = Median(norm_s),
               fused_step = Median(step_s), torch_step = Median(torch_s),
               torch_clip = Median(torch_clip_s);
  std::printf("adamw: %lld params in %zu tensors, %d threads, %s, median of %d rounds\n",
              static_cast<long long>(params), groups[0].tensors.size(), threads,
              SimdName(loom::engine::BestSimdLevel()), rounds);
  auto line = [&](const char* what, double seconds) {
    std::printf("adamw %-50s %7.1f ms %6.1f GB/s\n", what, 1e3 * seconds, gbps(seconds));
  };
  line("stream (same access pattern)", stream);
  line("fused AdamW pass (AdamWUpdate)", update);
  std::printf("adamw %-50s %7.1f ms %6.1f GB/s of gradients\n",
              "norm + non-finite pass (GradSquaredNorm)", 1e3 * norm, 4.0 * params / norm / 1e9);
  line("fused step (FusedAdamWStep: norm + clip + update)", fused_step);
  line("torch::optim::AdamW::step", torch_step);
  line("torch clip_grad_norm_ + AdamW::step", torch_clip);
  std::printf(
      "adamw fused step: %.1f GB/s ratio=%.2f of same-pattern stream, %.1fx torch "
      "clip_grad_norm_ + step\n",
      gbps(fused_step), stream / fused_step, torch_clip / fused_step);
  std::printf("adamw: %.1f GB/s ratio=%.2f of same-pattern stream, %.1fx torch\n", gbps(update),
              stream / update, torch_step / update);
  return 0;
}
