// The Gpt of gpt.h (GPT-2 or a Llama-family member) as one rank of a
// tensor- and pipeline-parallel layout holds it: the blocks of its pipeline
// stage, each split across its tensor-parallel group (tensor_parallel.h),
// plus the embeddings on the first stage and the final norm with the LM
// head (tied or not) on the last.
//
// Parameter names are the full model's (wte.weight, h.<global index>.attn.
// c_attn.weight, ...), so a rank's parameters map one to one onto Gpt's
// through TensorParallelSplitOf; shapes are the shards'.
//
// Initialisation equals Gpt's for the same seed: the constructor replays
// Gpt's draws from the global LibTorch generator (its modules' default
// initialisation, then its GPT-2 initialisation), one full-size tensor at a
// time, and keeps the slices this rank holds. So a layout's shards are the
// single-rank model's weights cut up, and peak extra memory is one full
// tensor.
#ifndef LOOM_WORKER_ENGINE_PARALLEL_PARALLEL_GPT_H_
#define LOOM_WORKER_ENGINE_PARALLEL_PARALLEL_GPT_H_

#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "common/parallel_layout.h"
#include "worker/engine/parallel/tensor_parallel.h"
#include "worker/engine/config.h"
#include "worker/engine/gpt.h"

namespace loom::engine {

class TensorParallelBlockImpl;  // parallel_gpt.cc

// Which part of the model a rank holds.
struct GptPartition {
  int tp_rank = 0;
  int tp_size = 1;
  int first_block = 0;  // global index of the stage's first block
  int end_block = -1;   // one past its last; -1 = n_layer
  bool embedding = true;  // first pipeline stage: wte (vocab-split) and wpe
  bool head = true;       // last pipeline stage: ln_f and the LM head: tied,
                          // its own copy of the wte shard when the stage
                          // does not also hold the embedding; untied, the
                          // vocabulary rows of lm_head
};

class ParallelGptImpl : public torch::nn::Module {
 public:
  // `config` must pass ValidateGptConfig and ValidateTensorParallel for
  // partition.tp_size; `tensor_group` has tp_size ranks (null when 1) and
  // must outlive the module and every graph it builds. Throws c10::Error on
  // a bad config or partition.
  ParallelGptImpl(const GptConfig& config, const GptPartition& partition,
                  std::shared_ptr<c10d::ProcessGroup> tensor_group);

  // First stage: token + position embeddings of idx [B, T] -> [B, T, d].
  torch::Tensor Embed(const torch::Tensor& idx);
  // This stage's blocks (under autocast and activation checkpointing as
  // GptConfig says) over x [B, T, d] fp32 -> [B, T, d] fp32.
  torch::Tensor Blocks(const torch::Tensor& x);
  // Last stage: ln_f, then the vocab-parallel LM head and mean cross
  // entropy against targets [B, T].
  torch::Tensor HeadLoss(const torch::Tensor& x, const torch::Tensor& targets);
  // The whole model on one stage (embedding and head both held): the mean
  // next-token loss of idx [B, T] against targets [B, T].
  torch::Tensor Loss(const torch::Tensor& idx, const torch::Tensor& targets);

  const GptConfig& config() const { return config_; }
  const GptPartition& partition() const { return partition_; }
  c10d::ProcessGroup* tensor_group() const { return tensor_group_.get(); }

 private:
  torch::Tensor Parameter(const std::string& name) const;
  void InitLikeGpt();

  GptConfig config_;
  GptPartition partition_;
  std::shared_ptr<c10d::ProcessGroup> tensor_group_;
  VocabRange vocab_;
  torch::Tensor wte_, wpe_, lm_head_;  // undefined where not held
  std::vector<std::shared_ptr<TensorParallelBlockImpl>> blocks_;  // this stage's, in order
  Norm ln_f_{nullptr};
};
TORCH_MODULE(ParallelGpt);

// Pipeline stage extra costs, in blocks, for SplitLayers: the LM head's
// logits cost 2·V·d FLOPs per token against a block's
// 24·d² + 4·s·d (Narayanan et al. 2021, eq. 3's terms), so the last stage
// carries V / (12·d + 2·s) blocks' worth; the embedding lookup is free.
double LastStageExtraBlocks(const GptConfig& config);

// The part of the model that the rank at `coordinates` holds under
// `layout`: its TP slot, its stage's blocks (`stage_layers` when given, one
// entry per stage summing to n_layer; else SplitLayers with
// LastStageExtraBlocks; the layout must have pipeline <= n_layer), and the
// embedding / head flags of the first / last stage.
GptPartition PartitionFor(const GptConfig& config, const ParallelLayout& layout,
                          const RankCoordinates& coordinates,
                          const std::vector<int>& stage_layers = {});

// Full-model parameter names of Gpt(config) in registration order, with
// their full shapes (the order Gpt's initialisation draws in).
std::vector<std::pair<std::string, std::vector<int64_t>>> GptParameterShapes(
    const GptConfig& config);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_PARALLEL_GPT_H_
