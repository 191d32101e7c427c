// The training loop of one rank: GPT model, AdamW, LR schedule, gradient
// accumulation over micro-batches, data-parallel gradient all-reduce through a
// c10d ProcessGroup, periodic validation and atomic checkpoints.
//
// No gRPC here: the rank process (worker/rank_main.cc) wires it to the
// worker daemon; tests and benchmarks call it directly.
#ifndef LOOM_WORKER_ENGINE_TRAINER_H_
#define LOOM_WORKER_ENGINE_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/trainer_callbacks.h"
#include "worker/engine/trainer_config.h"

// Forward declarations keep this header free of LibTorch, so that code
// without torch (the worker daemon, the controller) can include it.
namespace c10d {
class ProcessGroup;
}
namespace torch::nn {
class Module;
}

namespace loom::engine {

struct ParallelGroups;  // parallel/process_groups.h

// TrainerConfig, GlooGroupOptions: trainer_config.h. TrainerCallbacks,
// TrainResult: trainer_callbacks.h.

// Trains from scratch, or resumes from a checkpoint in checkpoint_dir chosen
// by resume_step, until schedule.total_steps optimizer steps are done.
// `process_group` may be null for a single rank; otherwise it defines rank
// and world size, and every rank must call Train with the same config.
// After initialisation rank 0's weights are broadcast to all ranks (as
// torch DistributedDataParallel does), so replicas start identical.
//
// c10d process groups are intrusively reference counted. A group made with
// std::make_shared is fine; one already owned by a c10::intrusive_ptr must be
// wrapped with a deleter that keeps that intrusive_ptr (as
// CreateGlooProcessGroup does), never by adopting its raw pointer.
//
// Ranks that share a process (tests) draw from one global LibTorch
// generator: their initial weights are still deterministic (construction is
// serialised), their dropout masks are not.
//
// Errors: INVALID_ARGUMENT for a bad config (the message names the field) or
// tokens outside the vocabulary; FAILED_PRECONDITION if the checkpoint to
// resume from was written for a different model shape or global_batch, or
// if resume_step > 0 and no checkpoint at or before it verifies (on ranks
// != 0 the message only says that rank 0 failed); DATA_LOSS
// (IsNoGoodCheckpoint, checkpoint_choice.h; rank 0) if resume_step is -1 and
// every checkpoint fails verification, without allow_start_from_scratch
// (other ranks: FAILED_PRECONDITION); CANCELLED via
// should_stop; ABORTED on ranks != 0 when rank 0 failed to write a
// checkpoint (found at the next step boundary, when saves are asynchronous);
// errors of TokenDataset::Load; INTERNAL for LibTorch errors (c10::Error,
// including collective failures and timeouts) and I/O errors. Train never
// returns with a checkpoint save in flight: it waits for the last one.
absl::StatusOr<TrainResult> Train(const TrainerConfig& config,
                                  std::shared_ptr<c10d::ProcessGroup> process_group,
                                  const TrainerCallbacks& callbacks);

// Trains one rank of a tensor / pipeline / ZeRO layout: as Train, over the
// groups CreateParallelGroups made, whose layout must be config's
// (tensor_parallel, pipeline_parallel; data = the rest of the world).
// Every rank of the job calls it. World rank 0 reports steps and writes
// checkpoints; every rank takes part in gathering them.
absl::StatusOr<TrainResult> TrainWithGroups(const TrainerConfig& config,
                                            const ParallelGroups& groups,
                                            const TrainerCallbacks& callbacks);

// Blocks until all world_size ranks have joined. INVALID_ARGUMENT for a bad
// rank/world size/port; INTERNAL if the store or Gloo cannot be set up.
absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> CreateGlooProcessGroup(
    const GlooGroupOptions& options);

// The process group for ranks that train on `device` (TrainerConfig::device
// spelling), with the same rendezvous: NCCL for a CUDA device when LibTorch
// was built with it (USE_C10D_NCCL), else Gloo. Errors as
// CreateGlooProcessGroup, and INVALID_ARGUMENT for a device that is not
// "cpu", "cuda" or "cuda:N".
absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> CreateProcessGroup(
    const GlooGroupOptions& options, const std::string& device);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAINER_H_
