// The replicated engine (rank_engine.h): plain data parallelism. Every rank
// holds the whole Gpt and the fused AdamW on its training device; gradients
// are averaged over the world while backward runs (gradient_averager.h), and
// world rank 0 writes the whole model into each checkpoint.
#ifndef LOOM_WORKER_ENGINE_REPLICATED_ENGINE_H_
#define LOOM_WORKER_ENGINE_REPLICATED_ENGINE_H_

#include <memory>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "worker/engine/collectives.h"
#include "worker/engine/rank_engine.h"
#include "worker/engine/trainer_config.h"

namespace loom::engine {

// The model configuration as a rank on `device` runs it (on_gpu set).
GptConfig ModelConfigFor(const TrainerConfig& config, const torch::Device& device);

// Builds the engine: the model on the CPU from the global generator, then
// moved to `device`. Call under the trainer's model-initialisation lock
// right after seeding. `collectives` (the world) must outlive the engine.
absl::StatusOr<std::unique_ptr<RankEngine>> MakeReplicatedEngine(const TrainerConfig& config,
                                                                 const torch::Device& device,
                                                                 Collectives* collectives);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_REPLICATED_ENGINE_H_
