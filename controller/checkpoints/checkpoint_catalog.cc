#include "controller/checkpoints/checkpoint_catalog.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/prune_log.h"

namespace loom::controller {
namespace {

bool OnDisk(const std::string& path) { return !path.empty() && access(path.c_str(), F_OK) == 0; }

// Stored "committed" (or by a Loom that stored no status).
bool StoredCommitted(const loom::v1::CheckpointInfo& info) {
  return info.status().empty() || info.status() == kCheckpointCommitted;
}

// The status a stored entry is listed with.
std::string ListedStatus(const loom::v1::CheckpointInfo& info) {
  if (info.status() == kCheckpointPruned || info.status() == kCheckpointCorrupt) {
    return info.status();
  }
  if (OnDisk(info.path())) return kCheckpointCommitted;
  // Gone: pruned by retention if its directory's prune log says so (the
  // pruning rank may have died before its report arrived), else missing.
  const std::filesystem::path path(info.path());
  absl::StatusOr<std::set<std::string>> pruned = ReadPruneLog(path.parent_path().string());
  if (pruned.ok() && pruned->count(path.filename().string())) return kCheckpointPruned;
  return kCheckpointMissing;
}

}  // namespace

absl::Status CheckpointCatalog::RecordCommitted(const std::string& job_id,
                                                loom::v1::CheckpointInfo info) {
  info.set_status(kCheckpointCommitted);
  info.clear_error();
  info.clear_corrupt_file();
  info.clear_failed_check();
  std::vector<loom::v1::PrunedCheckpoint> pruned(info.pruned().begin(), info.pruned().end());
  info.clear_pruned();  // what this commit pruned is recorded on those entries
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A commit reported again (a retried report) keeps the upload recorded
    // since.
    absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> entries = store_->LoadCheckpoints(job_id);
    if (!entries.ok()) return entries.status();
    for (const loom::v1::CheckpointInfo& e : *entries) {
      if (e.step() == info.step() && e.generation() == info.generation() &&
          e.path() == info.path() && !e.remote_url().empty()) {
        info.set_remote_url(e.remote_url());
        info.set_upload_seconds(e.upload_seconds());
      }
    }
    absl::Status s = store_->PutCheckpoint(job_id, info);
    if (!s.ok()) return s;
  }
  return MarkPruned(job_id, pruned);
}

absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> CheckpointCatalog::EntriesAtLocked(
    const std::string& job_id, const loom::v1::CheckpointInfo& report) {
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> entries = store_->LoadCheckpoints(job_id);
  if (!entries.ok()) return entries.status();
  std::vector<loom::v1::CheckpointInfo> at;
  for (loom::v1::CheckpointInfo& info : *entries) {
    if (info.path() == report.path()) at.push_back(std::move(info));
  }
  if (at.empty()) {
    loom::v1::CheckpointInfo info;
    info.set_step(report.step());
    info.set_path(report.path());
    info.set_generation(report.generation());
    info.set_bytes(report.bytes());
    info.set_time_unix_ms(report.time_unix_ms());
    at.push_back(std::move(info));
  }
  return at;
}

absl::Status CheckpointCatalog::RecordUploaded(const std::string& job_id,
                                               const loom::v1::CheckpointInfo& report) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> changed = EntriesAtLocked(job_id, report);
    if (!changed.ok()) return changed.status();
    for (loom::v1::CheckpointInfo& info : *changed) {
      if (info.status().empty()) info.set_status(kCheckpointCommitted);  // a lost commit report
      info.set_remote_url(report.remote_url());
      info.set_upload_seconds(report.upload_seconds());
      info.clear_remote_pruned_reason();
    }
    if (absl::Status s = store_->PutCheckpoints(job_id, *changed); !s.ok()) return s;
  }
  return MarkPruned(job_id, {report.pruned().begin(), report.pruned().end()});
}

absl::Status CheckpointCatalog::MarkPruned(const std::string& job_id,
                                           const std::vector<loom::v1::PrunedCheckpoint>& pruned) {
  if (pruned.empty()) return absl::OkStatus();
  std::map<std::string, std::string> local, remote;  // path -> reason
  for (const loom::v1::PrunedCheckpoint& p : pruned) {
    (p.tier() == "remote" ? remote : local)[p.path()] = p.reason();
  }
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> entries = store_->LoadCheckpoints(job_id);
  if (!entries.ok()) return entries.status();
  std::vector<loom::v1::CheckpointInfo> changed;
  for (loom::v1::CheckpointInfo& info : *entries) {
    bool change = false;
    auto l = local.find(info.path());
    // A directory that a later commit of the same step replaced is the new
    // checkpoint, not the pruned one: only what is no longer there was pruned.
    if (l != local.end() && info.status() != kCheckpointPruned && !OnDisk(info.path())) {
      info.set_status(kCheckpointPruned);
      info.set_pruned_reason(l->second);
      change = true;
    }
    auto r = remote.find(info.remote_url());
    if (!info.remote_url().empty() && r != remote.end()) {
      info.clear_remote_url();
      info.set_remote_pruned_reason(r->second);
      change = true;
    }
    if (change) changed.push_back(std::move(info));
  }
  return store_->PutCheckpoints(job_id, changed);
}

