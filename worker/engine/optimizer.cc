#include "worker/engine/optimizer.h"

#include <cmath>
#include <tuple>
#include <utility>

namespace loom::engine {

std::unique_ptr<torch::optim::AdamW> MakeAdamW(const torch::nn::Module& module,
                                               const OptimizerConfig& config) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const torch::Tensor& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  auto options = [&](double weight_decay) {
    return torch::optim::AdamWOptions(config.lr)
        .betas(std::make_tuple(config.beta1, config.beta2))
        .eps(config.eps)
        .weight_decay(weight_decay);
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(decay),
                      std::make_unique<torch::optim::AdamWOptions>(options(config.weight_decay)));
  groups.emplace_back(std::move(no_decay),
                      std::make_unique<torch::optim::AdamWOptions>(options(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options(config.weight_decay));
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    group.options().set_lr(lr);
  }
}

double LearningRateAt(const ScheduleConfig& schedule, double max_lr, int64_t step) {
  const double min_lr = max_lr * schedule.min_lr_ratio;
  const int64_t warmup = schedule.warmup_steps, total = schedule.total_steps;
  if (step < warmup) {
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  if (step >= total) return min_lr;
  const double decay_ratio =
      static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * decay_ratio));
  return min_lr + coeff * (max_lr - min_lr);
}

double ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  // Accumulate in double so the norm does not depend on summation order more
  // than necessary.
  double sum_squares = 0;
  for (const torch::Tensor& p : parameters) {
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    sum_squares += g.to(torch::kDouble).pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(sum_squares);
  if (max_norm > 0 && norm > max_norm) {
    const double coeff = max_norm / (norm + 1e-6);
    for (const torch::Tensor& p : parameters) {
      if (p.grad().defined()) p.mutable_grad().mul_(coeff);
    }
  }
  return norm;
}

}  // namespace loom::engine
