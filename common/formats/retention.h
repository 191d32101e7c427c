// Checkpoint retention: which checkpoints of one tier (the checkpoint
// directory, or the object store) a job keeps, and why each one stays or
// goes. A pure function of what the tier holds, the job's policy and what
// must never be deleted, so that the rank that prunes its directory, the
// worker that prunes the object store and `loomctl checkpoints gc --dry-run`
// reach the same verdicts with the same words.
//
// The rules, applied to the current branch (the lineage of the newest
// checkpoint, the tip):
//   - kept by the policy: the newest N, each whose step is a multiple of K,
//     and the M of lowest validation loss (as of their step);
//   - always kept: the rollback window (the newest checkpoint at or before
//     tip - rollback_distance and every one after it, which is where a spike
//     rollback resumes from now or as the branch advances) and every held
//     checkpoint (the running attempt's resume point, another job's
//     init_from);
//   - off the branch: a checkpoint at or before the tip was abandoned by a
//     rollback and goes (unless held); a later one is kept for now.
// A policy that keeps everything deletes nothing, on or off the branch.
#ifndef LOOM_COMMON_FORMATS_RETENTION_H_
#define LOOM_COMMON_FORMATS_RETENTION_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/checkpoint_files.h"

namespace loom::engine {

// What one tier keeps. A checkpoint is kept when any rule keeps it.
struct RetentionPolicy {
  bool all = false;   // every checkpoint; the other fields are then moot
  int newest = 3;     // the newest N of the branch (>= 1: what a restart resumes from)
  int64_t every = 0;  // each whose step is a multiple of this; 0: no such rule
  int best = 0;       // the M of lowest validation loss; 0: no such rule
};

// "newest 3, every 1000 steps, best 2 by validation loss" or "every checkpoint".
std::string DescribeRetention(const RetentionPolicy& policy);

// What is never deleted, whatever the policy.
struct RetentionGuard {
  int64_t tip_step = 0;  // the branch's newest checkpoint
  Lineage lineage;       // and its lineage
  // > 0: the spike-rollback window (see the file comment).
  int64_t rollback_distance = 0;
  // step -> why it is held ("the resume point of attempt 3").
  std::map<int64_t, std::string> held;
  // Set when the job names an object store: the store's retention. The
  // uploader lags the saves when the store is slower than the checkpoint
  // interval, and takes the newest first; so that lag never costs the store
  // a checkpoint its retention promises to keep for good, one awaiting its
  // upload that the store keeps beyond its newest N (a multiple of `every`,
  // one of the `best`, or any under `all`) stays in this tier until its
  // upload is settled. Under `all`, at most kMaxHeldForUpload of them (the
  // newest), so that a store outage cannot fill the disk.
  std::optional<RetentionPolicy> upload;
};

inline constexpr int kMaxHeldForUpload = 8;

struct RetentionCandidate {
  std::string name;  // what a deletion removes (a directory, an object prefix)
  int64_t step = 0;
  int64_t generation = -1;  // -1: unknown (its manifest does not read): off every branch
  std::optional<double> val_loss;
  // The job names an object store and this checkpoint's upload is not
  // settled (no UploadSettledPath mark): see RetentionGuard::upload.
  bool awaiting_upload = false;
};

struct RetentionVerdict {
  RetentionCandidate checkpoint;
  bool keep = true;
  // Every rule that keeps it, "; "-joined, or why it goes.
  std::string reason;
  // Set by a pruner whose deletion of a checkpoint that goes failed (it is
  // then still there: keep is true again, `reason` still says why it goes).
  std::string error;
};

// One verdict per candidate, in the candidates' order (lineage order, as
// ListCheckpoints gives: the branch's newest first).
std::vector<RetentionVerdict> PlanRetention(const std::vector<RetentionCandidate>& candidates,
                                            const RetentionPolicy& policy,
                                            const RetentionGuard& guard);

// The mark the worker's uploader leaves once the upload of the checkpoint
// directory `checkpoint_path` is settled (it is in the store, or the store
// refused it for good): <checkpoint dir>/upload-settled/<step-name>. It
// lets the rank's pruner delete a checkpoint RetentionGuard::upload holds.
std::string UploadSettledPath(const std::string& checkpoint_path);
// Best effort: a mark that cannot be written keeps the checkpoint a little
// longer (until a later prune finds it marked), and loses nothing.
void MarkUploadSettled(const std::string& checkpoint_path);
bool UploadSettled(const std::string& checkpoint_path);

// A checkpoint directory that PruneCheckpoints deleted, and why.
struct PrunedDirectory {
  std::string path;
  int64_t step = 0;
  std::string reason;
};

// Deletes from the checkpoint directory `dir` what PlanRetention does not
// keep (validation losses read from the manifests when the policy has a
// `best` rule). Each one is first named in the directory's prune log
// (common/prune_log.h), so that the catalog calls it pruned even if this
// process dies before it reports the deletion; with a guard's `upload`,
// each candidate's awaiting_upload comes from its UploadSettledPath mark,
// and a deleted checkpoint's mark goes with it; what cannot be logged is
// kept. Best effort, like DeleteCheckpoint. Only the claim holder of `dir`
// may call it, after a commit (the guard's tip). Returns what is gone.
std::vector<PrunedDirectory> PruneCheckpoints(const std::string& dir, const RetentionPolicy& policy,
                                              const RetentionGuard& guard);

}  // namespace loom::engine

#endif  // LOOM_COMMON_FORMATS_RETENTION_H_
