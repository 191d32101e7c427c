// Checkpoints of a parallel layout in the single-rank format (checkpoint.h):
// the whole model's parameters and AdamW moments, gathered from the ranks
// that hold them onto world rank 0, and cut up again on restore. So any
// layout (tp, pp, dp, ZeRO stage) resumes a checkpoint of any other, and of
// the replicated engine, and the other way round.
//
// Cost, stated: rank 0 holds a whole copy of the model and its moments
// (16 bytes per parameter: weights, two moments, the writer's staging) while
// it writes, and every rank builds one transiently on restore. Writing one
// shard per rank in parallel is the next step (issue 11, "Sharded").
#ifndef LOOM_WORKER_ENGINE_PARALLEL_LAYOUT_CHECKPOINT_H_
#define LOOM_WORKER_ENGINE_PARALLEL_LAYOUT_CHECKPOINT_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "worker/engine/parallel/parallel_gpt.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/parallel/sharded_adamw.h"

namespace loom::engine {

// Collective over the world. On world rank 0, overwrites the parameters of
// `full_model` (a Gpt of the same config) with the layout's, and sets
// `full_optimizer`'s (AdamW over full_model, MakeAdamW's groups) state to
// the layout's moments and step count (no state when no step was taken).
// Other ranks pass null for both. Parameters come from data-parallel
// replica 0, each from the first stage that holds it.
void GatherFullState(ParallelGptImpl& model, const ShardedAdamW& optimizer,
                     const ParallelGroups& groups, torch::nn::Module* full_model,
                     torch::optim::Optimizer* full_optimizer);

// Local. Sets this rank's parameters and moments from a whole model and its
// AdamW state (restored from a checkpoint).
void ScatterFullState(const torch::nn::Module& full_model,
                      const torch::optim::Optimizer& full_optimizer, ParallelGptImpl& model,
                      ShardedAdamW& optimizer);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_LAYOUT_CHECKPOINT_H_
