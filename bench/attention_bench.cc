// Causal self-attention benchmark (attention on CPU): Loom's
// blocked kernel (worker/engine/ops/causal_attention.h) against the unfused
// LibTorch expression softmax(mask(QKᵀ/√hd))·V on the same qkv, forward +
// backward, alternating the two every round in one process so that other
// load falls on both alike. Default shape: the training benchmarks' configuration
// (batch 8, seq 256, d_model 256, 4 heads), one layer's attention.
//
// Usage: loom_attention_bench [rounds] [threads] [batch] [seq] [d_model] [heads]
// Output: the best and median time per side, then
//   attention: <fused ms> ms fwd+bwd ratio=<unfused median / fused median>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <torch/torch.h>

#include "worker/engine/ops/causal_attention.h"

namespace {

double Seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t fallback) {
    return argc > i ? std::atoll(argv[i]) : fallback;
  };
  const int rounds = static_cast<int>(arg(1, 30));
  const int threads = static_cast<int>(arg(2, 2));
  const int64_t batch = arg(3, 8), time = arg(4, 256), d = arg(5, 256), heads = arg(6, 4);
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  const torch::Tensor base = torch::randn({batch, time, 3 * d});
  const torch::Tensor upstream = torch::randn({batch, time, d});

  auto step = [&](bool fused) {
    torch::Tensor qkv = base.clone().requires_grad_(true);
    torch::Tensor y = fused ? loom::engine::CausalSelfAttention(qkv, heads)
                            : loom::engine::CausalSelfAttentionReference(qkv, heads);
    y.backward(upstream);
    return qkv.grad();
  };
  // Same answer first (a benchmark of a wrong kernel is worthless).
  const double diff = (step(true) - step(false)).abs().max().item<double>();
  if (!(diff < 1e-4)) {
    std::fprintf(stderr, "attention: fused and unfused gradients differ by %g\n", diff);
    return 1;
  }
  for (int i = 0; i < 3; ++i) {
    step(true);
    step(false);
  }
  std::vector<double> fused, unfused;
  for (int r = 0; r < rounds; ++r) {
    fused.push_back(Seconds([&] { step(true); }));
    unfused.push_back(Seconds([&] { step(false); }));
  }
  const double hd = static_cast<double>(d / heads);
  // Matrix-product FLOPs of full (unmasked) attention, forward + backward:
  // QKᵀ and PV forward, four products backward, 2·T²·hd each per head.
  const double flops = 6.0 * 2.0 * batch * heads * time * time * hd;
  const double f = Median(fused), u = Median(unfused);
  std::printf("shape: batch %lld, seq %lld, d_model %lld, %lld heads, %d threads, %d rounds\n",
              static_cast<long long>(batch), static_cast<long long>(time),
              static_cast<long long>(d), static_cast<long long>(heads), threads, rounds);
  std::printf("loom blocked causal: median %.2f ms (best %.2f), %.1f GFLOP/s-equivalent\n",
              f * 1e3, *std::min_element(fused.begin(), fused.end()) * 1e3, flops / f / 1e9);
  std::printf("unfused LibTorch:    median %.2f ms (best %.2f), %.1f GFLOP/s\n", u * 1e3,
              *std::min_element(unfused.begin(), unfused.end()) * 1e3, flops / u / 1e9);
  std::printf("max gradient difference %.2e\n", diff);
  std::printf("attention: %.2f ms fwd+bwd ratio=%.2f\n", f * 1e3, u / f);
  return 0;
}
