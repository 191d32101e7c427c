// The training loop's checkpoint saving, for every rank of a job: when a
// save starts, when its outcome is heard, and how every rank agrees that it
// failed. Two modes, by the engine (rank_engine.h):
//   * replicated: world rank 0 alone writes the whole model through its
//     CheckpointWriter (its own manifest and commit); the other ranks only
//     hear of failures;
//   * sharded (tensor / pipeline / ZeRO layouts): every rank writes its own
//     shard (parallel/sharded_checkpoint.h) into one shared temporary
//     directory, asynchronously; at the first step boundary where every
//     rank's shard is written (a collective check), world rank 0 writes the
//     manifest listing every shard and its CRC-32C and commits the
//     directory, so a checkpoint commits for all ranks or for none.
// At most one save is in flight. Every method is collective over the world
// (ranks call them in the same order with the same arguments), on the
// training thread. May throw c10::Error from collectives.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_COORDINATOR_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_COORDINATOR_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/collectives.h"
#include "worker/engine/rank_engine.h"
#include "worker/engine/trainer_callbacks.h"
#include "worker/engine/trainer_config.h"

namespace loom::engine {

// What a rank asks at a step boundary; the largest asked by any rank wins,
// so a plain stop (a cancel, or a preemption's grace run out) overrides a
// save-and-stop.
enum class StopRequest : int64_t {
  kNone = 0,
  kSaveAndStop = 1,  // save the state reached, then stop (preemption)
  kStop = 2,         // stop now (a save in flight is finished first)
};

class CheckpointCoordinator {
 public:
  // No checkpoints unless config.checkpoint_dir is set. `engine`,
  // `collectives`, `callbacks` and `result` (where committed saves are
  // appended, on world rank 0) must outlive this. Collective in sharded
  // mode (world rank 0 tells the others its temporary-directory tag).
  CheckpointCoordinator(const TrainerConfig& config, const CheckpointShape& shape,
                        RankEngine* engine, Collectives* collectives,
                        const TrainerCallbacks& callbacks, TrainResult* result);
  ~CheckpointCoordinator();

  // Saves `state` once the save in flight (if any) has finished; waits for
  // this one too if `wait`. After a failed save nothing more is saved,
  // unless config.continue_after_failed_save: then every failure is
  // reported (on_checkpoint_failed) and training goes on; the next save is
  // tried as usual (space may have been freed).
  void Save(const TrainingState& state, bool wait);

  // Step boundary: hears of finished saves, and tells every rank what the
  // ranks asked (the largest StopRequest of any rank) and whether a save
  // failed anywhere. Returns kNone to go on; kSaveAndStop with the save in
  // flight finished and reported (the caller saves the state reached and
  // calls Finish); CANCELLED for kStop (a save in flight is finished and
  // reported first); the save's error on the rank that saw it, ABORTED on
  // the others.
  absl::StatusOr<StopRequest> AtStepBoundary(StopRequest stop, int64_t next_step);

  // Before the optimizer step: waits until the save in flight has copied
  // the tensors the step overwrites. Returns the seconds blocked.
  double WaitForSnapshot();

  // Waits for the save in flight and fails every rank if any save failed
  // (as AtStepBoundary does). With continue_after_failed_save, only if the
  // save just waited for failed and `final` (the run's last checkpoint:
  // there is nothing to continue to); the resume-point rewrite passes false.
  absl::Status Finish(bool final = true);

 private:
  bool sharded() const { return sharded_; }
  // Sharded: the save in flight has finished on every rank; gathers the
  // shards' sizes and checksums and (world rank 0) commits.
  void CompleteSharded();
  // A newer attempt's claim on the directory, seen before a save writes
  // anything (CheckFenceHeld): that save fails as fenced, and this attempt
  // stops at this save point.
  absl::Status EarlyFenceCheck() const;
  void Take(std::optional<absl::StatusOr<CheckpointReport>> outcome);
  void Fail(int64_t step, const absl::Status& error);
  // Collective: fails every rank if any rank recorded a failure.
  absl::Status Agree();

  const TrainerConfig& config_;
  const CheckpointShape shape_;
  RankEngine* engine_;
  Collectives* collectives_;
  const TrainerCallbacks& callbacks_;
  TrainResult* result_;
  bool sharded_ = false;
  CheckpointWriterOptions options_;
  std::unique_ptr<CheckpointWriter> writer_;  // null: this rank writes nothing
  absl::Status failure_;       // the first failed save this rank saw (that
                               // stops training)
  int64_t failed_step_ = -1;
  // continue_after_failed_save: the newest save's failure, if it failed.
  absl::Status latest_failure_;
  int64_t latest_failed_step_ = -1;
  bool any_failed_ = false;    // sharded: known to every rank alike
  int64_t saving_step_ = -1;   // the save in flight
  bool in_flight_ = false;     // sharded: the same on every rank
  TrainingState saving_state_;
  // Sharded: this rank's finished save, heard before the others finished.
  std::optional<absl::StatusOr<CheckpointReport>> finished_;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_COORDINATOR_H_
