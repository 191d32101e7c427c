// Trainer checkpoints on disk: layout, manifest, shard format, verification,
// retention and restore. The asynchronous writer is in checkpoint_writer.h.
//
// Layout (format version 3), inside TrainerConfig::checkpoint_dir:
//
//   step-000001200/            a committed checkpoint, one per step
//     shard-00000.bin          rank 0's shard (see "Shards")
//     MANIFEST.json            written last (see "Manifest")
//   step-000001300.tmp-4711/   a save in progress (4711 = writer's pid), or
//                              one a crash interrupted; never read, removed by
//                              RemoveTemporaries (every start) and pruning
//   ckpt_00000900.pt           a version 1/2 checkpoint (one file, with a
//   ckpt_00000900.pt.sha256    sha256sum sidecar): still listed, verified
//                              and loaded, never written
//
// Commit protocol (CheckpointWriter): write every shard and then the manifest
// into step-XXXXXXXXX.tmp-<pid>/, fsync each file and the directory, rename
// the directory to step-XXXXXXXXX (atomically exchanging it with an existing
// one of that step: a rewrite), fsync the parent. A crash at any point leaves
// the committed checkpoints as they were plus, at worst, one .tmp-* directory.
//
// Shards. With pure data parallelism every rank holds an identical replica,
// so only rank 0 has state to save: its shard holds everything (layout
// "replicated") and any world size may load it. The manifest lists shards
// with their rank so that a sharded layout (ZeRO, tensor parallelism) can add
// one shard per rank without changing the format. A shard file is:
//   bytes [0, 8)    magic "LOOMSHRD"
//   bytes [8, 16)   H, little-endian uint64: length of the header
//   bytes [16, 16+H) header: JSON (the TrainingState, CheckpointShape,
//                   optimizer groups and step counts, and the tensor index:
//                   name, dtype, shape, offset, bytes of every tensor)
//   zero padding to data_offset (a multiple of 4096), then the raw tensor
//   bytes (little-endian, contiguous) at 64-byte-aligned offsets from
//   data_offset, zero padding between them and to the end, which is a
//   multiple of 4096 (so that the writer can use O_DIRECT).
// Tensor names: "model/<parameter or buffer name>" (as named_parameters()
// gives them), "optimizer/<parameter name>/<exp_avg|exp_avg_sq|
// max_exp_avg_sq>" (AdamW), and "rng/cpu" (torch's default CPU generator).
// The bytes of a shard are a pure function of the training state, so two
// saves of the same state are bitwise equal.
//
// Manifest. MANIFEST.json holds the job-independent metadata (format,
// version, layout, step, generation, lineage, world size, global batch,
// model shape, loss, validation loss, data cursor, skip list) and every
// file's name, rank, size and CRC-32C. Its last member, "manifest_crc32c",
// is the CRC-32C of every byte before the line that holds it, so a damaged
// manifest is detected before it is believed.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/engine/config.h"

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
  std::string model;      // ModelFingerprint(GptConfig)
  int global_batch = 0;
  int world_size = 1;     // of the writer; not checked on load (replicated)
};

// "n_layer=2,n_head=2,d_model=64,seq_len=64,vocab_size=256".
std::string ModelFingerprint(const GptConfig& config);

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

// Deletes what TrainerConfig's keep_checkpoints / retain_distance_steps do
// not keep, relative to the branch whose newest checkpoint was just written
// at `tip_step` with `lineage`: of that branch the newest `keep` and the
// rollback reserve; of other branches, checkpoints at steps <= tip_step.
// keep <= 0 keeps everything. Best effort, like DeleteCheckpoint. Returns
// the paths of the checkpoints it deleted (gone from `dir` afterwards).
std::vector<std::string> PruneCheckpoints(const std::string& dir, int keep, int64_t retain_distance_steps,
                      const Lineage& lineage, int64_t tip_step);

// ---------------------------------------------------------------------------
// Manifest.

struct ManifestFile {
  std::string name;  // inside the checkpoint directory
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
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

// ---------------------------------------------------------------------------
// Shards.

struct ShardTensor {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the shard's data_offset
  uint64_t bytes = 0;
  // A piece of a sharded checkpoint (begin >= 0): elements [begin, begin +
  // numel) of tensor-parallel partition tp_rank of tp_size of the whole
  // tensor `name`, flattened (partitions as ShardForTensorParallel cuts
  // them; tp_size 1 = the whole tensor). `shape` is then [numel].
  // begin = -1: the tensor itself, whole (replicated shards).
  int tp_rank = 0;
  int tp_size = 1;
  int64_t begin = -1;
};

// One AdamW parameter group: hyper-parameters, and its parameters' names
// with their step counts (-1: no state yet).
struct ShardOptimizerGroup {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool amsgrad = false;
  std::vector<std::string> params;
  std::vector<int64_t> steps;  // parallel to params
};

struct ShardHeader {
  int rank = 0;
  CheckpointShape shape;
  TrainingState state;
  std::vector<ShardOptimizerGroup> optimizer_groups;
  std::vector<ShardTensor> tensors;
  // Where tensor data starts: the header's end rounded up to
  // kShardDataAlignment. Set by SerializeShardPrefix and ParseShard.
  uint64_t data_offset = 0;
};

inline constexpr uint64_t kShardDataAlignment = 4096;
inline constexpr uint64_t kShardTensorAlignment = 64;

// Assigns data_offset and returns the shard's first data_offset bytes
// (magic, length, header, padding); the tensors' offsets must be set.
std::string SerializeShardPrefix(ShardHeader* header);

// True if `bytes` begin like a shard (its magic).
bool IsShard(absl::string_view bytes);

// A shard's header and its tensors' bytes, as views into `bytes` (which
// must outlive it). DATA_LOSS if the shard is malformed.
struct ShardView {
  ShardHeader header;
  std::vector<absl::string_view> data;  // parallel to header.tensors
};
absl::StatusOr<ShardView> ParseShard(absl::string_view bytes);

// A shard's header from its first bytes (at least the magic, the length
// and the header), checked against the shard's size `file_bytes` (every
// tensor must lie inside it). DATA_LOSS if malformed; OUT_OF_RANGE if
// `prefix` is too short to hold the header (read more and retry).
absl::StatusOr<ShardHeader> ParseShardHeader(absl::string_view prefix, uint64_t file_bytes);

// ---------------------------------------------------------------------------
// Verification and restore.

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

// Restores weights, optimizer state, torch's default CPU generator and
// `state` from bytes that ReadVerifiedCheckpoint returned (a shard, or a
// version 1/2 file). `optimizer` must be AdamW over `module`'s parameters,
// grouped as when the checkpoint was written. FAILED_PRECONDITION if the
// checkpoint was written for another model shape or global_batch or
// optimizer grouping; DATA_LOSS if it is malformed; INTERNAL for LibTorch
// errors. On error the module and optimizer may be partly restored.
absl::Status RestoreCheckpoint(absl::string_view bytes, const CheckpointShape& expected,
                               torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                               TrainingState* state);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_H_
