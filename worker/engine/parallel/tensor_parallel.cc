#include "worker/engine/parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <torch/autograd.h>
#include <torch/nn/functional/embedding.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through the autograd context as an integer: the
// context's saved_data holds IValues, and c10d's ProcessGroup is no
// registered TorchScript class in LibTorch 1.13. Contract: the group
// outlives every graph built with it (the model that uses it owns it).
int64_t GroupHandle(c10d::ProcessGroup* group) { return reinterpret_cast<int64_t>(group); }
c10d::ProcessGroup* GroupOfHandle(int64_t handle) {
  return reinterpret_cast<c10d::ProcessGroup*>(handle);
}

class CopyToRegion : public torch::autograd::Function<CopyToRegion> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x;  // autograd makes the returned input a fresh view of it
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    torch::Tensor grad = grads[0].clone();
    AllReduceInPlace(grad, GroupOfHandle(ctx->saved_data["group"].toInt()));
    return {grad, torch::Tensor()};
  }
};

class ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
 public:
  static torch::Tensor forward(AutogradContext* /*ctx*/, const torch::Tensor& x, int64_t group) {
    torch::Tensor sum = x.contiguous().clone();
    AllReduceInPlace(sum, GroupOfHandle(group));
    return sum;
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

// Widths of the q, k and v parts of c_attn's rows: n_head, n_kv_head and
// n_kv_head heads.
std::vector<int64_t> QkvWidths(const GptConfig& m) {
  const int64_t hd = m.d_model / m.n_head;
  const int64_t kv = KvHeads(m) * hd;
  return {m.d_model, kv, kv};
}

// Rows of the q, k and v parts of c_attn that TP rank r holds: its heads of
// each (with grouped-query attention its query heads use exactly its
// key/value heads, since n_kv_head divides by the TP degree).
std::vector<std::pair<int64_t, int64_t>> QkvRows(const GptConfig& m, int tp_rank, int tp_size) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  int64_t begin = 0;
  for (int64_t width : QkvWidths(m)) {
    const int64_t per_rank = width / tp_size;
    rows.emplace_back(begin + tp_rank * per_rank, per_rank);
    begin += width;
  }
  return rows;
}

}  // namespace

void AllReduceInPlace(torch::Tensor& t, c10d::ProcessGroup* group,
                      c10d::ReduceOp::RedOpType op) {
  if (group == nullptr || group->getSize() == 1) return;
  torch::NoGradGuard no_grad;
  const bool nccl = group->getBackendName() == "nccl";
  torch::Tensor staged = t;
  if (!nccl && !staged.device().is_cpu()) staged = staged.to(torch::kCPU);
  const auto type = staged.scalar_type();
  if (type == torch::kBFloat16 || type == torch::kHalf) staged = staged.to(torch::kFloat);
  if (!staged.is_contiguous()) staged = staged.contiguous();
  std::vector<torch::Tensor> tensors = {staged};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group->allreduce(tensors, options)->wait();
  if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
}

torch::Tensor CopyToTensorParallelRegion(const torch::Tensor& x, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return x;
  return CopyToRegion::apply(x, GroupHandle(group));
}

torch::Tensor ReduceFromTensorParallelRegion(const torch::Tensor& x, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return x;
  return ReduceFromRegion::apply(x, GroupHandle(group));
}

VocabRange VocabRangeOf(int64_t vocab_size, int tp_rank, int tp_size) {
  return {vocab_size * tp_rank / tp_size, vocab_size * (tp_rank + 1) / tp_size};
}

torch::Tensor VocabParallelEmbedding(const torch::Tensor& idx, const torch::Tensor& weight_shard,
                                     VocabRange range, c10d::ProcessGroup* group) {
  namespace F = torch::nn::functional;
  if (group == nullptr || group->getSize() == 1) return F::embedding(idx, weight_shard);
  const torch::Tensor outside = (idx < range.begin).logical_or(idx >= range.end);
  const torch::Tensor local = (idx - range.begin).masked_fill(outside, 0);
  torch::Tensor rows = F::embedding(local, weight_shard);
  rows = rows.masked_fill(outside.unsqueeze(-1), 0.0);
  return ReduceFromTensorParallelRegion(rows, group);
}

torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& hidden,
                                        const torch::Tensor& weight_shard,
                                        const torch::Tensor& targets, VocabRange range,
                                        c10d::ProcessGroup* group) {
  TORCH_CHECK(hidden.dim() == 2 && targets.dim() == 1 && hidden.size(0) == targets.size(0),
              "VocabParallelCrossEntropy expects hidden [N, d] and targets [N], got ",
              hidden.sizes(), " and ", targets.sizes());
  const torch::Tensor logits =
      torch::matmul(CopyToTensorParallelRegion(hidden, group), weight_shard.t());  // [N, Vr]
  torch::Tensor row_max;
  {
    torch::NoGradGuard no_grad;
    row_max = std::get<0>(logits.max(/*dim=*/1));
    AllReduceInPlace(row_max, group, c10d::ReduceOp::MAX);
  }
  const torch::Tensor shifted = logits - row_max.unsqueeze(1);
  const torch::Tensor sum_exp =
      ReduceFromTensorParallelRegion(shifted.exp().sum(/*dim=*/1), group);
  const torch::Tensor outside = (targets < range.begin).logical_or(targets >= range.end);
  const torch::Tensor local = (targets - range.begin).masked_fill(outside, 0);
  const torch::Tensor picked =
      shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0);
  const torch::Tensor target_logit = ReduceFromTensorParallelRegion(picked, group);
  return (sum_exp.log() - target_logit).mean();
}

TensorParallelSplit TensorParallelSplitOf(const std::string& name) {
  if (name == "wte.weight") return TensorParallelSplit::kVocabRows;
  if (absl::EndsWith(name, "attn.c_attn.weight") || absl::EndsWith(name, "attn.c_attn.bias")) {
    return TensorParallelSplit::kQkvRows;
  }
  if (name == "lm_head.weight") return TensorParallelSplit::kVocabRows;
  if (absl::EndsWith(name, "mlp.c_fc.weight") || absl::EndsWith(name, "mlp.c_fc.bias") ||
      absl::EndsWith(name, "mlp.c_up.weight") || absl::EndsWith(name, "mlp.c_up.bias")) {
    return TensorParallelSplit::kRows;
  }
  if (absl::EndsWith(name, "attn.c_proj.weight") || absl::EndsWith(name, "mlp.c_proj.weight")) {
    return TensorParallelSplit::kColumns;
  }
  return TensorParallelSplit::kReplicated;
}

absl::Status ValidateTensorParallel(const GptConfig& model, int tp) {
  if (tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.tensor must be >= 1, got ", tp));
  }
  if (tp == 1) return absl::OkStatus();
  if (model.n_head % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.tensor (", tp, ") must divide model.n_head (", model.n_head,
                     "): attention heads are split across the tensor-parallel group"));
  }
  if (KvHeads(model) % tp != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "parallelism.tensor (", tp, ") must divide model.n_kv_head (", KvHeads(model),
        "): key/value heads are split across the tensor-parallel group (replicating them "
        "when there are fewer than tensor-parallel ranks is not executed yet)"));
  }
  if (FfnHidden(model) % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.tensor (", tp, ") must divide the MLP's hidden width (", FfnHidden(model),
        "): its columns are split across the tensor-parallel group"));
  }
  if (model.vocab_size < tp) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.tensor (", tp,
                                                   ") exceeds model.vocab_size (",
                                                   model.vocab_size, ")"));
  }
  if (model.dropout != 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.dropout must be 0 with parallelism.tensor > 1 (got ", model.dropout,
        "): dropout under tensor parallelism is not executed yet"));
  }
  return absl::OkStatus();
}

