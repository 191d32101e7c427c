#include "worker/engine/parallel/sharded_adamw.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "worker/engine/ops/fused_adamw.h"
#include "worker/engine/parallel/gradient_partitioner.h"
#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {

ShardedAdamW::ShardedAdamW(std::vector<ShardedParameter> parameters,
                           const OptimizerConfig& config, int zero_stage,
                           c10d::ProcessGroup* data_group, c10d::ProcessGroup* tensor_group,
                           c10d::ProcessGroup* pipeline_group, ReduceScatterAlgorithm algorithm,
                           int64_t min_total_elements)
    : parameters_(std::move(parameters)),
      config_(config),
      zero_stage_(zero_stage),
      data_group_(data_group),
      tensor_group_(tensor_group),
      pipeline_group_(pipeline_group),
      algorithm_(algorithm) {
  TORCH_CHECK(zero_stage_ >= 0 && zero_stage_ <= 2, "ShardedAdamW runs ZeRO stage 0, 1 or 2, got ",
              zero_stage_);
  if (data_group_ != nullptr && zero_stage_ > 0) {
    ranks_ = data_group_->getSize();
    rank_ = data_group_->getRank();
  }
  // Parameters replicated across the tensor group first, then the evenly
  // split ones, the vocabulary-split ones last: with the padded size equal
  // on every rank of the group (below), every parameter but the last group
  // then sits at the same offset in same-sized buffers on every TP rank, so
  // the data-parallel reduction sums each of their elements in the same
  // order there and the replicas (replicated parameters, copied key/value
  // heads) stay bit-identical. A vocabulary split unevenly over the group
  // gives TP ranks different amounts of it.
  auto order = [](const ShardedParameter& p) {
    switch (TensorParallelSplitOf(p.name)) {
      case TensorParallelSplit::kReplicated:
        return 0;
      case TensorParallelSplit::kVocabRows:
        return 2;
      default:
        return 1;
    }
  };
  std::stable_sort(parameters_.begin(), parameters_.end(),
                   [&](const ShardedParameter& a, const ShardedParameter& b) {
                     return order(a) < order(b);
                   });
  if (!parameters_.empty()) device_ = parameters_.front().tensor.device();
  for (const ShardedParameter& p : parameters_) {
    TORCH_CHECK(p.tensor.scalar_type() == torch::kFloat && p.tensor.is_contiguous() &&
                    (p.tensor.device().is_cpu() || p.tensor.device().is_cuda()) &&
                    p.tensor.device() == device_,
                "ShardedAdamW needs contiguous fp32 parameters, all on one CPU or CUDA device; ",
                p.name, " is not");
    offsets_.push_back(total_);
    total_ += p.tensor.numel();
  }
  const int64_t padded_total = std::max(total_, min_total_elements);
  shard_ = (padded_total + ranks_ - 1) / ranks_;
  // Every buffer lives beside the parameters; collectives stage what their
  // group's backend cannot take (p2p_placement.h).
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device_);
  exp_avg_ = torch::zeros({shard_}, f32);
  exp_avg_sq_ = torch::zeros({shard_}, f32);
  // The parameters (and, for stages 0 and 1, their gradients) become views
  // into flat buffers, so the collectives run in place on memory that lives
  // all run long (see ReduceScatterInPlace on why that matters on Gloo) and
  // nothing is copied to or from a staging buffer. Backward accumulates into
  // the gradient views in place (autograd adds into a defined .grad).
  torch::NoGradGuard no_grad;
  flat_parameters_ = torch::zeros({shard_ * ranks_}, f32);
  if (zero_stage_ != 2) flat_gradients_ = torch::zeros({shard_ * ranks_}, f32);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    torch::Tensor p = parameters_[i].tensor;
    torch::Tensor view = flat_parameters_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
    if (zero_stage_ != 2) {
      p.mutable_grad() = flat_gradients_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
    } else {
      p.mutable_grad() = torch::Tensor();  // the partitioner takes each as it is made
    }
  }
  // Replicated parameters in a segment of their own: their buckets, and so
  // the order of their sums, are the same on every rank of the tensor group
  // (see the partition above).
  std::vector<GradientSlot> slots;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const ShardedParameter& p = parameters_[i];
    const bool replicated = TensorParallelSplitOf(p.name) == TensorParallelSplit::kReplicated;
    slots.push_back({p.tensor, offsets_[i], replicated ? 0 : 1, p.completed_after_backward});
  }
  if (zero_stage_ == 0 && data_group_ != nullptr && data_group_->getSize() > 1) {
    averager_ = std::make_unique<GradientAverager>(std::move(slots), flat_gradients_, data_group_,
                                                   kGradientBucketBytes, /*average=*/false);
  } else if (zero_stage_ == 2) {
    grad_shard_ = torch::zeros({shard_}, f32);
    partitioner_ = std::make_unique<GradientPartitioner>(
        std::move(slots), shard_, grad_shard_, ranks_ > 1 ? data_group_ : nullptr);
  }
}

