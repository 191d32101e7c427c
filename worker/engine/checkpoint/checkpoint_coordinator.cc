#include "worker/engine/checkpoint/checkpoint_coordinator.h"

#include <unistd.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/checkpoint/checkpoint_fence.h"

namespace loom::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

CheckpointCoordinator::CheckpointCoordinator(const TrainerConfig& config,
                                             const CheckpointShape& shape, RankEngine* engine,
                                             Collectives* collectives,
                                             const TrainerCallbacks& callbacks,
                                             TrainResult* result)
    : config_(config),
      shape_(shape),
      engine_(engine),
      collectives_(collectives),
      callbacks_(callbacks),
      result_(result) {
  if (config.checkpoint_dir.empty()) return;
  sharded_ = engine->sharded_checkpoints();
  const int rank = collectives->rank();
  options_.dir = config.checkpoint_dir;
  options_.rank = rank;
  options_.shape = shape;
  options_.keep_checkpoints = config.keep_checkpoints;
  options_.keep_every_steps = config.keep_every_steps;
  options_.keep_best = config.keep_best;
  options_.retain_distance_steps = config.retain_distance_steps;
  options_.upload_retention = config.upload_retention;
  options_.held_checkpoints = config.held_checkpoints;
  options_.on_stage = callbacks.on_checkpoint_stage;
  if (!config.job_id.empty()) options_.fence = FenceToken{config.job_id, config.generation};
  if (sharded_) {
    // One temporary directory per save, named after world rank 0's pid, so
    // that a crashed attempt's leftovers (removed at the next start) are
    // never mistaken for this one's.
    options_.shared_temp_tag =
        absl::StrCat(collectives->BroadcastInts({static_cast<int64_t>(::getpid())})[0]);
  }
  if (sharded_ || rank == 0) writer_ = std::make_unique<CheckpointWriter>(options_);
}

// The writer waits for a save in flight (which may still be copying the
// engine's tensors) before they go.
CheckpointCoordinator::~CheckpointCoordinator() = default;

void CheckpointCoordinator::Fail(int64_t step, const absl::Status& error) {
  if (!failure_.ok()) return;
  // A fenced save says a newer attempt owns the directory: this one is over,
  // whatever the policy for failed saves.
  if (config_.continue_after_failed_save && !IsCheckpointFenced(error)) {
    // Reported, and training goes on; Finish(final) decides about the last.
    latest_failure_ = error;
    latest_failed_step_ = step;
  } else {
    failure_ = error;
    failed_step_ = step;
  }
  if (collectives_->rank() == 0 && callbacks_.on_checkpoint_failed) {
    callbacks_.on_checkpoint_failed(step, error);
  }
}

void CheckpointCoordinator::Take(std::optional<absl::StatusOr<CheckpointReport>> outcome) {
  if (!outcome.has_value()) return;
  if (!outcome->ok()) {
    Fail(saving_step_, outcome->status());
    return;
  }
  latest_failure_ = absl::OkStatus();
  latest_failed_step_ = -1;
  result_->checkpoints.push_back(**outcome);
  if (callbacks_.on_checkpoint) callbacks_.on_checkpoint(**outcome);
}

void CheckpointCoordinator::CompleteSharded() {
  if (!in_flight_) return;
  in_flight_ = false;
  std::optional<absl::StatusOr<CheckpointReport>> mine = std::move(finished_);
  finished_.reset();
  if (!mine.has_value()) mine = writer_->Wait();
  const auto start = std::chrono::steady_clock::now();
  // Every rank's (failed?, bytes, crc) in its three slots, summed.
  const int world = collectives_->world_size();
  const int rank = collectives_->rank();
  std::vector<int64_t> table(3 * static_cast<size_t>(world), 0);
  const bool ok = mine.has_value() && mine->ok();
  table[3 * rank] = ok ? 0 : 1;
  if (ok) {
    table[3 * rank + 1] = static_cast<int64_t>(writer_->written_shard().bytes);
    table[3 * rank + 2] = writer_->written_shard().crc32c;
  }
  table = collectives_->SumInts(std::move(table));
  std::vector<int> failed_ranks;
  for (int r = 0; r < world; ++r) {
    if (table[3 * r] != 0) failed_ranks.push_back(r);
  }
  if (!ok) Fail(saving_step_, mine.has_value() ? mine->status()
                                               : absl::InternalError("no save was in flight"));
  if (!failed_ranks.empty()) {
    any_failed_ = !config_.continue_after_failed_save;
    if (rank == 0 && ok) {
      absl::Status others = absl::AbortedError(
          absl::StrCat("checkpoint at step ", saving_step_, ": rank(s) ",
                       absl::StrJoin(failed_ranks, ", "), " failed to write their shard"));
      // Another rank's early fence check may have seen a newer attempt's
      // claim that landed after this rank's: then this attempt is fenced
      // here too, and rank 0 stops as fenced, not as a failed save.
      if (options_.fence.has_value()) {
        others = ExplainSaveFailure(options_.dir, *options_.fence, std::move(others));
      }
      Fail(saving_step_, others);
    }
    return;
  }
  if (rank != 0) return;
  std::vector<ManifestFile> files;
  for (int r = 0; r < world; ++r) {
    ManifestFile file;
    file.name = ShardFileName(r);
    file.rank = r;
    file.bytes = static_cast<uint64_t>(table[3 * r + 1]);
    file.crc32c = static_cast<uint32_t>(table[3 * r + 2]);
    files.push_back(std::move(file));
  }
  absl::StatusOr<CheckpointReport> report =
      CommitShardedCheckpoint(options_, engine_->CheckpointLayout(), saving_state_, files);
  if (report.ok()) {
    // The whole save as world rank 0 saw it: its own shard's write and the
    // commit; its stall, plus the wait for the others and the commit.
    report->write_seconds = (*mine)->write_seconds + SecondsSince(start);
    report->stall_seconds = (*mine)->stall_seconds + SecondsSince(start);
  }
  Take(std::move(report));
}

