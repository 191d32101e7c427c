// The controller's checkpoint catalog: every checkpoint a job's rank 0
// reported committed, and what has become of it since. No gRPC types.
//
// Status of an entry (loom.v1.CheckpointInfo.status):
//   "committed"  reported committed; its directory is there.
//   "pruned"     retention deleted it, as the rank reported with a later
//                commit (CheckpointInfo.pruned; pruned_reason says why).
//   "corrupt"    a rank's load or a verification found a file that fails
//                its check (error, corrupt_file, failed_check say which).
//   "missing"    committed, never reported pruned, and its directory is
//                gone (lost, or deleted by something other than retention).
// The first three are stored; "missing" is derived when listing, so that a
// directory that comes back (a remounted volume) is committed again.
// Apart from the status, remote_url says the object store has a copy
// (until retention deletes it there: remote_pruned_reason).
// Entries are keyed by (step, generation): a step that a later attempt
// rewrote (same path) has one entry per attempt.
//
// Thread-safe: one mutex serialises the read-modify-write of entries (not
// held while Verify reads checkpoints), so a rank's report that arrives
// during a verification is never overwritten by it.
#ifndef LOOM_CONTROLLER_CHECKPOINTS_CHECKPOINT_CATALOG_H_
#define LOOM_CONTROLLER_CHECKPOINTS_CHECKPOINT_CATALOG_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/store/store.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

inline constexpr char kCheckpointCommitted[] = "committed";
inline constexpr char kCheckpointPruned[] = "pruned";
inline constexpr char kCheckpointCorrupt[] = "corrupt";
// A rank's word that its in-memory snapshots are off (CheckpointInfo.error
// says why): an event, never a catalog entry.
inline constexpr char kSnapshotsOff[] = "snapshots_off";
inline constexpr char kCheckpointMissing[] = "missing";
// A worker's report of a checkpoint's upload to the object store
// (CheckpointInfo.remote_url); never a stored status.
inline constexpr char kCheckpointUploaded[] = "uploaded";
inline constexpr char kCheckpointUploadFailed[] = "upload_failed";
inline bool IsUploadOutcome(const loom::v1::CheckpointInfo& c) {
  return c.status() == kCheckpointUploaded || c.status() == kCheckpointUploadFailed;
}

// Re-reads a checkpoint's files and checks them against its manifest, as a
// rank does before resuming from it. Implementations must be safe to call
// from several threads at once.
class CheckpointVerifier {
 public:
  struct Outcome {
    bool ok = false;
    std::string file;     // !ok: the file that failed
    std::string check;    // !ok: which check ("crc32c", "missing", ...)
    std::string message;  // !ok: the error, naming the file
  };
  virtual ~CheckpointVerifier() = default;
  // An error status means the verification could not run (not that the
  // checkpoint is bad).
  virtual absl::StatusOr<Outcome> Verify(const std::string& checkpoint_path) = 0;
};

class CheckpointCatalog {
 public:
  // `store` must outlive the catalog; `verifier` too, and may be null (then
  // Verify is FAILED_PRECONDITION).
  CheckpointCatalog(Store* store, CheckpointVerifier* verifier)
      : store_(store), verifier_(verifier) {}

  // Records a checkpoint a rank reported committed (status "committed";
  // `info.generation` and `time_unix_ms` as the caller sets them), then
  // marks what its `pruned` names pruned (MarkPruned).
  absl::Status RecordCommitted(const std::string& job_id, loom::v1::CheckpointInfo info);

  // Records that the checkpoint at `report.path` (of `report.step`) is
  // also in the object store, at report.remote_url: every entry at that
  // path, or, if the catalog has none (the commit report was lost), a new
  // committed entry from the report. Its status is unchanged: that is the
  // local copy's; a pruned or missing entry with a remote copy can still be
  // restored from the store. Then what the report's `pruned` names from
  // the store is marked gone there (MarkPruned).
  absl::Status RecordUploaded(const std::string& job_id, const loom::v1::CheckpointInfo& report);

  // Records retention's deletions: a "local" one marks the entries at its
  // path "pruned" with its reason (unless the directory is there again: a
  // later commit of that step), a "remote" one clears remote_url of the
  // entries whose copy it was (remote_pruned_reason). Unknown paths are
  // ignored: a checkpoint of an earlier controller, or of a lost report.
  absl::Status MarkPruned(const std::string& job_id,
                          const std::vector<loom::v1::PrunedCheckpoint>& pruned);

  // Records a rank's report that the checkpoint at `report.path` failed
  // verification (status "corrupt", with its error, corrupt_file and
  // failed_check): every entry at that path, or, if the catalog has none
  // (the commit report was lost), a new entry from the report.
  absl::Status MarkCorrupt(const std::string& job_id, const loom::v1::CheckpointInfo& report);

  // The catalog, oldest step first, with each entry's status as above.
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> List(const std::string& job_id);
  // The committed entries with no copy in the object store (none uploaded,
  // none pruned there), newest step first, at most `max`: what a job's next
  // rank 0 is asked to upload (StartRank.pending_uploads). Empty when the
  // catalog cannot be read.
  std::vector<loom::v1::CheckpointInfo> PendingUploads(const std::string& job_id, int max);

  // List, after re-reading the checksums of every committed entry whose
  // directory is there: one that fails is marked corrupt (and stored so).
  // Corrupt is for good: a checkpoint committed again at that path (a
  // rewrite of the step by a later attempt) is an entry of its own.
  // Slow (reads every byte): call it without holding locks others need.
  // FAILED_PRECONDITION without a verifier; the verifier's error if it
  // could not run.
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> Verify(const std::string& job_id);

  // The step of the newest entry at or before `max_step` (-1 = any) that
  // is committed and whose directory is there, or that is not corrupt and
  // has a copy in the object store; 0 if none.
  absl::StatusOr<int64_t> NewestGood(const std::string& job_id, int64_t max_step);
  // NewestGood, 0 also when the catalog cannot be read (a resume point:
  // from scratch rather than from a checkpoint that cannot be vouched for).
  int64_t NewestGoodStep(const std::string& job_id, int64_t max_step) {
    absl::StatusOr<int64_t> newest = NewestGood(job_id, max_step);
    return newest.ok() ? *newest : 0;
  }

 private:
  // The stored entries at report.path, or, if there are none (their commit
  // report was lost), a new one from the report (step, path, generation,
  // bytes, time). Under mu_.
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> EntriesAtLocked(
      const std::string& job_id, const loom::v1::CheckpointInfo& report);

  Store* const store_;
  CheckpointVerifier* const verifier_;  // may be null
  std::mutex mu_;  // serialises read-modify-write of the store's entries
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_CHECKPOINTS_CHECKPOINT_CATALOG_H_
