#include "common/formats/retention.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/prune_log.h"

namespace loom::engine {

std::string DescribeRetention(const RetentionPolicy& policy) {
  if (policy.all) return "every checkpoint";
  std::vector<std::string> rules = {absl::StrCat("newest ", policy.newest)};
  if (policy.every > 0) rules.push_back(absl::StrCat("every ", policy.every, " steps"));
  if (policy.best > 0) rules.push_back(absl::StrCat("best ", policy.best, " by validation loss"));
  return absl::StrJoin(rules, ", ");
}

std::vector<RetentionVerdict> PlanRetention(const std::vector<RetentionCandidate>& candidates,
                                            const RetentionPolicy& policy,
                                            const RetentionGuard& guard) {
  std::vector<RetentionVerdict> verdicts(candidates.size());
  std::vector<std::vector<std::string>> keeps(candidates.size());
  std::vector<size_t> branch;  // indices on the branch, newest first
  for (size_t i = 0; i < candidates.size(); ++i) {
    verdicts[i].checkpoint = candidates[i];
    const RetentionCandidate& c = candidates[i];
    CheckpointEntry entry;
    entry.step = c.step;
    entry.generation = c.generation;
    if (IsOnBranch(entry, guard.lineage, guard.tip_step)) branch.push_back(i);
    auto held = guard.held.find(c.step);
    if (held != guard.held.end()) keeps[i].push_back(held->second);
  }
  // Lineage order is step order on the branch; sort anyway, the caller's
  // order is not this function's contract for the rules below.
  std::stable_sort(branch.begin(), branch.end(),
                   [&](size_t a, size_t b) { return candidates[a].step > candidates[b].step; });
  if (policy.all) {
    for (auto& k : keeps) k.insert(k.begin(), "retention keeps every checkpoint");
  } else {
    for (size_t n = 0; n < branch.size() && n < static_cast<size_t>(std::max(policy.newest, 0));
         ++n) {
      keeps[branch[n]].push_back(absl::StrCat("one of the newest ", policy.newest));
    }
    if (policy.every > 0) {
      for (size_t i : branch) {
        if (candidates[i].step % policy.every == 0) {
          keeps[i].push_back(absl::StrCat("its step is a multiple of ", policy.every));
        }
      }
    }
    if (policy.best > 0) {
      std::vector<size_t> scored;
      for (size_t i : branch) {
        if (candidates[i].val_loss.has_value()) scored.push_back(i);
      }
      // Lowest loss first; a tie goes to the newer checkpoint.
      std::stable_sort(scored.begin(), scored.end(), [&](size_t a, size_t b) {
        return *candidates[a].val_loss < *candidates[b].val_loss;
      });
      for (size_t n = 0; n < scored.size() && n < static_cast<size_t>(policy.best); ++n) {
        keeps[scored[n]].push_back(absl::StrFormat("one of the best %d by validation loss (%.4f)",
                                                   policy.best, *candidates[scored[n]].val_loss));
      }
    }
  }
  if (guard.upload.has_value()) {
    const RetentionPolicy& up = *guard.upload;
    std::vector<size_t> best;  // the store's best by validation loss, as far as this tier knows
    if (!up.all && up.best > 0) {
      for (size_t i : branch) {
        if (candidates[i].val_loss.has_value()) best.push_back(i);
      }
      std::stable_sort(best.begin(), best.end(), [&](size_t a, size_t b) {
        return *candidates[a].val_loss < *candidates[b].val_loss;
      });
      if (best.size() > static_cast<size_t>(up.best)) best.resize(up.best);
    }
    int held_for_all = 0;
    for (size_t i : branch) {  // newest first
      if (!candidates[i].awaiting_upload) continue;
      std::string why;
      if (up.all) {
        if (held_for_all++ < kMaxHeldForUpload) why = "the store keeps every checkpoint";
      } else if (up.every > 0 && candidates[i].step % up.every == 0) {
        why = absl::StrCat("the store keeps each multiple of ", up.every);
      } else if (std::find(best.begin(), best.end(), i) != best.end()) {
        why = absl::StrCat("the store keeps the best ", up.best, " by validation loss");
      }
      if (!why.empty()) keeps[i].push_back(absl::StrCat("waiting for its upload (", why, ")"));
    }
  }
  if (guard.rollback_distance > 0) {
    const int64_t target = guard.tip_step - guard.rollback_distance;
    for (size_t i : branch) {
      keeps[i].push_back(
          absl::StrCat("in the rollback window (a spike rollback resumes from "
                       "the newest checkpoint at or before step ",
                       std::max<int64_t>(target, 0), ")"));
      if (candidates[i].step <= target) break;  // the window's oldest
    }
  }
  std::vector<bool> on_branch(candidates.size(), false);
  for (size_t i : branch) on_branch[i] = true;
  for (size_t i = 0; i < candidates.size(); ++i) {
    RetentionVerdict& v = verdicts[i];
    if (!keeps[i].empty()) {
      v.keep = true;
      v.reason = absl::StrJoin(keeps[i], "; ");
    } else if (!on_branch[i] && candidates[i].step > guard.tip_step) {
      v.keep = true;
      v.reason = absl::StrCat("on another branch, past the tip at step ", guard.tip_step,
                              " (kept until the current branch passes it)");
    } else if (!on_branch[i]) {
      v.keep = false;
      v.reason = candidates[i].generation < 0
                     ? "its manifest does not read, so it is on no branch"
                     : absl::StrCat("abandoned by a rollback: attempt ", candidates[i].generation,
                                    "'s branch, at or before the tip at step ", guard.tip_step);
    } else {
      v.keep = false;
      std::vector<std::string> not_kept = {absl::StrCat("not among the newest ", policy.newest)};
      if (policy.every > 0) not_kept.push_back(absl::StrCat("not a multiple of ", policy.every));
      if (policy.best > 0) {
        not_kept.push_back(
            candidates[i].val_loss.has_value()
                ? absl::StrCat("not among the best ", policy.best, " by validation loss")
                : "no validation loss");
      }
      if (guard.rollback_distance > 0) not_kept.push_back("older than the rollback window");
      v.reason = absl::StrJoin(not_kept, ", ");
    }
  }
  return verdicts;
}

std::string UploadSettledPath(const std::string& checkpoint_path) {
  const std::filesystem::path p(checkpoint_path);
  return (p.parent_path() / "upload-settled" / p.filename()).string();
}

void MarkUploadSettled(const std::string& checkpoint_path) {
  namespace fs = std::filesystem;
  const fs::path mark(UploadSettledPath(checkpoint_path));
  std::error_code ec;
  fs::create_directories(mark.parent_path(), ec);
  std::ofstream(mark.string()).flush();  // an empty file; its name is the mark
}

bool UploadSettled(const std::string& checkpoint_path) {
  std::error_code ec;
  return std::filesystem::exists(UploadSettledPath(checkpoint_path), ec);
}

std::vector<PrunedDirectory> PruneCheckpoints(const std::string& dir, const RetentionPolicy& policy,
                                              const RetentionGuard& guard) {
  namespace fs = std::filesystem;
  std::vector<PrunedDirectory> deleted;
  if (policy.all) return deleted;
  const std::vector<CheckpointEntry> entries = ListCheckpoints(dir);
  std::vector<RetentionCandidate> candidates;
  for (const CheckpointEntry& entry : entries) {
    RetentionCandidate c{entry.path, entry.step, entry.generation, std::nullopt};
    const bool wants_loss = policy.best > 0 || (guard.upload.has_value() && guard.upload->best > 0);
    if (wants_loss && !entry.legacy) {
      absl::StatusOr<CheckpointManifest> manifest = ReadManifest(entry.path);
      if (manifest.ok() && manifest->state.has_val_loss) c.val_loss = manifest->state.val_loss;
    }
    if (guard.upload.has_value() && !entry.legacy) c.awaiting_upload = !UploadSettled(entry.path);
    candidates.push_back(std::move(c));
  }
  const std::vector<RetentionVerdict> verdicts = PlanRetention(candidates, policy, guard);
  for (size_t i = 0; i < verdicts.size(); ++i) {
    if (verdicts[i].keep) continue;
    const CheckpointEntry& entry = entries[i];
    if (!AppendPruneLog(dir, fs::path(entry.path).filename().string()).ok()) continue;
    DeleteCheckpoint(entry);
    std::error_code ec;
    if (!fs::exists(entry.path, ec) && !ec) {
      deleted.push_back({entry.path, entry.step, verdicts[i].reason});
      fs::remove(UploadSettledPath(entry.path), ec);
    }
  }
  return deleted;
}

}  // namespace loom::engine
