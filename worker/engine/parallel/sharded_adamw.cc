#include "worker/engine/parallel/sharded_adamw.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "worker/engine/fused_adamw.h"
#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {

ShardedAdamW::ShardedAdamW(std::vector<ShardedParameter> parameters,
                           const OptimizerConfig& config, int zero_stage,
                           c10d::ProcessGroup* data_group, c10d::ProcessGroup* tensor_group,
                           c10d::ProcessGroup* pipeline_group, ReduceScatterAlgorithm algorithm)
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
  for (const ShardedParameter& p : parameters_) {
    TORCH_CHECK(p.tensor.scalar_type() == torch::kFloat && p.tensor.is_contiguous() &&
                    p.tensor.device().is_cpu(),
                "ShardedAdamW needs contiguous fp32 CPU parameters; ", p.name, " is not");
    offsets_.push_back(total_);
    total_ += p.tensor.numel();
  }
  shard_ = (total_ + ranks_ - 1) / ranks_;
  exp_avg_ = torch::zeros({shard_});
  exp_avg_sq_ = torch::zeros({shard_});
  if (zero_stage_ == 2) grad_shard_ = torch::zeros({shard_});
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t bytes = exp_avg_.nbytes() + exp_avg_sq_.nbytes();
  if (grad_shard_.defined()) bytes += grad_shard_.nbytes();
  return bytes;
}

torch::Tensor ShardedAdamW::FlatGradients() const {
  torch::Tensor flat = torch::zeros({shard_ * ranks_});
  for (size_t i = 0; i < parameters_.size(); ++i) {
    torch::Tensor g = parameters_[i].tensor.grad();
    if (!g.defined()) continue;
    if (g.is_sparse()) g = g.to_dense();
    flat.narrow(0, offsets_[i], g.numel()).copy_(g.reshape({-1}));
  }
  return flat;
}

void ShardedAdamW::ReduceMicroBatch() {
  if (zero_stage_ != 2) return;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = FlatGradients();
  ReduceScatterInPlace(flat, data_group_, algorithm_);
  grad_shard_.add_(flat.narrow(0, shard_begin(), shard_));
  for (ShardedParameter& p : parameters_) p.tensor.mutable_grad() = torch::Tensor();
  ++micro_batches_;
}

ShardedStepResult ShardedAdamW::Step(double lr, double max_grad_norm) {
  torch::NoGradGuard no_grad;
  torch::Tensor grad;  // [S]: the owned shard's gradient, summed over ranks
  const int replicas = data_group_ ? data_group_->getSize() : 1;
  if (zero_stage_ == 0) {
    grad = FlatGradients();
    AllReduceInPlace(grad, data_group_);
  } else if (zero_stage_ == 1) {
    torch::Tensor flat = FlatGradients();
    ReduceScatterInPlace(flat, data_group_, algorithm_);
    grad = flat.narrow(0, shard_begin(), shard_).clone();
  } else {
    const bool pending = std::any_of(parameters_.begin(), parameters_.end(),
                                     [](const ShardedParameter& p) {
                                       return p.tensor.grad().defined();
                                     });
    if (pending || micro_batches_ == 0) ReduceMicroBatch();
    grad = grad_shard_.clone();
    grad_shard_.zero_();
    micro_batches_ = 0;
  }
  for (ShardedParameter& p : parameters_) p.tensor.mutable_grad() = torch::Tensor();
  grad.div_(replicas);

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
  torch::Tensor sums = torch::zeros({2}, torch::kDouble);
  for (const Piece& piece : pieces) {
    const ShardedParameter& p = parameters_[piece.parameter];
    if (!p.counted_in_norm) continue;
    const int slot = TensorParallelSplitOf(p.name) == TensorParallelSplit::kReplicated;
    sums[slot] += grad.narrow(0, piece.begin - lo, piece.size).to(torch::kDouble).pow(2).sum();
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
    t.param = p.tensor.data_ptr<float>() + (piece.begin - offsets_[piece.parameter]);
    t.grad = grad.data_ptr<float>() + (piece.begin - lo);
    t.exp_avg = exp_avg_.data_ptr<float>() + (piece.begin - lo);
    t.exp_avg_sq = exp_avg_sq_.data_ptr<float>() + (piece.begin - lo);
    t.size = piece.size;
    t.weight_decay = p.decay ? config_.weight_decay : 0.0;
    t.step = step_;
    group.tensors.push_back(t);
  }
  AdamWUpdate(absl::MakeConstSpan(&group, 1), clip_coef);

  // Every rank gets every updated shard.
  if (ranks_ > 1) {
    torch::Tensor flat = torch::zeros({shard_ * ranks_});
    for (const Piece& piece : pieces) {
      const ShardedParameter& p = parameters_[piece.parameter];
      flat.narrow(0, piece.begin, piece.size)
          .copy_(p.tensor.reshape({-1}).narrow(0, piece.begin - offsets_[piece.parameter],
                                                piece.size));
    }
    AllGatherInPlace(flat, data_group_);
    for (size_t i = 0; i < parameters_.size(); ++i) {
      torch::Tensor t = parameters_[i].tensor;
      t.view({-1}).copy_(flat.narrow(0, offsets_[i], t.numel()));
    }
  }
  result.applied = true;
  return result;
}

void ShardedAdamW::GatherMoments(torch::Tensor* exp_avg, torch::Tensor* exp_avg_sq) const {
  torch::NoGradGuard no_grad;
  for (auto [out, mine] : {std::make_pair(exp_avg, &exp_avg_), std::make_pair(exp_avg_sq, &exp_avg_sq_)}) {
    torch::Tensor flat = torch::zeros({shard_ * ranks_});
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
