// Optimizer pieces of the training loop: AdamW with decoupled weight decay on
// two parameter groups, the learning-rate schedule, and global-norm gradient
// clipping.
#ifndef LOOM_WORKER_ENGINE_OPTIMIZER_H_
#define LOOM_WORKER_ENGINE_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>

#include "worker/engine/config.h"

namespace loom::engine {

// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization",
// Algorithm 2) over `module`'s parameters, in two groups:
//   group 0, decay:    parameters with dim() >= 2 (weight matrices,
//                      embeddings), weight_decay = config.weight_decay;
//   group 1, no decay: everything else (biases, LayerNorm gains and biases),
//                      weight_decay = 0.
// Both groups start at lr = config.lr; the trainer overwrites it every step
// with SetLearningRate. A group left empty is still present, so that group
// indices (and saved optimizer state) do not depend on the model shape.
// The optimizer refers to the module's parameter tensors; keep the module
// alive as long as the optimizer.
std::unique_ptr<torch::optim::AdamW> MakeAdamW(const torch::nn::Module& module,
                                               const OptimizerConfig& config);

// Sets the learning rate of every parameter group.
void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

// Learning rate for the optimizer step with 0-based index `step` (llm.c
// train_gpt2.cu get_learning_rate; nanoGPT get_lr): with W = warmup_steps,
// N = total_steps, min_lr = max_lr * min_lr_ratio,
//   step <  W:      max_lr * (step + 1) / W             (linear warmup)
//   W <= step < N:  min_lr + 0.5 * (1 + cos(pi * (step - W) / (N - W)))
//                           * (max_lr - min_lr)          (cosine decay)
//   step >= N:      min_lr
// So the last warmup step runs at max_lr, the first decay step too, and the
// midpoint of the decay at (max_lr + min_lr) / 2.
double LearningRateAt(const ScheduleConfig& schedule, double max_lr, int64_t step);

// Global L2 norm of the gradients, sqrt(sum_p ||grad_p||^2), over parameters
// that have a gradient. If max_norm > 0 and the norm exceeds it, scales all
// gradients in place by max_norm / (norm + 1e-6) (torch.nn.utils.
// clip_grad_norm_). Returns the norm before clipping.
double ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPTIMIZER_H_
