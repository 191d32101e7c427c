// Pipeline parallelism: the 1F1B schedule (Narayanan et al. 2021,
// "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", sec. 2.2.1, fig. 4 top; PipeDream-Flush) over a
// ParallelGpt's stages, with activations and their gradients passed between
// neighbouring stages by c10d send/recv.
//
// Stage s of p runs min(p - s - 1, m) forward passes (warm-up), then
// alternates one forward and one backward until every forward has run, then
// the remaining backwards (cool-down). So stage s keeps at most p - s
// micro-batches' activations, not m as GPipe's all-forward-then-all-backward
// does, and the idle fraction (the bubble) is (p - 1) / (m + p - 1).
#ifndef LOOM_WORKER_ENGINE_PARALLEL_PIPELINE_H_
#define LOOM_WORKER_ENGINE_PARALLEL_PIPELINE_H_

#include <functional>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "worker/engine/parallel/parallel_gpt.h"

namespace loom::engine {

struct PipelineOp {
  enum Kind { kForward, kBackward } kind;
  int micro_batch;
  bool operator==(const PipelineOp& o) const {
    return kind == o.kind && micro_batch == o.micro_batch;
  }
};

// The order in which stage `stage` of `stages` runs the forward and backward
// passes of `micro_batches` micro-batches under 1F1B. Pure; every stage's
// list has each forward before its backward, forwards and backwards each in
// micro-batch order.
std::vector<PipelineOp> OneFOneBSchedule(int stages, int stage, int micro_batches);

struct PipelineTimes {
  double forward_seconds = 0;   // this stage's forward passes (with the loss)
  double backward_seconds = 0;  // and backward passes
  double wait_seconds = 0;      // blocked on receives from neighbours
};

// Runs one optimizer step's forward and backward passes of `model` (one
// stage of a pipeline; ParallelGpt's partition says which) over micro-
// batches (inputs[i], targets[i]) [b, T] under 1F1B. Only the first stage
// reads inputs and only the last reads targets, but every stage needs their
// shapes (the activation shape is [b, T, d]). Each micro-batch's loss is
// divided by m, so the gradients accumulated in the parameters are those of
// the mean loss. Returns that mean loss on every stage of the pipeline
// group (sent from the last stage). `pipeline_group` has the stages as its
// ranks (rank = stage) and may be null for a single stage. Collective over
// the pipeline group, and over the tensor group inside the stages.
// `before_last_backward`, if set, runs right before the stage's last
// backward pass (micro-batch m - 1), e.g. to arm a data-parallel reduction
// that overlaps it.
double RunOneFOneB(ParallelGptImpl& model, c10d::ProcessGroup* pipeline_group,
                   const std::vector<torch::Tensor>& inputs,
                   const std::vector<torch::Tensor>& targets, PipelineTimes* times = nullptr,
                   const std::function<void()>& before_last_backward = nullptr);

// The mean loss of one micro-batch (inputs, targets [b, T]) through the
// pipeline without gradients: each stage receives, runs its blocks, sends;
// the last computes the loss, which every stage returns. For validation.
double PipelineForwardLoss(ParallelGptImpl& model, c10d::ProcessGroup* pipeline_group,
                           const torch::Tensor& inputs, const torch::Tensor& targets);

// Adds the tied wte gradients of the first and last stages (the embedding
// group: those two stages' ranks of one data-parallel replica and TP rank),
// so that both copies take the same update. Null group: nothing to do.
void SumTiedEmbeddingGradients(ParallelGptImpl& model, c10d::ProcessGroup* embedding_group);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_PIPELINE_H_
