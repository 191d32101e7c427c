// The optimizer of a rank in a parallel layout, and sharded data
// parallelism: ZeRO stages 1 and 2 (Rajbhandari et al. 2020,
// "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// sec. 5.1-5.2) with the fused AdamW of fused_adamw.h.
//
// The rank's parameters, in the order given, are laid end to end in one
// flat index space of N elements, padded to n * S (n = data-parallel group
// size, S = ceil(N / n)); data-parallel rank r owns elements
// [r * S, (r + 1) * S). It keeps fp32 AdamW moments for those elements only
// (8 bytes per parameter / n instead of 8), and:
//   stage 1: gradients accumulate whole on every rank over the micro-batches;
//            Step() reduce-scatters them once;
//   stage 2: after each micro-batch's backward, ReduceMicroBatch()
//            reduce-scatters the gradients into the owned shard's fp32
//            accumulator and frees them, so whole gradients live only
//            during one micro-batch's backward (2 bytes -> 4/n... per
//            parameter: 4 bytes of fp32 gradient become 4 / n between
//            micro-batches);
// and stage 0 keeps the whole state on every replica and all-reduces the
// gradients (plain data parallelism, with the layout-wide norm);
// then Step() averages the gradient shard over the group, takes the global
// gradient norm (over the data group's shards and, as
// ClipGradNormAcrossGroups does, over the tensor and pipeline groups),
// skips the step on a non-finite gradient, applies AdamW to the shard with
// the clip factor folded into the gradient scale, and all-gathers the
// updated parameters into every rank's tensors.
//
// The arithmetic per element is that of torch::optim::AdamW and of the
// trainer's fused step, so training under ZeRO equals plain data
// parallelism up to the order of the gradient sums.
//
// Thread-compatible. Collective: every rank of the data group calls
// ReduceMicroBatch / Step the same number of times, in the same order.
#ifndef LOOM_WORKER_ENGINE_PARALLEL_SHARDED_ADAMW_H_
#define LOOM_WORKER_ENGINE_PARALLEL_SHARDED_ADAMW_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "worker/engine/parallel/reduce_scatter.h"
#include "worker/engine/trainer.h"

namespace loom::engine {

struct ShardedParameter {
  std::string name;      // full-model name (TensorParallelSplitOf reads it)
  torch::Tensor tensor;  // fp32, contiguous, on the CPU
  bool decay = true;     // AdamW weight decay applies (dim() >= 2)
  bool counted_in_norm = true;  // false: another stage counts it (tied wte copy)
};

struct ShardedStepResult {
  bool applied = false;  // false: a gradient was inf or NaN; nothing changed
  double grad_norm = 0;  // global, before clipping
};

class ShardedAdamW {
 public:
  // zero_stage 0, 1 or 2. `data_group` may be null (a group of one: ZeRO then
  // shards nothing but runs the same code). The groups must outlive this.
  ShardedAdamW(std::vector<ShardedParameter> parameters, const OptimizerConfig& config,
               int zero_stage, c10d::ProcessGroup* data_group,
               c10d::ProcessGroup* tensor_group = nullptr,
               c10d::ProcessGroup* pipeline_group = nullptr,
               ReduceScatterAlgorithm algorithm = ReduceScatterAlgorithm::kAuto);

  // Stage 2: reduce-scatters this micro-batch's gradients into the owned
  // shard's accumulator and resets every parameter's gradient. Stage 1: no-op.
  void ReduceMicroBatch();

  // The optimizer step at learning rate `lr` (see the class comment).
  // Gradients are reset afterwards. max_grad_norm <= 0: no clipping.
  ShardedStepResult Step(double lr, double max_grad_norm);

  int zero_stage() const { return zero_stage_; }
  int64_t step_count() const { return step_; }
  int64_t total_elements() const { return total_; }
  int64_t shard_elements() const { return shard_; }
  // This rank's slice [shard_begin, shard_begin + shard_elements) of the
  // flat index space, and its moments (for checkpoints).
  int64_t shard_begin() const { return shard_ * rank_; }
  const torch::Tensor& exp_avg() const { return exp_avg_; }
  const torch::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  // Bytes of optimizer state and gradient buffers this rank holds now.
  int64_t state_bytes() const;

  // Checkpoints. The whole flat index space's moments, [total_elements()]
  // each (collective over the data group for stages 1 and 2: every rank
  // ends with every shard).
  void GatherMoments(torch::Tensor* exp_avg, torch::Tensor* exp_avg_sq) const;
  // Sets this rank's moments from whole-space ones ([total_elements()]
  // each) and the step count.
  void LoadMoments(const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq, int64_t step);
  // Offset of parameter i in the flat index space, and the parameters.
  int64_t offset_of(size_t i) const { return offsets_[i]; }
  const std::vector<ShardedParameter>& parameters() const { return parameters_; }

 private:
  // Copies every parameter's gradient (zeros where absent) into a fresh
  // padded flat buffer.
  torch::Tensor FlatGradients() const;

  std::vector<ShardedParameter> parameters_;
  OptimizerConfig config_;
  int zero_stage_;
  c10d::ProcessGroup* data_group_;
  c10d::ProcessGroup* tensor_group_;
  c10d::ProcessGroup* pipeline_group_;
  ReduceScatterAlgorithm algorithm_;
  int ranks_ = 1;  // ranks the state is sharded over (1 for stage 0)
  int rank_ = 0;   // this rank's shard
  int64_t total_ = 0;  // N
  int64_t shard_ = 0;  // S
  std::vector<int64_t> offsets_;  // of each parameter in the flat space
  torch::Tensor exp_avg_, exp_avg_sq_;  // [S]
  torch::Tensor grad_shard_;            // stage 2: [S] accumulator
  int micro_batches_ = 0;               // stage 2: since the last Step
  int64_t step_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_SHARDED_ADAMW_H_
