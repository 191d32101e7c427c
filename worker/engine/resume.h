// The start of a run, before its first step (trainer.cc): where it resumes
// (its own checkpoints, a node's in-memory snapshot, or init_from) and the
// branch it continues. Internal to the trainer; every function but
// BeginBranch is collective over the world.
#ifndef LOOM_WORKER_ENGINE_RESUME_H_
#define LOOM_WORKER_ENGINE_RESUME_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/collectives.h"
#include "worker/engine/rank_engine.h"
#include "worker/engine/trainer_callbacks.h"
#include "worker/engine/trainer_config.h"

namespace loom::engine {

// Serialises seeding + construction of the model across the ranks of one
// process: they share the global generator, and interleaved draws would
// give each a different (and irreproducible) initialisation.
std::mutex& ModelInitMutex();

// Sorted union of `a` and `b`, overlapping and adjacent ranges merged.
std::vector<BatchRange> UnionOfRanges(std::vector<BatchRange> a, const std::vector<BatchRange>& b);

// What resuming found.
struct ResumeOutcome {
  bool restored = false;  // `state` holds a checkpoint's
  // The run is a new branch (TrainerConfig, "Forks") of generation >=
  // fork_generation.
  bool fork = false;
  int64_t fork_generation = 0;
  // The state came from a node's in-memory snapshot, which checkpoint_dir
  // may not hold.
  bool from_snapshot = false;
};

// Rank 0 picks and verifies the checkpoint (TrainerConfig::resume_step);
// with resume_step -1 every snapshot writer also offers the newest snapshot
// of its node (TrainerConfig::snapshot_dir), and the newest state of all,
// in lineage order, wins (a checkpoint over a snapshot of the same step).
// A replicated checkpoint or snapshot resumed by the replicated engine
// travels as bytes from the rank that holds it (every rank restores the
// same bytes); any other is read by every rank from the shared directory,
// piecewise (parallel/sharded_checkpoint.h).
absl::StatusOr<ResumeOutcome> Resume(const TrainerConfig& config, const CheckpointShape& shape,
                                     RankEngine& engine, Collectives& collectives,
                                     const TrainerCallbacks& callbacks, TrainingState* state,
                                     TrainResult* result);

// TrainerConfig::init_from, when Resume restored nothing.
absl::Status InitializeFrom(const TrainerConfig& config, const CheckpointShape& shape,
                            RankEngine& engine, Collectives& collectives,
                            const TrainerCallbacks& callbacks);

// The branch this call continues or starts (TrainerConfig, "Forks"):
// generation, lineage and skip list of `state` after resuming. Returns
// whether they changed what the newest checkpoint says, so that a
// checkpoint must record them before training goes on.
bool BeginBranch(const TrainerConfig& config, const ResumeOutcome& resume, TrainingState* state);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_RESUME_H_
