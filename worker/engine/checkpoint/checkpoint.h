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
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/formats/checkpoint_files.h"

namespace loom::engine {

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
// Restore.

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

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_