absl::Status CheckpointCoordinator::EarlyFenceCheck() const {
  if (!options_.fence.has_value()) return absl::OkStatus();
  return CheckFenceHeld(options_.dir, *options_.fence);
}

void CheckpointCoordinator::Save(const TrainingState& state, bool wait) {
  if (!writer_ && !sharded_) {
    // Replicated, not rank 0: nothing to write.
    return;
  }
  if (sharded_) {
    CompleteSharded();
    if (any_failed_ || !failure_.ok()) return;
    saving_step_ = state.step;
    saving_state_ = state;
    in_flight_ = true;  // on every rank alike, even if Start fails below
    if (absl::Status held = EarlyFenceCheck(); !held.ok()) {
      finished_ = absl::StatusOr<CheckpointReport>(held);
      if (wait) CompleteSharded();
      return;
    }
    absl::StatusOr<ShardContents> contents = engine_->CheckpointShard();
    absl::Status started =
        contents.ok() ? writer_->Start(*std::move(contents), state) : contents.status();
    if (!started.ok()) finished_ = absl::StatusOr<CheckpointReport>(started);
    if (wait) CompleteSharded();
    return;
  }
  Take(writer_->Wait());
  if (!failure_.ok()) return;
  saving_step_ = state.step;
  if (absl::Status held = EarlyFenceCheck(); !held.ok()) {
    Fail(state.step, held);
    return;
  }
  absl::StatusOr<ShardContents> contents = engine_->CheckpointShard();
  absl::Status started =
      contents.ok() ? writer_->Start(*std::move(contents), state) : contents.status();
  if (!started.ok()) {
    Fail(state.step, started);
    return;
  }
  if (wait) Take(writer_->Wait());
}

absl::StatusOr<StopRequest> CheckpointCoordinator::AtStepBoundary(StopRequest stop,
                                                                  int64_t next_step) {
  int64_t unfinished = 0;
  if (sharded_) {
    if (in_flight_ && !finished_.has_value()) finished_ = writer_->Poll();
    unfinished = in_flight_ && !finished_.has_value() ? 1 : 0;
  } else if (writer_) {
    Take(writer_->Poll());
  }
  const std::vector<int64_t> flags = collectives_->Max(
      {static_cast<int64_t>(stop), failure_.ok() ? 0 : failed_step_ + 1, unfinished});
  if (flags[1] != 0) {
    if (!failure_.ok()) return failure_;
    return absl::AbortedError(absl::StrCat(sharded_ ? "a rank" : "rank 0",
                                           " failed to write the checkpoint at step ", flags[1] - 1));
  }
  // Sharded: every rank's shard is written: commit it.
  if (sharded_ && in_flight_ && flags[2] == 0) CompleteSharded();
  if (flags[0] != 0) {
    if (sharded_) {
      CompleteSharded();
    } else if (writer_) {
      Take(writer_->Wait());
    }
    if (flags[0] == static_cast<int64_t>(StopRequest::kSaveAndStop)) {
      return StopRequest::kSaveAndStop;
    }
    return absl::CancelledError(absl::StrCat(
        "stopped before step ", next_step,
        failure_.ok() ? "" : "; the last checkpoint save failed: ",
        failure_.ok() ? "" : failure_.message()));
  }
  return StopRequest::kNone;
}

double CheckpointCoordinator::WaitForSnapshot() {
  if (!writer_) return 0;
  const auto start = std::chrono::steady_clock::now();
  writer_->WaitForSnapshot();
  return SecondsSince(start);
}

absl::Status CheckpointCoordinator::Agree() {
  const int64_t failed = collectives_->Max({failure_.ok() ? 0 : failed_step_ + 1})[0];
  if (failed == 0) return absl::OkStatus();
  if (!failure_.ok()) return failure_;
  return absl::AbortedError(absl::StrCat(sharded_ ? "a rank" : "rank 0",
                                         " failed to write the checkpoint at step ", failed - 1));
}

absl::Status CheckpointCoordinator::Finish(bool final) {
  if (sharded_) {
    CompleteSharded();
  } else if (writer_) {
    Take(writer_->Wait());
  }
  if (final && !latest_failure_.ok() && failure_.ok()) {
    failure_ = latest_failure_;
    failed_step_ = latest_failed_step_;
  }
  return Agree();
}

}  // namespace loom::engine
