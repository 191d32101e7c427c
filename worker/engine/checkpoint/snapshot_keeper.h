// In-memory snapshots of a replicated run: every few steps, one rank of the
// job on each node saves its replica into a directory in that node's host
// memory (tmpfs), so that a restart after a rank or a node is lost resumes
// from the newest step any surviving node holds, instead of from the last
// checkpoint file, and redoes at most snapshot_interval steps.
//
// What it is. A snapshot is a checkpoint (checkpoint.h: the same shard
// bytes, manifest, lineage and checksums) written by its own
// CheckpointWriter into TrainerConfig::snapshot_dir, which the worker points
// at /dev/shm: host memory, no disk. The writer keeps the newest snapshot;
// the directory is fenced per attempt like checkpoint_dir
// (checkpoint_fence.h), so a stale attempt cannot write one a newer attempt
// would take. With data parallelism every rank's replica is the whole state
// (bitwise the same: the gradients are averaged identically everywhere), so
// one writer per node keeps a copy on every node the job runs on with no
// transfer between nodes. Sharded layouts (tensor, pipeline, ZeRO) would
// need each shard copied to a peer node: they checkpoint to files only.
//
// Off the step's critical path: a snapshot's tensors are copied on the
// writer's thread while the next step's forward and backward run (its
// optimizer step waits for the copy: WaitForSnapshot); a snapshot still
// being written when the next is due is skipped (counted), never waited
// for.
//
// Memory. A writer holds its staging buffer (one shard image, in the rank's
// own memory) and, in snapshot_dir, the newest snapshot and the one being
// written: three images at most. If that exceeds snapshot_max_bytes, or two
// images exceed the free space of snapshot_dir, snapshots are off for the
// run and on_snapshots_off says why (the job then resumes from files only).
//
// Thread-compatible: one training thread calls every method. No collective.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_SNAPSHOT_KEEPER_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_SNAPSHOT_KEEPER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_fence.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/rank_engine.h"
#include "worker/engine/trainer_callbacks.h"
#include "worker/engine/trainer_config.h"

namespace loom::engine {

class SnapshotKeeper {
 public:
  // On when config.snapshot_dir is set, config.snapshot_interval > 0, this
  // rank writes (config.snapshot_writer) and `engine`'s checkpoints are
  // replicated (a sharded layout keeps none, and says nothing: that is
  // documented); claims the directory for this attempt then (a newer
  // attempt's claim turns snapshots off). `engine`, `callbacks` and
  // `result` must outlive this.
  SnapshotKeeper(const TrainerConfig& config, const CheckpointShape& shape, RankEngine* engine,
                 const TrainerCallbacks& callbacks, TrainResult* result);
  ~SnapshotKeeper();
  SnapshotKeeper(const SnapshotKeeper&) = delete;
  SnapshotKeeper& operator=(const SnapshotKeeper&) = delete;

  bool on() const { return writer_ != nullptr; }

  // After the optimizer step that reached `state.step`: hears of the
  // snapshot in flight, then starts one of `state` if it is due and none
  // is in flight.
  void AfterStep(const TrainingState& state);

  // Before the optimizer step: waits until the snapshot in flight has
  // copied the tensors the step overwrites. Returns the seconds blocked.
  double WaitForSnapshot();

  // The step of the newest snapshot committed by this run; -1 if none.
  int64_t newest_step() const { return newest_step_; }

  // The run is over (finished, or saved and stopped: its files hold the
  // state): waits for the snapshot in flight and deletes this job's
  // snapshots from the directory, under the fence.
  void Discard();

 private:
  void TurnOff(const std::string& reason);
  void Hear(std::optional<absl::StatusOr<CheckpointReport>> outcome);

  const TrainerConfig& config_;
  RankEngine* engine_;
  const TrainerCallbacks& callbacks_;
  TrainResult* result_;
  std::optional<FenceToken> fence_;
  std::unique_ptr<CheckpointWriter> writer_;  // null: off
  bool checked_memory_ = false;
  int64_t newest_step_ = -1;
};

// The newest snapshot in `dir` (a node's snapshot directory) that verifies,
// in lineage order; nullopt if none does (a missing directory has none).
// Reads the snapshot's bytes (replicated layouts only). No LibTorch.
std::optional<VerifiedCheckpoint> NewestSnapshot(const std::string& dir);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_SNAPSHOT_KEEPER_H_
