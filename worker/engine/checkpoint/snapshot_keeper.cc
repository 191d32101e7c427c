#include "worker/engine/checkpoint/snapshot_keeper.h"

#include <sys/statvfs.h>

#include <chrono>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/formats/checkpoint_files.h"

namespace loom::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string Mib(uint64_t bytes) { return absl::StrCat(bytes / (1024 * 1024), " MiB"); }

}  // namespace

SnapshotKeeper::SnapshotKeeper(const TrainerConfig& config, const CheckpointShape& shape,
                               RankEngine* engine, const TrainerCallbacks& callbacks,
                               TrainResult* result)
    : config_(config), engine_(engine), callbacks_(callbacks), result_(result) {
  if (config.snapshot_dir.empty() || config.snapshot_interval <= 0 || !config.snapshot_writer) {
    return;
  }
  // A sharded layout's shards would each need a copy on another node: it
  // resumes from checkpoints, as documented (no event: it is the layout's
  // nature, not something that went wrong).
  if (engine->sharded_checkpoints()) return;
  CheckpointWriterOptions options;
  options.dir = config.snapshot_dir;
  options.rank = 0;  // a replica is rank 0's shard
  options.shape = shape;
  options.keep_checkpoints = 1;
  if (!config.job_id.empty()) {
    fence_ = FenceToken{config.job_id, config.generation};
    options.fence = fence_;
    if (absl::Status claimed = ClaimCheckpointDir(config.snapshot_dir, *fence_,
                                                  [&] { RemoveTemporaries(config.snapshot_dir); });
        !claimed.ok()) {
      TurnOff(absl::StrCat("cannot claim ", config.snapshot_dir, ": ", claimed.message()));
      return;
    }
  } else {
    RemoveTemporaries(config.snapshot_dir);
  }
  writer_ = std::make_unique<CheckpointWriter>(std::move(options));
}

SnapshotKeeper::~SnapshotKeeper() = default;

void SnapshotKeeper::TurnOff(const std::string& reason) {
  writer_.reset();
  if (callbacks_.on_snapshots_off) callbacks_.on_snapshots_off(reason);
}

void SnapshotKeeper::Hear(std::optional<absl::StatusOr<CheckpointReport>> outcome) {
  if (!outcome.has_value()) return;
  if (outcome->ok()) {
    newest_step_ = (*outcome)->step;
    result_->snapshots_written += 1;
    return;
  }
  // A snapshot is a spare copy: a failed one turns them off, training goes
  // on (a fenced one means a newer attempt owns the directory).
  TurnOff(absl::StrCat("a snapshot failed: ", outcome->status().message()));
}

void SnapshotKeeper::AfterStep(const TrainingState& state) {
  if (!writer_) return;
  Hear(writer_->Poll());
  if (!writer_ || state.step % config_.snapshot_interval != 0) return;
  if (writer_->in_flight()) {
    result_->snapshots_skipped += 1;
    return;
  }
  absl::StatusOr<ShardContents> contents = engine_->CheckpointShard();
  if (!contents.ok()) {
    TurnOff(absl::StrCat("cannot capture a snapshot: ", contents.status().message()));
    return;
  }
  if (!checked_memory_) {
    checked_memory_ = true;
    uint64_t image = 0;
    for (const torch::Tensor& t : contents->sources) {
      image += static_cast<uint64_t>(t.numel()) * t.element_size();
    }
    if (config_.snapshot_max_bytes > 0 && 3 * image > config_.snapshot_max_bytes) {
      TurnOff(absl::StrCat("a snapshot of this rank's state needs ", Mib(3 * image),
                           " of host memory (three images of ", Mib(image),
                           "), more than its share of ", Mib(config_.snapshot_max_bytes)));
      return;
    }
    struct statvfs fs;
    if (::statvfs(config_.snapshot_dir.c_str(), &fs) == 0) {
      const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (2 * image > free_bytes) {
        TurnOff(absl::StrCat("two snapshots of ", Mib(image), " do not fit in the ",
                             Mib(free_bytes), " free in ", config_.snapshot_dir));
        return;
      }
    }
  }
  if (absl::Status started = writer_->Start(*std::move(contents), state); !started.ok()) {
    TurnOff(absl::StrCat("cannot start a snapshot: ", started.message()));
  }
}

double SnapshotKeeper::WaitForSnapshot() {
  if (!writer_) return 0;
  const auto start = std::chrono::steady_clock::now();
  writer_->WaitForSnapshot();
  return SecondsSince(start);
}

void SnapshotKeeper::Discard() {
  if (!writer_) return;
  Hear(writer_->Wait());
  if (!writer_) return;
  writer_.reset();
  auto remove = [&]() -> absl::Status {
    for (const CheckpointEntry& entry : ListCheckpoints(config_.snapshot_dir)) {
      DeleteCheckpoint(entry);
    }
    return absl::OkStatus();
  };
  absl::Status removed =
      fence_.has_value() ? WhileFenceHeld(config_.snapshot_dir, *fence_, remove) : remove();
  if (!removed.ok() && !IsCheckpointFenced(removed)) {
    std::cerr << "loom: removing the snapshots in " << config_.snapshot_dir << ": "
              << removed.message() << std::endl;
  }
}

std::optional<VerifiedCheckpoint> NewestSnapshot(const std::string& dir) {
  for (const CheckpointEntry& entry : ListCheckpoints(dir)) {
    if (entry.generation < 0) continue;
    absl::StatusOr<VerifiedCheckpoint> verified = VerifyCheckpoint(entry);
    if (verified.ok() && !verified->legacy && verified->manifest.layout != kShardedLayout) {
      return *std::move(verified);
    }
  }
  return std::nullopt;
}

}  // namespace loom::engine
