// Tensor (intra-layer) model parallelism for the GPT of gpt.h (Shoeybi et
// al. 2019, "Megatron-LM", sec. 3): the primitives, and which way each of
// the model's parameters is split across a tensor-parallel (TP) group.
//
// The residual stream is replicated on every rank of a TP group. Each
// sublayer enters the group through CopyToTensorParallelRegion (Megatron's
// f: identity forward, all-reduce of the input gradient backward) into a
// column-parallel product (QKV, MLP up: each rank holds a slice of the
// output features, the heads split across ranks), and leaves through a
// row-parallel product (attention out, MLP down: each rank holds the input
// features its column slice produced) whose partial sums
// ReduceFromTensorParallelRegion adds up (Megatron's g: all-reduce forward,
// identity backward). So one all-reduce per sublayer forward and one
// backward. The embedding and the LM head are split by vocabulary rows;
// the loss takes the global maximum and sum of exponentials across the
// group, and the logits are never gathered.
//
// A null group means a TP degree of 1: every function is then the
// single-rank computation.
//
// Collectives follow c10d's contract: every rank of the group calls the same
// functions on tensors of the same shapes in the same order. Backward
// passes run the matching collectives in reverse order on every rank, since
// every rank runs the same graph.
#ifndef LOOM_WORKER_ENGINE_PARALLEL_TENSOR_PARALLEL_H_
#define LOOM_WORKER_ENGINE_PARALLEL_TENSOR_PARALLEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "worker/engine/config.h"

namespace loom::engine {

// All-reduces `t` in place over `group` (nothing when group is null).
// Tensors of a reduced-precision type are summed in fp32 and written back;
// CUDA tensors on a Gloo group are staged through the host. Throws
// c10::Error or std::exception on a collective failure or timeout.
void AllReduceInPlace(torch::Tensor& t, c10d::ProcessGroup* group,
                      c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM);
// Overwrites `t` on every rank of `group` with rank `root`'s (group ranks);
// staged as AllReduceInPlace is (no widening: a broadcast copies bits).
// Nothing when group is null or has one rank.
void BroadcastInPlace(torch::Tensor& t, c10d::ProcessGroup* group, int root);

// Megatron's f: returns x; in backward, all-reduces the gradient.
torch::Tensor CopyToTensorParallelRegion(const torch::Tensor& x, c10d::ProcessGroup* group);
// Megatron's g: returns the sum of x over the group; backward passes the
// gradient through unchanged.
torch::Tensor ReduceFromTensorParallelRegion(const torch::Tensor& x, c10d::ProcessGroup* group);

// The vocabulary rows [begin, end) that TP rank `tp_rank` of `tp_size` holds
// of a vocabulary of `vocab_size`: begin = floor(rank * V / tp), so shards
// differ by at most one row and none is empty when V >= tp.
struct VocabRange {
  int64_t begin = 0;
  int64_t end = 0;
};
VocabRange VocabRangeOf(int64_t vocab_size, int tp_rank, int tp_size);

// Token embedding over a vocabulary-split table: weight_shard [end-begin, d]
// holds rows [range.begin, range.end). idx [...] int64 in [0, V). Each rank
// looks up the ids it holds (zeros for the others) and the group sums:
// returns [..., d], replicated.
torch::Tensor VocabParallelEmbedding(const torch::Tensor& idx, const torch::Tensor& weight_shard,
                                     VocabRange range, c10d::ProcessGroup* group);

// Mean cross entropy (nats per token) of the tied LM head's logits
// hidden [N, d] x weight_shard^T against targets [N] in [0, V), with the
// vocabulary split as in VocabParallelEmbedding. Each rank computes its
// [N, end-begin] slice of the logits; the row maximum (all-reduce MAX,
// outside autograd: the loss does not depend on it), the sum of exponentials
// and each target's logit (all-reduce SUM) are combined across the group.
// `hidden` must be replicated on the group; its gradient is summed over the
// group in backward (it enters through CopyToTensorParallelRegion).
// The logits' product runs in matmul_dtype (fp32 accumulation; bf16 or fp16
// copies of the fp32 hidden and weight, as autocast would make) and is taken
// to fp32 at once: the softmax and the loss are fp32 whatever it is.
torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& hidden,
                                        const torch::Tensor& weight_shard,
                                        const torch::Tensor& targets, VocabRange range,
                                        c10d::ProcessGroup* group,
                                        c10::ScalarType matmul_dtype = torch::kFloat);

// How a parameter of Gpt (gpt.h), named as in its named_parameters(), is
// split across a TP group.
enum class TensorParallelSplit {
  kReplicated,  // whole on every rank: LayerNorms, wpe, row-parallel biases
  kVocabRows,   // wte.weight and an untied lm_head.weight [V, d]: rows
                // VocabRangeOf(V, rank, tp)
  kQkvRows,     // attn.c_attn [(h + 2 h_kv) hd, d] and its bias: of q, the
                // rows of this rank's share of the heads; of k and v, the
                // rows of the key/value heads those queries use (a share of
                // them, or one head on tp / h_kv ranks when h_kv < tp:
                // KeyValueCopies)
  kRows,        // mlp.c_fc (and SwiGLU's c_up) [f, d] and bias: dim 0 in tp chunks
  kColumns,     // attn.c_proj and mlp.c_proj weights: dim 1 in tp chunks
};
TensorParallelSplit TensorParallelSplitOf(const std::string& name);

