// Checkpoint files without LibTorch: the layout of a checkpoint directory,
// listing, retention, the manifest, and verification (checkpoint.h
// describes the format). The controller links this to verify checkpoints
// (`loomctl checkpoints --verify`) without LibTorch; the shard format and
// restore, which need tensors, are in checkpoint.h.
#ifndef LOOM_COMMON_FORMATS_CHECKPOINT_FILES_H_
#define LOOM_COMMON_FORMATS_CHECKPOINT_FILES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/formats/batch_range.h"

namespace loom::engine {

// A branch's history: (generation, first step) pairs in order of increasing
// generation; the first pair starts at step 0. Generation g's checkpoints on
// the branch lie between its first step and the next pair's first step.
using Lineage = std::vector<std::pair<int64_t, int64_t>>;

// The loop state a checkpoint carries besides tensors.
struct TrainingState {
  int64_t step = 0;             // optimizer steps done
  int64_t next_data_batch = 0;  // data batch index to consider next, before
                                // skipping (data cursor / global_batch)
  double loss = 0;              // of the last step
  bool has_val_loss = false;
  double val_loss = 0;          // of the last validation pass
  int64_t generation = 0;
  Lineage lineage;              // ends with this generation
  std::vector<BatchRange> skip_batches;  // sorted, disjoint, non-adjacent
  // fp16 dynamic loss scaler (loss_scaler.h) after this step, so that a
  // resumed run scales as the uninterrupted one would; loss_scale 0: the
  // run has none (fp32, bf16), or the checkpoint predates the field.
  double loss_scale = 0;
  int64_t loss_scale_clean_steps = 0;
  int64_t loss_scale_overflow_steps = 0;
};

// What a restore takes. kResume: everything (the shape checked whole,
// `state`, the moments and step counts, torch's CPU generator).
// kWeights / kWeightsAndOptimizer: a new job started from another's
// checkpoint (TrainerConfig::init_from; parallel/sharded_checkpoint.h): only the model must match; `state`
// and the generator are left as they are, and the optimizer too unless
// kWeightsAndOptimizer.
enum class RestoreScope { kResume, kWeights, kWeightsAndOptimizer };

// What a checkpoint must match to resume a job.
struct CheckpointShape {
  std::string model;      // the engine's ModelFingerprint (checkpoint/model_fingerprint.h)
  int global_batch = 0;
  int world_size = 1;     // of the writer; not checked on load (replicated)
};


// ---------------------------------------------------------------------------
// Layout.

inline constexpr char kManifestFileName[] = "MANIFEST.json";

// <dir>/step-<step, 9 digits>.
std::string CheckpointPath(const std::string& dir, int64_t step);
// Name of rank `rank`'s shard inside a checkpoint directory.
std::string ShardFileName(int rank);
// <dir>/ckpt_<step, 8 digits>.pt: where a version 1/2 checkpoint of `step`
// would be.
std::string LegacyCheckpointPath(const std::string& dir, int64_t step);

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;         // the directory (or, legacy, the file)
  int64_t generation = -1;  // as the manifest (sidecar) says; -1: unreadable
  bool legacy = false;      // a version 1/2 single-file checkpoint
};

// Checkpoints in `dir` in lineage order: generation descending, then step
// descending, then directories before legacy files. Generations come from
// manifests (sidecars) whose own checksum holds; others sort last with
// generation -1. Temporaries and other names are not listed; a missing
// directory has none.
std::vector<CheckpointEntry> ListCheckpoints(const std::string& dir);

// True if `entry` is on the branch whose newest checkpoint is at `tip_step`
// with `lineage` (the tip itself included).
bool IsOnBranch(const CheckpointEntry& entry, const Lineage& lineage, int64_t tip_step);

// Removes what interrupted saves and deletions left in `dir` (step-*.tmp-*
// directories and legacy ckpt_*.tmp.* files). Best effort. Only the process
// that writes `dir` may call it, while it has no save in flight.
void RemoveTemporaries(const std::string& dir);

// Deletes a checkpoint: a directory is first renamed to a temporary name, so
// that it leaves the listing atomically. Best effort.
void DeleteCheckpoint(const CheckpointEntry& entry);

// ---------------------------------------------------------------------------
// Manifest.

struct ManifestFile {
  std::string name;  // inside the checkpoint directory
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  // Lowercase hex SHA-256 of the file, or empty. The writer leaves it out
  // (a CRC-32C guards the fast tier); the object-store upload adds it to
  // the copy of the manifest it uploads, and a download checks it.
  std::string sha256;
};

