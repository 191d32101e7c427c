// Sharded checkpoints: every rank of a tensor /
// pipeline / ZeRO layout writes only what it alone holds, in parallel, and
// any layout (the replicated engine included) reads any checkpoint back.
//
// What a rank (dp, pp, tp) writes, as pieces (ShardTensor::begin >= 0) of
// the whole model's tensors, so that every element is written exactly once
// (but for copied key/value heads):
//   * weights: the ranks of data replica 0 write their tensor-parallel
//     partition of their stage's parameters; a parameter replicated over
//     the tensor group only from tp rank 0; the tied wte only from the
//     first stage (the last stage's copy is bit-identical to it). A
//     partition of c_attn is written whole, so key/value heads copied to
//     several ranks (tensor_parallel.h, KeyValueCopies) are written by each;
//     reading takes the first copy (MergeTensorParallelShards);
//   * AdamW moments: under ZeRO 0 as the weights (replica 0); under ZeRO 1
//     and 2 every data rank writes the part of each partition that falls
//     into its shard of the flat index space (sharded_adamw.h);
//   * torch's CPU generator: world rank 0.
// The manifest (checkpoint.h, layout "sharded") records the layout and
// every rank's shard file with its size and CRC-32C; it is written last, by
// world rank 0, after every rank's shard is in the shared temporary
// directory, so a checkpoint commits for all ranks or for none. The
// checkpoint directory must therefore be shared by the ranks (a network
// filesystem across nodes).
//
// Reading: CheckpointReader indexes every shard's header and reads the
// pieces of one whole tensor at a time (pread), merging tensor-parallel
// partitions (MergeTensorParallelShards), so restoring holds at most one
// whole tensor besides the rank's own state. Replicated checkpoints (rank
// 0's whole shard) read through the same interface.
#ifndef LOOM_WORKER_ENGINE_PARALLEL_SHARDED_CHECKPOINT_H_
#define LOOM_WORKER_ENGINE_PARALLEL_SHARDED_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/parallel/parallel_gpt.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/parallel/sharded_adamw.h"

namespace loom::engine {

// This rank's shard of a sharded checkpoint (see the file comment). The
// sources are views of the live parameters and moments: the writer copies
// them before the next optimizer step (CheckpointWriter::WaitForSnapshot).
ShardContents LayoutShardContents(const ShardedAdamW& optimizer, const ParallelGroups& groups,
                                  const OptimizerConfig& config);

// The manifest fields that describe `groups`' layout (layout "sharded").
CheckpointManifest ShardedLayoutOf(const ParallelGroups& groups, int zero_stage);

// Reads whole tensors out of a verified checkpoint directory (sharded or
// replicated). Thread-compatible; holds no file open between calls.
class CheckpointReader {
 public:
  // Reads the manifest and every shard's header of the checkpoint directory
  // `path`. DATA_LOSS if a header is malformed or a piece's tensor-parallel
  // degree disagrees with another's; FAILED_PRECONDITION for a legacy file.
  static absl::StatusOr<CheckpointReader> Open(const std::string& path,
                                               const GptConfig& config);

  const CheckpointManifest& manifest() const { return manifest_; }

  // True if the checkpoint holds (pieces of) tensor `name`.
  bool Has(const std::string& name) const { return index_.count(name) > 0; }

  // The whole tensor `name` ("model/h.0.attn.c_attn.weight",
  // "optimizer/wte.weight/exp_avg", "rng/cpu"), shaped `shape` and typed
  // `dtype`. NOT_FOUND if the checkpoint has none of it; FAILED_PRECONDITION
  // if it has another shape or dtype; DATA_LOSS if its pieces do not cover it
  // exactly once; INTERNAL for read errors.
  absl::StatusOr<torch::Tensor> Whole(const std::string& name, const std::vector<int64_t>& shape,
                                      torch::ScalarType dtype = torch::kFloat) const;

  // The AdamW step count recorded for parameter `name`; -1 when it has no
  // optimizer state (no step taken, or absent).
  int64_t StepOf(const std::string& name) const;

 private:
  struct Piece {
    int file = 0;          // index into files_
    uint64_t offset = 0;   // of its bytes in the file
    ShardTensor tensor;
  };
  CheckpointReader() = default;
  absl::Status ReadPiece(const Piece& piece, void* out) const;

  GptConfig config_;
  CheckpointManifest manifest_;
  std::vector<std::string> files_;                 // paths
  std::map<std::string, std::vector<Piece>> index_;
  std::map<std::string, int64_t> steps_;
};

// Checks the checkpoint against `expected` (model and global_batch, as
// RestoreCheckpoint does) and sets `state` from its manifest.
absl::Status CheckShapeAndReadState(const CheckpointReader& reader,
                                    const CheckpointShape& expected, TrainingState* state);

// Restores a layout rank's parameters, moments, step count and torch's CPU
// generator (every rank takes world rank 0's), and `state`. Errors as
// CheckpointReader::Whole and CheckShapeAndReadState.
absl::Status RestoreLayoutRank(const CheckpointReader& reader, const CheckpointShape& expected,
                               ParallelGptImpl& model, ShardedAdamW& optimizer,
                               TrainingState* state, RestoreScope scope = RestoreScope::kResume);

// Restores a whole Gpt and its AdamW (MakeAdamW's or MakeFusedAdamW's groups,
// hyper-parameters as configured) from any checkpoint the reader reads: the
// replicated engine resuming a layout's checkpoint.
absl::Status RestoreWholeModel(const CheckpointReader& reader, const CheckpointShape& expected,
                               torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                               TrainingState* state,
                               RestoreScope scope = RestoreScope::kResume);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_SHARDED_CHECKPOINT_H_
