// The RankEngine (rank_engine.h) of a rank in a tensor / pipeline / ZeRO
// layout: its ParallelGpt partition, the 1F1B schedule when the pipeline has
// more than one stage, ShardedAdamW over the data group, and sharded
// checkpoints (sharded_checkpoint.h).
#ifndef LOOM_WORKER_ENGINE_PARALLEL_LAYOUT_ENGINE_H_
#define LOOM_WORKER_ENGINE_PARALLEL_LAYOUT_ENGINE_H_

#include <memory>

#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/rank_engine.h"

namespace loom::engine {

// OK if `config` can run under `layout` (whose data degree the caller has
// checked against the world): the model splits over layout.tensor
// (ValidateTensorParallel), pipeline <= n_layer, zero_stage in [0, 2],
// global_batch is a multiple of data x micro_batch, and the features the
// layout engine does not execute yet are off: fp16. The device is "cpu",
// "cuda" or "cuda:N" (CUDA ranks run NCCL groups on the device and stage
// Gloo groups' collectives through the host, p2p_placement.h).
// INVALID_ARGUMENT naming the field otherwise.
absl::Status ValidateLayoutConfig(const TrainerConfig& config, const ParallelLayout& layout);

// Builds the engine; call under the trainer's model-initialisation lock
// right after seeding (the model's weights are drawn from the global
// generator). `groups` must outlive the engine. The model is built on the
// CPU and moved to `device`, where the optimizer keeps its buffers too.
std::unique_ptr<RankEngine> MakeLayoutEngine(const TrainerConfig& config,
                                             const ParallelGroups& groups,
                                             const torch::Device& device);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_LAYOUT_ENGINE_H_
