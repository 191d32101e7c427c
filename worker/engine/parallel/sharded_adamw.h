// The optimizer of a rank in a parallel layout, and sharded data
// parallelism: ZeRO stages 1 and 2 (Rajbhandari et al. 2020, "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", sec. 5.1-5.2)
// with the fused AdamW of fused_adamw.h.
//
// The rank's parameters, in the order given, are laid end to end in one
// flat index space of N elements, padded to n * S (n = data-parallel group
// size for stages 1 and 2, 1 for stage 0; S = ceil(N / n)). The parameters
// and their gradients become views into two flat buffers of that space, so
// the collectives run in place and backward accumulates straight into the
// gradient buffer (callers must not set gradients to none). Data-parallel
// rank r owns elements [r * S, (r + 1) * S) and keeps fp32 AdamW moments
// for them only (8 / n bytes a parameter instead of 8):
//   stage 0: the whole state on every replica; the gradients are
//            all-reduced while the step's last backward runs
//            (BeginLastBackward, FinishGradientReduction), or by Step() when
//            the caller did not ask for that (plain data parallelism with the
//            layout-wide norm);
//   stage 1: gradients accumulate whole over the micro-batches; Step()
//            reduce-scatters them once;
//   stage 2: no whole-model gradient buffer; during every backward each
//            gradient goes, in buckets, to the rank that owns its slice and
//            is freed (gradient_partitioner.h), so a rank holds its [S]
//            accumulator and a few buckets in flight: 4 / n bytes a
//            parameter plus O(bucket) instead of 4.
// Then Step() averages the gradient shard over the group, takes the global
// gradient norm (over the data group's shards and, as
// ClipGradNormAcrossGroups does, over the tensor and pipeline groups),
// skips the step on a non-finite gradient, applies AdamW to the shard with
// the clip factor folded into the gradient scale, and all-gathers the
// updated shards in place. Gradients are zero when it returns.
//
// The arithmetic per element is that of torch::optim::AdamW and of the
// trainer's fused step, so training under ZeRO equals plain data
// parallelism up to the order of the gradient sums.
//
// Thread-compatible. Collective: every rank of the data group runs the same
// backwards and calls FinishGradientReduction / Step the same number of
// times, in the same order.
#ifndef LOOM_WORKER_ENGINE_PARALLEL_SHARDED_ADAMW_H_
#define LOOM_WORKER_ENGINE_PARALLEL_SHARDED_ADAMW_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "worker/engine/gradient_averager.h"
#include "worker/engine/ops/fused_adamw_torch.h"
#include "worker/engine/parallel/reduce_scatter.h"
#include "worker/engine/parallel/tensor_parallel.h"
#include "worker/engine/config.h"

namespace loom::engine {

class GradientPartitioner;

struct ShardedParameter {
  std::string name;      // full-model name (TensorParallelSplitOf reads it)
  torch::Tensor tensor;  // fp32, contiguous; all on one CPU or CUDA device
  bool decay = true;     // AdamW weight decay applies (dim() >= 2)
  bool counted_in_norm = true;  // false: another stage counts it (tied wte copy)
  // Its gradient is completed after backward (the tied wte of a pipeline's
  // first and last stages, summed between them): stage 0 reduces it last,
  // not while backward runs.
  bool completed_after_backward = false;
  // Elements other ranks of the tensor group hold alike (copied key/value
  // heads, tensor_parallel.h): counted once in the norm.
  ReplicatedSpan shared;
};

struct ShardedStepResult {
  bool applied = false;  // false: a gradient was inf or NaN; nothing changed
  double grad_norm = 0;  // global, before clipping
};

class ShardedAdamW {
 public:
  // zero_stage 0, 1 or 2. The flat space is padded to at least
  // min_total_elements: ranks of a tensor group pass the largest of their
  // element counts, so that their buffers are the same size (see the
  // constructor). `data_group` may be null (a group of one: ZeRO then
  // shards nothing but runs the same code). The groups must outlive this.
  ShardedAdamW(std::vector<ShardedParameter> parameters, const OptimizerConfig& config,
               int zero_stage, c10d::ProcessGroup* data_group,
               c10d::ProcessGroup* tensor_group = nullptr,
               c10d::ProcessGroup* pipeline_group = nullptr,
               ReduceScatterAlgorithm algorithm = ReduceScatterAlgorithm::kAuto,
               int64_t min_total_elements = 0);
  ~ShardedAdamW();