absl::Status CheckpointCatalog::MarkCorrupt(const std::string& job_id,
                                            const loom::v1::CheckpointInfo& report) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> changed = EntriesAtLocked(job_id, report);
  if (!changed.ok()) return changed.status();
  for (loom::v1::CheckpointInfo& info : *changed) {
    info.set_status(kCheckpointCorrupt);
    info.set_error(report.error());
    info.set_corrupt_file(report.corrupt_file());
    info.set_failed_check(report.failed_check());
  }
  return store_->PutCheckpoints(job_id, *changed);
}

absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> CheckpointCatalog::List(
    const std::string& job_id) {
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> entries = store_->LoadCheckpoints(job_id);
  if (!entries.ok()) return entries.status();
  for (loom::v1::CheckpointInfo& info : *entries) info.set_status(ListedStatus(info));
  return entries;
}

std::vector<loom::v1::CheckpointInfo> CheckpointCatalog::PendingUploads(const std::string& job_id,
                                                                        int max) {
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> entries = store_->LoadCheckpoints(job_id);
  std::vector<loom::v1::CheckpointInfo> out;
  if (!entries.ok()) return out;
  for (loom::v1::CheckpointInfo& info : *entries) {
    if (StoredCommitted(info) && info.remote_url().empty() && info.remote_pruned_reason().empty()) {
      out.push_back(std::move(info));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const loom::v1::CheckpointInfo& a, const loom::v1::CheckpointInfo& b) {
                     return a.step() > b.step();
                   });
  if (static_cast<int>(out.size()) > max) out.resize(max);
  return out;
}

absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> CheckpointCatalog::Verify(
    const std::string& job_id) {
  if (verifier_ == nullptr) {
    return absl::FailedPreconditionError("this controller has no checkpoint verifier");
  }
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> entries = store_->LoadCheckpoints(job_id);
  if (!entries.ok()) return entries.status();
  // Verified without the lock (it reads every byte): path -> failure.
  std::map<std::string, CheckpointVerifier::Outcome> failed;
  std::set<std::string> checked;
  for (const loom::v1::CheckpointInfo& info : *entries) {
    if (!StoredCommitted(info) || !OnDisk(info.path())) continue;
    if (!checked.insert(info.path()).second) continue;  // a rewritten step: one directory
    absl::StatusOr<CheckpointVerifier::Outcome> outcome = verifier_->Verify(info.path());
    if (!outcome.ok()) {
      return absl::Status(outcome.status().code(),
                          absl::StrCat("verifying ", info.path(), ": ", outcome.status().message()));
    }
    if (!outcome->ok) failed[info.path()] = *std::move(outcome);
  }
  {
    // Applied to the catalog as it is now: a report that arrived meanwhile
    // (pruned, corrupt) is not overwritten.
    std::lock_guard<std::mutex> lock(mu_);
    entries = store_->LoadCheckpoints(job_id);
    if (!entries.ok()) return entries.status();
    std::vector<loom::v1::CheckpointInfo> changed;
    for (loom::v1::CheckpointInfo& info : *entries) {
      auto it = failed.find(info.path());
      if (it == failed.end() || !StoredCommitted(info)) continue;
      info.set_status(kCheckpointCorrupt);
      info.set_error(it->second.message);
      info.set_corrupt_file(it->second.file);
      info.set_failed_check(it->second.check);
      changed.push_back(std::move(info));
    }
    absl::Status s = store_->PutCheckpoints(job_id, changed);
    if (!s.ok()) return s;
  }
  return List(job_id);
}

absl::StatusOr<int64_t> CheckpointCatalog::NewestGood(const std::string& job_id,
                                                      int64_t max_step) {
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> entries = List(job_id);
  if (!entries.ok()) return entries.status();
  int64_t newest = 0;
  for (const loom::v1::CheckpointInfo& info : *entries) {
    if (max_step >= 0 && info.step() > max_step) continue;
    // Restorable: its directory is there, or its copy in the object store
    // (a rank restores from there what the directory lost).
    const bool remote = !info.remote_url().empty() && info.status() != kCheckpointCorrupt;
    if (info.status() != kCheckpointCommitted && !remote) continue;
    newest = std::max(newest, info.step());
  }
  return newest;
}

}  // namespace loom::controller
