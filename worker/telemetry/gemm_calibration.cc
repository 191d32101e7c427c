#include "worker/telemetry/gemm_calibration.h"

#include <algorithm>
#include <chrono>

#include <torch/torch.h>

namespace loom::telemetry {

double MeasureGemmFlopsPerSecond(int n, int repeats) {
  using Clock = std::chrono::steady_clock;
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::rand({n, n});
  torch::Tensor b = torch::rand({n, n});
  torch::Tensor c = torch::empty({n, n});
  const auto warm_until = Clock::now() + std::chrono::milliseconds(250);
  for (int i = 0; i < 3 || Clock::now() < warm_until; ++i) torch::mm_out(c, a, b);
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    torch::mm_out(c, a, b);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

}  // namespace loom::telemetry