// Manifest layouts. "replicated": rank 0's shard holds the whole model and
// optimizer (the replicated engine). "sharded": every rank of a tensor /
// pipeline / ZeRO layout wrote a shard of pieces (ShardTensor::begin >= 0)
// that together cover the whole model and optimizer once; the manifest
// records the layout that wrote them (any layout can read them:
// parallel/sharded_checkpoint.h).
inline constexpr char kReplicatedLayout[] = "replicated";
inline constexpr char kShardedLayout[] = "sharded";

struct CheckpointManifest {
  int version = 3;
  std::string layout = kReplicatedLayout;
  // "sharded" only: the writer's layout (data x pipeline x tensor, ZeRO).
  int data_parallel = 1;
  int pipeline_parallel = 1;
  int tensor_parallel = 1;
  int zero_stage = 0;
  CheckpointShape shape;
  TrainingState state;
  std::vector<ManifestFile> files;
};

// The bytes of MANIFEST.json, "manifest_crc32c" included.
std::string SerializeManifest(const CheckpointManifest& manifest);
// DATA_LOSS naming `path` if the checksum does not hold or a field is
// missing; FAILED_PRECONDITION for another format version.
absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view bytes,
                                                 const std::string& path);
// ParseManifest's first check alone: `bytes` end with the manifest_crc32c
// line, written exactly as SerializeManifest writes it (eight lowercase hex
// digits), and it holds the CRC-32C of every byte before it. So any change
// to any byte of a manifest fails here. DATA_LOSS naming `path` otherwise.
absl::Status CheckManifestChecksum(absl::string_view bytes, const std::string& path);
// The manifest of the checkpoint directory `checkpoint_path`, read and
// parsed (ParseManifest's errors; the read's otherwise). Its files are not
// checked: VerifyCheckpoint does that.
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& checkpoint_path);

// ---------------------------------------------------------------------------
// Verification.

// Which check of a checkpoint failed (VerificationFailure::check).
inline constexpr char kCheckMissing[] = "missing";        // a file is absent (the
                                                          // manifest, a listed file,
                                                          // a legacy sidecar)
inline constexpr char kCheckUnreadable[] = "unreadable";  // an I/O error reading it
inline constexpr char kCheckManifestChecksum[] = "manifest_crc32c";  // CheckManifestChecksum
inline constexpr char kCheckManifestContent[] = "manifest_content";  // its checksum holds but
                                          // it is malformed, of another version or layout,
                                          // says another step, or lists no rank-0 shard
inline constexpr char kCheckSize[] = "size";      // a listed file's size is not the manifest's
inline constexpr char kCheckCrc32c[] = "crc32c";  // a listed file's CRC-32C is not the manifest's
inline constexpr char kCheckSha256[] = "sha256";  // a legacy file does not match its sidecar

// Why a checkpoint did not verify: the file that failed and which check.
struct VerificationFailure {
  std::string file;   // its path
  std::string check;  // one of the kCheck* names above
};

// The verified bytes to restore from: rank 0's shard of a directory whose
// manifest's checksum holds and whose every listed file has the listed size
// and CRC-32C, or a legacy file that matches its sidecar. DATA_LOSS naming
// the offending file otherwise (a missing manifest or listed file included).
absl::StatusOr<std::string> ReadVerifiedCheckpoint(const CheckpointEntry& entry);

// A checkpoint whose every file verified (ReadVerifiedCheckpoint's checks).
struct VerifiedCheckpoint {
  std::string path;   // the directory (or legacy file)
  CheckpointManifest manifest;  // a directory's; for a legacy file, default
  bool legacy = false;
  // Replicated layouts and legacy files: rank 0's shard or the file, as
  // ReadVerifiedCheckpoint returns it. Sharded: empty (readers read the
  // pieces they need from the files: parallel/sharded_checkpoint.h).
  std::string bytes;
};
// On failure, `failure` (if not null) says which file and which check; the
// status is DATA_LOSS naming the file (FAILED_PRECONDITION for a manifest of
// another format version or layout).
absl::StatusOr<VerifiedCheckpoint> VerifyCheckpoint(const CheckpointEntry& entry,
                                                    VerificationFailure* failure = nullptr);

// The listing entry of a checkpoint's path (a step directory or a legacy
// file), as ListCheckpoints makes it, with its step from its name; a step
// directory that is gone is still an entry (it verifies as missing its
// manifest). False if the name is not a checkpoint's.
bool CheckpointEntryOfPath(const std::string& path, CheckpointEntry* entry);

}  // namespace loom::engine

#endif  // LOOM_COMMON_FORMATS_CHECKPOINT_FILES_H_