// INVALID_ARGUMENT naming the field unless `model` can be split over `tp`
// ranks: n_head % tp == 0, the MLP width % tp == 0, vocab_size >= tp, and
// (for now) dropout 0 when tp > 1 (dropout masks of the replicated residual
// stream would have to agree across the group; not executed yet);
// UNIMPLEMENTED when neither of tp and n_kv_head divides the other (a
// rank's query heads would use parts of two key/value heads).
absl::Status ValidateTensorParallel(const GptConfig& model, int tp);

// Key/value heads under a TP degree that ValidateTensorParallel accepts.
// With n_kv_head >= tp each rank holds n_kv_head / tp of them (copies 1).
// With fewer heads than ranks (multi-query and grouped-query attention
// under a wide tensor group, as in Megatron-LM), each rank holds the one
// head its query heads use, so each head is held by tp / n_kv_head ranks,
// consecutive in the group: KeyValueCopies. Their gradients are summed over
// those ranks inside backward (SumKeyValueReplicaGradients), so the copies
// take the same optimizer steps and stay bit-identical.
int64_t LocalKeyValueHeads(const GptConfig& model, int tp);
int KeyValueCopies(const GptConfig& model, int tp);

// The elements [begin, end) of a TP rank's shard of parameter `name`
// (flattened) that `copies` ranks of the group hold alike: the key/value
// rows of c_attn when KeyValueCopies > 1; empty (copies 1) otherwise. The
// gradient norm counts them once (1 / copies on each holder) and sharded
// checkpoints merge them from their first holder.
struct ReplicatedSpan {
  int64_t begin = 0;
  int64_t end = 0;
  int copies = 1;
};
ReplicatedSpan ReplicatedSpanOf(const std::string& name, const GptConfig& model, int tp);

// Sum of squares (double) of `grad`, a piece of a parameter's shard starting
// at its flattened element `first_element`, with the elements in `span`
// counted 1 / span.copies each, so that the holders' sums add up to one.
torch::Tensor SquaresCountedOnce(const torch::Tensor& grad, int64_t first_element,
                                 ReplicatedSpan span);

// For c_attn's weight or bias (`name` says which) on TP rank `tp_rank`:
// returns `parameter` unchanged; in backward, sums the gradient rows of the
// key/value heads it holds over the ranks that hold the same heads (an
// all-reduce over `group` with one slot per head group), so every copy gets
// the gradient of all the query heads that use it. Identity in both
// directions when KeyValueCopies is 1. Collective over `group` in backward.
torch::Tensor SumKeyValueReplicaGradients(const torch::Tensor& parameter, const std::string& name,
                                          const GptConfig& model, int tp_rank,
                                          c10d::ProcessGroup* group);

// TP rank `tp_rank`'s shard of the full parameter `full` named `name`
// (a contiguous copy; `full` itself when replicated).
torch::Tensor ShardForTensorParallel(const std::string& name, const torch::Tensor& full,
                                     const GptConfig& model, int tp_rank, int tp_size);
// The shape of ShardForTensorParallel's result, without a tensor.
std::vector<int64_t> TensorParallelShardShape(const std::string& name,
                                              std::vector<int64_t> full_shape,
                                              const GptConfig& model, int tp_rank, int tp_size);
// The full parameter from every rank's shard (shards[r] from rank r); the
// inverse of ShardForTensorParallel. For a replicated parameter, shards[0];
// key/value rows held by several ranks come from the first of them.
torch::Tensor MergeTensorParallelShards(const std::string& name,
                                        const std::vector<torch::Tensor>& shards,
                                        const GptConfig& model);

// Global L2 norm of the gradients of a model spread over tensor-parallel
// ranks and pipeline stages, sqrt(sum over every full parameter of
// ||grad||^2), the same on every rank: sharded parameters' squares are summed
// over `tensor_group` (key/value rows held by several ranks counted once:
// ReplicatedSpanOf `config`), replicated ones count once, and stages' sums are
// added over `pipeline_group`. `skip` names parameters that another stage
// also holds and counts (the last stage's copy of the tied wte). If
// max_norm > 0 and the norm exceeds it, scales every gradient by
// max_norm / (norm + 1e-6), as ClipGradNorm (optimizer.h) does for one rank.
// Returns the norm before clipping. Collective: every rank of both groups.
double ClipGradNormAcrossGroups(const torch::nn::Module& model, c10d::ProcessGroup* tensor_group,
                                c10d::ProcessGroup* pipeline_group, double max_norm,
                                const GptConfig& config,
                                const std::vector<std::string>& skip = {});

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_TENSOR_PARALLEL_H_