torch::Tensor ShardForTensorParallel(const std::string& name, const torch::Tensor& full,
                                     const GptConfig& model, int tp_rank, int tp_size) {
  if (tp_size == 1) return full;
  switch (TensorParallelSplitOf(name)) {
    case TensorParallelSplit::kReplicated:
      return full;
    case TensorParallelSplit::kVocabRows: {
      const VocabRange r = VocabRangeOf(full.size(0), tp_rank, tp_size);
      return full.narrow(0, r.begin, r.end - r.begin).contiguous();
    }
    case TensorParallelSplit::kQkvRows: {
      std::vector<torch::Tensor> parts;
      for (const auto& [begin, rows] : QkvRows(model, tp_rank, tp_size)) {
        parts.push_back(full.narrow(0, begin, rows));
      }
      return torch::cat(parts, 0);
    }
    case TensorParallelSplit::kRows: {
      const int64_t rows = full.size(0) / tp_size;
      return full.narrow(0, tp_rank * rows, rows).contiguous();
    }
    case TensorParallelSplit::kColumns: {
      const int64_t columns = full.size(1) / tp_size;
      return full.narrow(1, tp_rank * columns, columns).contiguous();
    }
  }
  return full;
}

std::vector<int64_t> TensorParallelShardShape(const std::string& name,
                                              std::vector<int64_t> shape, int tp_rank,
                                              int tp_size) {
  if (tp_size == 1) return shape;
  switch (TensorParallelSplitOf(name)) {
    case TensorParallelSplit::kReplicated:
      break;
    case TensorParallelSplit::kVocabRows: {
      const VocabRange r = VocabRangeOf(shape[0], tp_rank, tp_size);
      shape[0] = r.end - r.begin;
      break;
    }
    case TensorParallelSplit::kQkvRows:
    case TensorParallelSplit::kRows:
      shape[0] /= tp_size;
      break;
    case TensorParallelSplit::kColumns:
      shape[1] /= tp_size;
      break;
  }
  return shape;
}

torch::Tensor MergeTensorParallelShards(const std::string& name,
                                        const std::vector<torch::Tensor>& shards,
                                        const GptConfig& model) {
  TORCH_CHECK(!shards.empty(), "MergeTensorParallelShards: no shards for ", name);
  if (shards.size() == 1) return shards[0];
  switch (TensorParallelSplitOf(name)) {
    case TensorParallelSplit::kReplicated:
      return shards[0];
    case TensorParallelSplit::kVocabRows:
    case TensorParallelSplit::kRows:
      return torch::cat(shards, 0);
    case TensorParallelSplit::kColumns:
      return torch::cat(shards, 1);
    case TensorParallelSplit::kQkvRows: {
      // Each shard is [q_r; k_r; v_r]; the full tensor is [q; k; v].
      std::vector<int64_t> widths = QkvWidths(model);
      for (int64_t& w : widths) w /= static_cast<int64_t>(shards.size());
      std::vector<torch::Tensor> parts[3];
      for (const torch::Tensor& s : shards) {
        const std::vector<torch::Tensor> qkv = s.split_with_sizes(widths, 0);
        for (int part = 0; part < 3; ++part) parts[part].push_back(qkv[part]);
      }
      return torch::cat({torch::cat(parts[0], 0), torch::cat(parts[1], 0),
                         torch::cat(parts[2], 0)},
                        0);
    }
  }
  return shards[0];
}

double ClipGradNormAcrossGroups(const torch::nn::Module& model, c10d::ProcessGroup* tensor_group,
                                c10d::ProcessGroup* pipeline_group, double max_norm,
                                const std::vector<std::string>& skip) {
  torch::NoGradGuard no_grad;
  // [sharded, replicated] sums of squares, in double (as ClipGradNorm).
  torch::Tensor sums = torch::zeros({2}, torch::kDouble);
  std::vector<torch::Tensor> grads;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& g = item.value().grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (std::find(skip.begin(), skip.end(), item.key()) != skip.end()) continue;
    const int slot = TensorParallelSplitOf(item.key()) == TensorParallelSplit::kReplicated;
    sums[slot] += g.to(torch::kDouble).pow(2).sum();
  }
  torch::Tensor sharded = sums.narrow(0, 0, 1).clone();
  AllReduceInPlace(sharded, tensor_group);
  torch::Tensor stage = sharded + sums.narrow(0, 1, 1);
  AllReduceInPlace(stage, pipeline_group);
  const double norm = std::sqrt(stage.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double coeff = max_norm / (norm + 1e-6);
    for (torch::Tensor& g : grads) g.mul_(coeff);
  }
  return norm;
}

}  // namespace loom::engine
