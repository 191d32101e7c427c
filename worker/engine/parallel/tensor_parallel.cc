#include "worker/engine/parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <torch/autograd.h>
#include <torch/nn/functional/embedding.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/parallel/p2p_placement.h"

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

// The rows of the q, k and v parts of c_attn that TP rank r holds, as
// (first row in the full tensor, count): its share of the query heads, and
// of the key and value heads the ones those queries use (their share, or
// the one head of its slot when the heads are copied: KeyValueCopies).
std::vector<std::pair<int64_t, int64_t>> QkvRows(const GptConfig& m, int tp_rank, int tp_size) {
  const int64_t hd = m.d_model / m.n_head;
  const int64_t kv_width = KvHeads(m) * hd;
  const int64_t q_rows = m.d_model / tp_size;
  const int64_t kv_rows = LocalKeyValueHeads(m, tp_size) * hd;
  const int64_t slot = tp_rank / KeyValueCopies(m, tp_size);
  return {{tp_rank * q_rows, q_rows},
          {m.d_model + slot * kv_rows, kv_rows},
          {m.d_model + kv_width + slot * kv_rows, kv_rows}};
}

// Widths of the q, k and v parts of one rank's c_attn shard.
std::vector<int64_t> LocalQkvWidths(const GptConfig& m, int tp_size) {
  std::vector<int64_t> widths;
  for (const auto& part : QkvRows(m, 0, tp_size)) widths.push_back(part.second);
  return widths;
}

class KeyValueReplicaSum : public torch::autograd::Function<KeyValueReplicaSum> {
 public:
  // rows: [first key row, row count) of the shard; slots: head groups in
  // the TP group; slot: this rank's.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& parameter,
                               int64_t group, int64_t first_row, int64_t rows, int64_t slots,
                               int64_t slot) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["first_row"] = first_row;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["slots"] = slots;
    ctx->saved_data["slot"] = slot;
    return parameter;  // a fresh view, as in CopyToRegion
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    torch::NoGradGuard no_grad;
    const int64_t first_row = ctx->saved_data["first_row"].toInt();
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const int64_t slot = ctx->saved_data["slot"].toInt();
    torch::Tensor grad = grads[0].contiguous().clone();
    torch::Tensor mine = grad.narrow(0, first_row, rows);
    // One slot per head group: each rank adds its rows into its group's
    // slot, so after the sum every slot holds its group's total.
    torch::Tensor slots =
        torch::zeros({ctx->saved_data["slots"].toInt(), mine.numel()}, grad.options());
    slots[slot].copy_(mine.reshape({-1}));
    AllReduceInPlace(slots, GroupOfHandle(ctx->saved_data["group"].toInt()));
    mine.copy_(slots[slot].view(mine.sizes()));
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

void AllReduceInPlace(torch::Tensor& t, c10d::ProcessGroup* group,
                      c10d::ReduceOp::RedOpType op) {
  if (group == nullptr || group->getSize() == 1) return;
  torch::NoGradGuard no_grad;
  // Gloo reduces host memory, NCCL device memory: a host tensor (a step's
  // loss sum, a flag) goes to the current CUDA device for NCCL.
  std::vector<torch::Tensor> tensors = {
      StageForCollective(t, P2pPlacementOf(*group), /*widen=*/true)};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group->allreduce(tensors, options)->wait();
  FinishStaged(t, tensors[0]);
}

void BroadcastInPlace(torch::Tensor& t, c10d::ProcessGroup* group, int root) {
  if (group == nullptr || group->getSize() == 1) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tensors = {StageForCollective(t, P2pPlacementOf(*group))};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  group->broadcast(tensors, options)->wait();
  FinishStaged(t, tensors[0]);
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
                                        c10d::ProcessGroup* group, c10::ScalarType matmul_dtype) {
  TORCH_CHECK(hidden.dim() == 2 && targets.dim() == 1 && hidden.size(0) == targets.size(0),
              "VocabParallelCrossEntropy expects hidden [N, d] and targets [N], got ",
              hidden.sizes(), " and ", targets.sizes());
  const torch::Tensor h = CopyToTensorParallelRegion(hidden, group);
  // fp32: the product as it always was; otherwise on lower-precision copies,
  // back to fp32 before anything else reads it.
  const torch::Tensor logits =
      matmul_dtype == hidden.scalar_type()
          ? torch::matmul(h, weight_shard.t())
          : torch::matmul(h.to(matmul_dtype), weight_shard.to(matmul_dtype).t())
                .to(torch::kFloat);  // [N, Vr]
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
  if (KvHeads(model) % tp != 0 && tp % KvHeads(model) != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "parallelism.tensor (", tp, ") and model.n_kv_head (", KvHeads(model),
        ") must divide one another: key/value heads are split across the tensor-parallel "
        "group, or each copied to tensor / n_kv_head ranks when there are fewer heads than "
        "ranks; otherwise a rank's query heads would use parts of two key/value heads"));
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

