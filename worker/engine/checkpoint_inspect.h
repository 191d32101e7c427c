// Read-only inspection of a trainer checkpoint, for tools and tests: a
// digest of the model's parameters that is equal for two checkpoints exactly
// when every parameter tensor is bitwise equal (names, shapes, dtypes, bytes),
// whatever else differs between them (step, generation, optimizer state,
// skip list). No LibTorch types in this header.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_INSPECT_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_INSPECT_H_

#include <string>

#include "absl/status/statusor.h"

namespace loom::engine {

struct ModelDigest {
  std::string sha256;      // hex, over (name, shape, dtype, bytes) in name order
  int64_t tensors = 0;
  int64_t parameters = 0;  // total elements
};

// NOT_FOUND if the file is missing; DATA_LOSS if it is not a readable
// checkpoint with a "model" archive.
absl::StatusOr<ModelDigest> DigestCheckpointModel(const std::string& path);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_INSPECT_H_
