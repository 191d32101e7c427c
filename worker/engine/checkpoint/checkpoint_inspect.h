// Read-only inspection of a trainer checkpoint, for tools and tests: a
// digest of the model's parameters that is equal for two checkpoints exactly
// when every parameter tensor is bitwise equal (names, shapes, dtypes, bytes),
// whatever else differs between them (step, generation, optimizer state,
// skip list). No LibTorch types in this header.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INSPECT_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INSPECT_H_

#include <string>

#include "absl/status/statusor.h"

namespace loom::engine {

struct ModelDigest {
  std::string sha256;      // hex, over (name, shape, dtype, bytes) in name order
  int64_t tensors = 0;
  int64_t parameters = 0;  // total elements
};

// `path` is a checkpoint directory (step-<9 digits>/, replicated or sharded,
// whose every file is verified against its manifest first; a sharded one's
// parameters are assembled whole), a shard file alone (not verified), or a
// version 1/2 single-file checkpoint. Equal weights give equal digests
// in every format. NOT_FOUND if `path` does not exist; DATA_LOSS if it does
// not verify or is not a readable checkpoint.
absl::StatusOr<ModelDigest> DigestCheckpointModel(const std::string& path);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INSPECT_H_
