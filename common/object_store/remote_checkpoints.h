// Checkpoints in an object store: the remote tier of a job's checkpoints.
// No LibTorch: the worker uploads and restores with this, and the controller
// and loomctl list with it.
//
// Layout under a job's location (CheckpointSpec.remote, e.g.
// s3://bucket/runs/job-42/), mirroring the directory layout:
//   step-000001200/shard-00000.bin   each file of the committed checkpoint,
//   step-000001200/MANIFEST.json     uploaded last: the local manifest with
//                                    every file's SHA-256 added
// A checkpoint exists remotely once its MANIFEST.json does: every file it
// lists was uploaded whole before it (a large file as a multipart upload,
// which appears at once when completed). So a half-uploaded checkpoint is
// never listed, and a listed one can be verified object by object.
#ifndef LOOM_COMMON_OBJECT_STORE_REMOTE_CHECKPOINTS_H_
#define LOOM_COMMON_OBJECT_STORE_REMOTE_CHECKPOINTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/checkpoint_files.h"
#include "common/formats/retention.h"
#include "common/object_store/s3_client.h"
#include "common/object_store/s3_config.h"

namespace loom::object_store {

struct TransferOptions {
  // Files larger than this go as multipart uploads of parts this size (S3
  // wants parts of 5 MiB or more but the last).
  uint64_t part_bytes = 16ull << 20;
  int threads = 2;  // files transferred at once
  // Parts of one file sent at once: a file is read and checksummed in
  // order, and each part read is sent while the next is read, up to this
  // many in flight. Memory per file being uploaded: parts_in_flight + 1
  // parts. A restore fetches a file larger than part_bytes the same way:
  // this many ranged GETs at once, checksummed and written in order.
  int parts_in_flight = 4;
};

struct TransferReport {
  std::string url;  // the checkpoint's remote location (s3://.../step-N)
  int64_t step = 0;
  uint64_t bytes = 0;  // of the files (the manifest not counted)
  int objects = 0;     // the manifest included
  double seconds = 0;
};

// The remote location of a checkpoint directory's step.
S3Location RemoteCheckpointLocation(const S3Location& job, int64_t step);

// Uploads the committed checkpoint directory `checkpoint_dir` (step-N) under
// `job`: every file its manifest lists, then the manifest with the files'
// SHA-256. Each file is read once: its size and CRC-32C must match the
// local manifest (DATA_LOSS naming the file if not: a corrupt local copy is
// never uploaded), and its SHA-256 is taken on the way. An upload that
// fails leaves no manifest, so nothing half-uploaded is listed; its
// multipart uploads are aborted. The client's errors otherwise (with the
// object's name).
absl::StatusOr<TransferReport> UploadCheckpoint(S3Client& client, const S3Location& job,
                                                const std::string& checkpoint_dir,
                                                const TransferOptions& options = {});

struct RemoteCheckpoint {
  int64_t step = 0;
  std::string url;  // s3://.../step-N
  engine::CheckpointManifest manifest;
};

// The checkpoints under `job` whose manifest is there and reads (its own
// checksum holds), in lineage order as ListCheckpoints orders a directory:
// generation descending, then step descending. A manifest that does not
// read is left out and named in `unreadable` (if not null).
absl::StatusOr<std::vector<RemoteCheckpoint>> ListRemoteCheckpoints(
    S3Client& client, const S3Location& job, std::vector<std::string>* unreadable = nullptr);

// Downloads `remote` into `dir` as step-N, the way a save commits: into a
// temporary directory, every file checked against the manifest (size,
// SHA-256 where the manifest has it, CRC-32C) before anything is renamed,
// each fsynced, then the directory renamed into place and `dir` fsynced.
// ALREADY_EXISTS if `dir` already has step-N (nothing is touched);
// DATA_LOSS naming the object whose bytes do not match (the temporary
// directory is removed); the client's errors.
absl::StatusOr<TransferReport> DownloadCheckpoint(S3Client& client, const RemoteCheckpoint& remote,
                                                  const std::string& dir,
                                                  const TransferOptions& options = {});

// What a resume needs from the object store, before the rank chooses its
// checkpoint in `dir` (ChooseResumeCheckpoint): the newest remote
// checkpoint in lineage order (at or before `resume_step` when it is > 0)
// is downloaded into `dir` unless `dir` has one at least as new in lineage
// order that verifies. A local copy of that same step that does not verify
// is moved aside (a temporary name the next start removes) and replaced.
// resume_step 0 (start from scratch) reads nothing. Returns the download's
// report (step 0: nothing was needed or there was nothing remote);
// `*note` (not null) says what was decided, for the rank's log.
absl::StatusOr<TransferReport> RestoreFromRemote(S3Client& client, const S3Location& job,
                                                 const std::string& dir, int64_t resume_step,
                                                 std::string* note,
                                                 const TransferOptions& options = {});

// Deletes the remote checkpoint of `step` under `job`: its manifest first,
// so that it stops being listed at once (a checkpoint exists remotely only
// while its manifest does), then every other object under it. OK if it
// was not there.
absl::Status DeleteRemoteCheckpoint(S3Client& client, const S3Location& job, int64_t step);

// What the object store keeps of a job (CheckpointSpec.retention.remote).
struct RemoteRetention {
  engine::RetentionPolicy policy = {/*all=*/true};  // default: every checkpoint
  int64_t rollback_window = 0;                      // RetentionGuard::rollback_distance
  std::map<int64_t, std::string> held;              // RetentionGuard::held
};

// PlanRetention over the checkpoints listed under `job` (candidates named
// by their s3:// location; validation losses from their manifests), the tip
// being the newest listed in lineage order. With `apply`, each one that
// goes is deleted (DeleteRemoteCheckpoint); one whose deletion fails is
// returned kept, with the error (the next prune tries again). The
// verdicts in lineage order; the listing's errors.
absl::StatusOr<std::vector<engine::RetentionVerdict>> PruneRemoteCheckpoints(
    S3Client& client, const S3Location& job, const RemoteRetention& retention, bool apply);

// RestoreFromRemote under `job_url` with the store's configuration from the
// process environment (s3_config.h), as `loom-ckpt fetch` runs it for rank 0
// before it resumes: a line saying what was done, or an error saying why
// nothing was restored (no credentials, an unreachable store, a copy that
// fails its checks), after which the resume goes on with what the
// directory has.
absl::StatusOr<std::string> RestoreForResume(const std::string& job_url, const std::string& dir,
                                             int64_t resume_step);

// One remote checkpoint, by its location (s3_config.h ParseCheckpointUrl), into
// `dir` as step-N, checked as DownloadCheckpoint checks (a job started from
// another job's checkpoint in the store: init_from). If `dir` already has
// step-N and it verifies, nothing is read; a copy there that does not verify
// is replaced. NOT_FOUND naming the location when its manifest is not
// there (never uploaded whole, or deleted); the client's errors.
absl::StatusOr<TransferReport> FetchCheckpoint(S3Client& client, absl::string_view url,
                                               const std::string& dir,
                                               const TransferOptions& options = {});

// FetchCheckpoint with the store's configuration from the process
// environment, as `loom-ckpt fetch s3://.../step-N DIR` runs it for rank 0
// of a job whose init_from is in the store: a line saying what was done,
// or the error.
absl::StatusOr<std::string> FetchForInit(const std::string& url, const std::string& dir);

}  // namespace loom::object_store

#endif  // LOOM_COMMON_OBJECT_STORE_REMOTE_CHECKPOINTS_H_