ShardedAdamW::~ShardedAdamW() = default;

void ShardedAdamW::BeginLastBackward() {
  if (!averager_) return;
  averager_->Arm();
  reduction_ = Reduction::kArmed;
}

double ShardedAdamW::FinishGradientReduction() {
  if (partitioner_) {
    if (reduction_ == Reduction::kDone) return 0;
    reduction_ = Reduction::kDone;
    return partitioner_->Finish();
  }
  if (reduction_ != Reduction::kArmed) return 0;
  const double seconds = averager_->Finish();
  reduction_ = Reduction::kDone;
  return seconds;
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t bytes = exp_avg_.nbytes() + exp_avg_sq_.nbytes();
  if (grad_shard_.defined()) bytes += grad_shard_.nbytes();
  if (scratch_.defined()) bytes += scratch_.nbytes();
  if (flat_gradients_.defined()) bytes += flat_gradients_.nbytes();
  if (partitioner_) bytes += partitioner_->peak_staging_bytes();
  return bytes;
}

void ShardedAdamW::CheckGradientViews() const {
  if (!flat_gradients_.defined()) return;  // stage 2: no views
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const torch::Tensor& g = parameters_[i].tensor.grad();
    TORCH_CHECK(g.defined() && g.data_ptr() == flat_gradients_.data_ptr<float>() + offsets_[i],
                "ShardedAdamW: the gradient of ", parameters_[i].name,
                " was replaced; gradients must stay views of the optimizer's buffer (do not set "
                "them to none)");
  }
}

