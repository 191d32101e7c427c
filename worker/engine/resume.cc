#include "worker/engine/resume.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "worker/engine/checkpoint/checkpoint_choice.h"
#include "worker/engine/checkpoint/snapshot_keeper.h"
#include "worker/engine/parallel/sharded_checkpoint.h"

namespace loom::engine {

std::mutex& ModelInitMutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<BatchRange> UnionOfRanges(std::vector<BatchRange> a, const std::vector<BatchRange>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end(), [](const BatchRange& x, const BatchRange& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  std::vector<BatchRange> out;
  for (const BatchRange& r : a) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

absl::StatusOr<ResumeOutcome> Resume(const TrainerConfig& config, const CheckpointShape& shape,
                                     RankEngine& engine, Collectives& collectives,
                                     const TrainerCallbacks& callbacks, TrainingState* state,
                                     TrainResult* result) {
  ResumeOutcome outcome;
  if (config.checkpoint_dir.empty()) return outcome;
  const int rank = collectives.rank();
  absl::StatusOr<ResumeChoice> plan = ResumeChoice{};
  if (rank == 0) {
    if (callbacks.before_resume && config.resume_step != 0) {
      callbacks.before_resume(config.checkpoint_dir, config.resume_step);
    }
    ResumeRequest request{config.checkpoint_dir, config.resume_step,
                          config.allow_start_from_scratch, std::nullopt};
    if (!config.job_id.empty()) request.fence = FenceToken{config.job_id, config.generation};
    plan = ChooseResumeCheckpoint(request, &result->corrupt_checkpoints);
    if (callbacks.on_checkpoint_corrupt) {
      for (const CorruptCheckpoint& c : result->corrupt_checkpoints) {
        callbacks.on_checkpoint_corrupt(c);
      }
    }
  }
  // This node's newest snapshot, offered by its writer (resume_step -1
  // only: a rollback names an older step, which files hold).
  const bool snapshots = config.resume_step == -1 && !config.snapshot_dir.empty() &&
                         config.snapshot_interval > 0 && !engine.sharded_checkpoints();
  std::optional<VerifiedCheckpoint> snapshot;
  if (snapshots && config.snapshot_writer) snapshot = NewestSnapshot(config.snapshot_dir);
  enum Source : int64_t { kNone = 0, kBytes = 1, kDirectory = 2, kSnapshot = 3 };
  int64_t source = kNone;
  if (plan.ok() && plan->checkpoint.has_value()) {
    source = !engine.sharded_checkpoints() && plan->checkpoint->manifest.layout != kShardedLayout
                 ? kBytes
                 : kDirectory;
  }
  const std::vector<int64_t> decision =
      collectives.BroadcastInts({plan.ok() ? 1 : 0, plan.ok() && plan->fork ? 1 : 0,
                                 plan.ok() ? plan->fork_generation : 0, source});
  if (decision[0] == 0) {
    if (!plan.ok()) return plan.status();
    return absl::FailedPreconditionError(
        "rank 0 found no checkpoint to resume from (its error says why)");
  }
  outcome.fork = decision[1] != 0;
  outcome.fork_generation = decision[2];
  source = decision[3];
  // The newest state in lineage order (the highest generation, then the
  // highest step) of rank 0's checkpoint and every node's snapshot; the
  // checkpoint wins a tie. The same on every rank.
  int holder = 0;  // the rank that sends what every rank restores
  if (snapshots) {
    const bool file_known = rank == 0 && source != kNone;
    const bool legacy = file_known && plan->checkpoint->legacy;
    const int64_t file_generation =
        legacy ? std::numeric_limits<int64_t>::max()
               : (file_known ? plan->checkpoint->manifest.state.generation : -1);
    const int64_t file_step = file_known ? plan->checkpoint->manifest.state.step : -1;
    const int64_t snapshot_generation = snapshot ? snapshot->manifest.state.generation : -1;
    const int64_t snapshot_step = snapshot ? snapshot->manifest.state.step : -1;
    const std::vector<int64_t> generations =
        collectives.Max({snapshot_generation, file_generation});
    const int64_t top = std::max(generations[0], generations[1]);
    const std::vector<int64_t> steps = collectives.Max(
        {snapshot_generation == top ? snapshot_step : -1, file_generation == top ? file_step : -1});
    if (generations[0] == top && steps[0] >= 0 && steps[0] > steps[1]) {
      const bool holds = snapshot_generation == top && snapshot_step == steps[0];
      holder = static_cast<int>(collectives.Max({holds ? rank : -1})[0]);
      source = kSnapshot;
    }
  }
  if (source == kNone) return outcome;
  // Sent before taking the lock: in-process ranks take it in turn.
  std::string offered;
  if (rank == holder) {
    offered = source == kSnapshot ? std::move(snapshot->bytes)
              : source == kBytes  ? std::move(plan->checkpoint->bytes)
                                  : plan->checkpoint->path;
  }
  const std::string sent = collectives.BroadcastBytes(std::move(offered), holder);
  absl::Status restoring;
  {
    // Restoring sets the global generator, which in-process ranks share.
    std::lock_guard<std::mutex> lock(ModelInitMutex());
    if (source == kBytes || source == kSnapshot) {
      restoring = engine.Restore(sent, shape, state);
    } else {
      absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(sent, config.model);
      restoring = reader.ok() ? engine.RestoreFrom(*reader, shape, state) : reader.status();
    }
  }
  // Every rank goes on only if every rank restored.
  const int64_t failed = collectives.Max({restoring.ok() ? 0 : rank + 1})[0];
  if (!restoring.ok()) return restoring;
  if (failed != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", failed - 1, " could not restore the checkpoint (its error says why)"));
  }
  result->resumed_from_step = state->step;
  if (source == kSnapshot) {
    result->resumed_from_snapshot = true;
    result->resumed_snapshot_rank = holder;
    outcome.from_snapshot = true;
  }
  outcome.restored = true;
  return outcome;
}

absl::Status InitializeFrom(const TrainerConfig& config, const CheckpointShape& shape,
                            RankEngine& engine, Collectives& collectives,
                            const TrainerCallbacks& callbacks) {
  const int rank = collectives.rank();
  absl::Status verified;
  if (rank == 0) {
    verified = [&]() -> absl::Status {
      if (callbacks.before_init_from) RETURN_IF_ERROR(callbacks.before_init_from(config.init_from));
      const std::string manifest_path =
          (std::filesystem::path(config.init_from) / kManifestFileName).string();
      absl::StatusOr<std::string> bytes = ReadFile(manifest_path);
      if (!bytes.ok()) {
        return absl::DataLossError(absl::StrCat(manifest_path, ": ", bytes.status().message()));
      }
      ASSIGN_OR_RETURN(CheckpointManifest manifest, ParseManifest(*bytes, manifest_path));
      if (manifest.shape.model != shape.model) {
        return absl::FailedPreconditionError(absl::StrCat("it is for model ", manifest.shape.model,
                                                          ", this job trains ", shape.model));
      }
      return VerifyCheckpoint({manifest.state.step, config.init_from, -1, false}).status();
    }();
  }
  const std::string why = collectives.BroadcastBytes(
      rank != 0 || verified.ok() ? std::string() : std::string(verified.message()));
  if (!why.empty()) {
    return NoGoodCheckpointError(
        absl::StrCat("init_from: checkpoint ", config.init_from, " cannot be used: ", why));
  }
  const RestoreScope scope =
      config.init_optimizer ? RestoreScope::kWeightsAndOptimizer : RestoreScope::kWeights;
  TrainingState unused;
  absl::Status restoring;
  {
    std::lock_guard<std::mutex> lock(ModelInitMutex());
    absl::StatusOr<CheckpointReader> reader =
        CheckpointReader::Open(config.init_from, config.model);
    restoring = reader.ok() ? engine.RestoreFrom(*reader, shape, &unused, scope) : reader.status();
  }
  const int64_t failed = collectives.Max({restoring.ok() ? 0 : rank + 1})[0];
  if (!restoring.ok()) {
    return NoGoodCheckpointError(
        absl::StrCat("init_from: reading ", config.init_from, ": ", restoring.message()));
  }
  if (failed != 0) {
    return NoGoodCheckpointError(absl::StrCat("init_from: rank ", failed - 1, " could not read ",
                                              config.init_from, " (its error says why)"));
  }
  return absl::OkStatus();
}

bool BeginBranch(const TrainerConfig& config, const ResumeOutcome& resume, TrainingState* state) {
  const TrainingState resumed = *state;
  state->generation = std::max(state->generation, config.generation);
  if (resume.fork) state->generation = std::max(state->generation, resume.fork_generation);
  state->skip_batches = UnionOfRanges(state->skip_batches, config.skip_batches);
  if (!resume.restored) {
    state->lineage = {{state->generation, 0}};
  } else if (state->generation != resumed.generation) {
    state->lineage.emplace_back(state->generation, state->step);
  }
  return resume.restored ? state->generation != resumed.generation ||
                               state->skip_batches != resumed.skip_batches
                         : resume.fork;
}

}  // namespace loom::engine
