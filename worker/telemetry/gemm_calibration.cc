#include "worker/telemetry/gemm_calibration.h"

#include <chrono>

#include <torch/torch.h>

namespace loom::telemetry {

double MeasureGemmFlopsPerSecond(int n, int repeats) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::rand({n, n});
  torch::Tensor b = torch::rand({n, n});
  torch::Tensor c = torch::mm(a, b);  // warm-up: threads, caches
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    c = torch::mm(a, b);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

}  // namespace loom::telemetry