int64_t LocalKeyValueHeads(const GptConfig& model, int tp) {
  return KvHeads(model) >= tp ? KvHeads(model) / tp : 1;
}

int KeyValueCopies(const GptConfig& model, int tp) {
  return KvHeads(model) >= tp ? 1 : static_cast<int>(tp / KvHeads(model));
}

ReplicatedSpan ReplicatedSpanOf(const std::string& name, const GptConfig& model, int tp) {
  const int copies = KeyValueCopies(model, tp);
  if (copies == 1 || TensorParallelSplitOf(name) != TensorParallelSplit::kQkvRows) return {};
  const std::vector<int64_t> widths = LocalQkvWidths(model, tp);
  const int64_t columns = absl::EndsWith(name, ".weight") ? model.d_model : 1;
  return {widths[0] * columns, (widths[0] + widths[1] + widths[2]) * columns, copies};
}

torch::Tensor SumKeyValueReplicaGradients(const torch::Tensor& parameter, const std::string& name,
                                          const GptConfig& model, int tp_rank,
                                          c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return parameter;
  const int tp = group->getSize();
  const int copies = KeyValueCopies(model, tp);
  if (copies == 1) return parameter;
  TORCH_CHECK(TensorParallelSplitOf(name) == TensorParallelSplit::kQkvRows,
              "SumKeyValueReplicaGradients: ", name, " holds no key/value rows");
  const std::vector<int64_t> widths = LocalQkvWidths(model, tp);
  return KeyValueReplicaSum::apply(parameter, GroupHandle(group), widths[0],
                                   widths[1] + widths[2], tp / copies, tp_rank / copies);
}

torch::Tensor SquaresCountedOnce(const torch::Tensor& grad, int64_t first_element,
                                 ReplicatedSpan span) {
  const torch::Tensor flat = grad.reshape({-1}).to(torch::kDouble);
  const torch::Tensor all = flat.pow(2).sum();
  const int64_t b = std::max(span.begin, first_element);
  const int64_t e = std::min(span.end, first_element + flat.numel());
  if (span.copies == 1 || b >= e) return all;
  const torch::Tensor shared = flat.narrow(0, b - first_element, e - b).pow(2).sum();
  return all - shared * (1.0 - 1.0 / span.copies);
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
                                              std::vector<int64_t> shape,
                                              const GptConfig& model, int tp_rank,
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
    case TensorParallelSplit::kQkvRows: {
      const std::vector<int64_t> widths = LocalQkvWidths(model, tp_size);
      shape[0] = widths[0] + widths[1] + widths[2];
      break;
    }
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
      // Each shard is [q_r; k_r; v_r]; the full tensor is [q; k; v]. Key and
      // value heads held by several ranks come from the first of them.
      const int tp = static_cast<int>(shards.size());
      const std::vector<int64_t> widths = LocalQkvWidths(model, tp);
      const int copies = KeyValueCopies(model, tp);
      std::vector<torch::Tensor> parts[3];
      for (int r = 0; r < tp; ++r) {
        const std::vector<torch::Tensor> qkv = shards[r].split_with_sizes(widths, 0);
        parts[0].push_back(qkv[0]);
        if (r % copies != 0) continue;
        parts[1].push_back(qkv[1]);
        parts[2].push_back(qkv[2]);
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
                                const GptConfig& config, const std::vector<std::string>& skip) {
  const int tp = tensor_group == nullptr ? 1 : tensor_group->getSize();
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
    sums[slot] += SquaresCountedOnce(g, 0, ReplicatedSpanOf(item.key(), config, tp));
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