ShardedStepResult ShardedAdamW::Step(double lr, double max_grad_norm) {
  torch::NoGradGuard no_grad;
  CheckGradientViews();
  torch::Tensor grad;  // [S]: the owned shard's gradient, summed over ranks
  const int replicas = data_group_ ? data_group_->getSize() : 1;
  if (zero_stage_ == 0) {
    FinishGradientReduction();  // if the caller did not
    if (reduction_ != Reduction::kDone) AllReduceInPlace(flat_gradients_, data_group_);
    reduction_ = Reduction::kNone;
    grad = flat_gradients_;
  } else if (zero_stage_ == 1) {
    ReduceScatterInPlace(flat_gradients_, data_group_, algorithm_, &scratch_);
    grad = flat_gradients_.narrow(0, shard_begin(), shard_);
  } else {
    FinishGradientReduction();  // if the caller did not
    reduction_ = Reduction::kNone;
    grad = grad_shard_;
  }
  grad.div_(replicas);
  // However the step ends, the gradients start from zero next time (the
  // shard's values are read before then).
  struct ZeroOnExit {
    ShardedAdamW* self;
    ~ZeroOnExit() {
      if (self->flat_gradients_.defined()) self->flat_gradients_.zero_();
      if (self->grad_shard_.defined()) self->grad_shard_.zero_();
    }
  } zero_on_exit{this};

  // The owned range cut into pieces of single parameters.
  struct Piece {
    size_t parameter;
    int64_t begin;  // in the flat space
    int64_t size;
  };
  std::vector<Piece> pieces;
  const int64_t lo = shard_begin(), hi = shard_begin() + shard_;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const int64_t b = std::max(lo, offsets_[i]);
    const int64_t e = std::min(hi, offsets_[i] + parameters_[i].tensor.numel());
    if (b < e) pieces.push_back({i, b, e - b});
  }

  // Global norm: [TP-sharded, replicated] squares of this shard, summed over
  // the data group, the sharded part over the tensor group, then stages.
  torch::Tensor sums = torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  for (const Piece& piece : pieces) {
    const ShardedParameter& p = parameters_[piece.parameter];
    if (!p.counted_in_norm) continue;
    const int slot = TensorParallelSplitOf(p.name) == TensorParallelSplit::kReplicated;
    sums[slot] += SquaresCountedOnce(grad.narrow(0, piece.begin - lo, piece.size),
                                     piece.begin - offsets_[piece.parameter], p.shared);
  }
  if (ranks_ > 1) AllReduceInPlace(sums, data_group_);  // shards of one space
  torch::Tensor sharded = sums.narrow(0, 0, 1).clone();
  AllReduceInPlace(sharded, tensor_group_);
  torch::Tensor total = sharded + sums.narrow(0, 1, 1);
  AllReduceInPlace(total, pipeline_group_);
  ShardedStepResult result;
  result.grad_norm = std::sqrt(total.item<double>());
  if (!std::isfinite(result.grad_norm)) return result;  // every rank agrees

  const double clip_coef = max_grad_norm > 0 && result.grad_norm > max_grad_norm
                               ? max_grad_norm / (result.grad_norm + 1e-6)
                               : 1.0;
  ++step_;
  AdamWGroup group;
  group.hyperparams.lr = lr;
  group.hyperparams.beta1 = config_.beta1;
  group.hyperparams.beta2 = config_.beta2;
  group.hyperparams.eps = config_.eps;
  for (const Piece& piece : pieces) {
    const ShardedParameter& p = parameters_[piece.parameter];
    AdamWTensor t;
    t.param = flat_parameters_.data_ptr<float>() + piece.begin;
    t.grad = grad.data_ptr<float>() + (piece.begin - lo);
    t.exp_avg = exp_avg_.data_ptr<float>() + (piece.begin - lo);
    t.exp_avg_sq = exp_avg_sq_.data_ptr<float>() + (piece.begin - lo);
    t.size = piece.size;
    t.weight_decay = p.decay ? config_.weight_decay : 0.0;
    t.step = step_;
    group.tensors.push_back(t);
  }
  AdamWUpdateOn(device_, absl::MakeConstSpan(&group, 1), clip_coef, update_path_);

  // Every rank gets every updated shard, in place: the parameters are
  // views of flat_parameters_.
  if (ranks_ > 1) AllGatherInPlace(flat_parameters_, data_group_);
  result.applied = true;
  return result;
}

void ShardedAdamW::GatherMoments(torch::Tensor* exp_avg, torch::Tensor* exp_avg_sq) const {
  torch::NoGradGuard no_grad;
  for (auto [out, mine] : {std::make_pair(exp_avg, &exp_avg_), std::make_pair(exp_avg_sq, &exp_avg_sq_)}) {
    torch::Tensor flat = torch::zeros({shard_ * ranks_}, mine->options());
    flat.narrow(0, shard_begin(), shard_).copy_(*mine);
    if (ranks_ > 1) AllGatherInPlace(flat, data_group_);
    *out = flat.narrow(0, 0, total_);
  }
}

void ShardedAdamW::LoadMoments(const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq,
                               int64_t step) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(exp_avg.numel() == total_ && exp_avg_sq.numel() == total_,
              "LoadMoments: expected ", total_, " elements, got ", exp_avg.numel(), " and ",
              exp_avg_sq.numel());
  const int64_t size = std::min(shard_, total_ - shard_begin());
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
  if (size > 0) {
    exp_avg_.narrow(0, 0, size).copy_(exp_avg.reshape({-1}).narrow(0, shard_begin(), size));
    exp_avg_sq_.narrow(0, 0, size).copy_(exp_avg_sq.reshape({-1}).narrow(0, shard_begin(), size));
  }
  step_ = step;
}

}  // namespace loom::engine