  // Stage 0 over a data group of more than one rank: the gradients of the
  // next backward, the step's last, are all-reduced over the data group as
  // they become ready (gradient_averager.h). Other stages: no-op.
  void BeginLastBackward();
  // Stage 0: waits for the reduction BeginLastBackward started, launching
  // what is left (parameters completed after backward). Stage 2: sends what
  // the backwards left (the parameters completed after backward among it)
  // and waits for every bucket, including the waits backward made. Returns
  // the seconds it blocked, 0 when nothing started (stage 1). Step does it
  // when the caller did not; call it after the step's last backward and
  // after any gradient the caller completes (the tied wte).
  double FinishGradientReduction();

  // The optimizer step at learning rate `lr` (see the class comment).
  // Gradients are reset afterwards. max_grad_norm <= 0: no clipping.
  ShardedStepResult Step(double lr, double max_grad_norm);

  int zero_stage() const { return zero_stage_; }
  int64_t step_count() const { return step_; }
  // The device the parameters, moments and buffers live on.
  const torch::Device& device() const { return device_; }
  // How the update runs (fused_adamw_torch.h AdamWUpdateOn): kAuto is the
  // CPU kernel on the CPU and LibTorch operations on CUDA; kTorchOps runs
  // the operations on the CPU too (tests).
  void set_update_path(FusedAdamWPath path) { update_path_ = path; }
  // "cpu-kernel" or "torch-ops".
  const char* update_implementation() const {
    return device_.is_cpu() && update_path_ == FusedAdamWPath::kAuto ? "cpu-kernel" : "torch-ops";
  }
  int64_t total_elements() const { return total_; }
  int64_t shard_elements() const { return shard_; }
  // This rank's slice [shard_begin, shard_begin + shard_elements) of the
  // flat index space, and its moments (for checkpoints).
  int64_t shard_begin() const { return shard_ * rank_; }
  const torch::Tensor& exp_avg() const { return exp_avg_; }
  const torch::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  // Bytes of optimizer state and gradient buffers this rank holds (moments,
  // the gradient buffer of stages 0 and 1, stage 2's accumulator and the
  // most its staging buckets held at once, the ring's scratch).
  int64_t state_bytes() const;

  // Checkpoints. The whole flat index space's moments, [total_elements()]
  // each (collective over the data group for stages 1 and 2: every rank
  // ends with every shard).
  void GatherMoments(torch::Tensor* exp_avg, torch::Tensor* exp_avg_sq) const;
  // Sets this rank's moments from whole-space ones ([total_elements()]
  // each) and the step count.
  void LoadMoments(const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq, int64_t step);
  // The parameters, replicated ones first (see the constructor), and the
  // offset of parameter i in the flat index space.
  int64_t offset_of(size_t i) const { return offsets_[i]; }
  const std::vector<ShardedParameter>& parameters() const { return parameters_; }

 private:
  // Checks that every parameter's gradient is still its view of
  // flat_gradients_ (a caller that set gradients to none broke it).
  void CheckGradientViews() const;

  std::vector<ShardedParameter> parameters_;
  OptimizerConfig config_;
  int zero_stage_;
  c10d::ProcessGroup* data_group_;
  c10d::ProcessGroup* tensor_group_;
  c10d::ProcessGroup* pipeline_group_;
  ReduceScatterAlgorithm algorithm_;
  torch::Device device_{torch::kCPU};
  FusedAdamWPath update_path_ = FusedAdamWPath::kAuto;
  int ranks_ = 1;  // ranks the state is sharded over (1 for stage 0)
  int rank_ = 0;   // this rank's shard
  int64_t total_ = 0;  // N
  int64_t shard_ = 0;  // S
  std::vector<int64_t> offsets_;  // of each parameter in the flat space
  torch::Tensor exp_avg_, exp_avg_sq_;  // [S]
  torch::Tensor grad_shard_;            // stage 2: [S] accumulator
  std::unique_ptr<GradientPartitioner> partitioner_;  // stage 2
  // [n * S] each: every parameter (and, but for stage 2, its gradient) is a
  // view into these.
  torch::Tensor flat_parameters_;
  torch::Tensor flat_gradients_;
  torch::Tensor scratch_;               // the ring reduce-scatter's [S]
  // Stage 0's reduction overlapped with backward (null for other stages and
  // a data group of one), and how far this step's has got.
  std::unique_ptr<GradientAverager> averager_;
  enum class Reduction { kNone, kArmed, kDone } reduction_ = Reduction::kNone;
  int64_t step_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_SHARDED_ADAMW_H_
