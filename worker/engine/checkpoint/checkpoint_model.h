// A checkpoint's model, whole, for tools that use the weights rather than
// resume training: `loomctl sample` (loom-ckpt sample) and export. Defined
// in checkpoint_inspect.cc.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_MODEL_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_MODEL_H_

#include <cstdint>
#include <map>
#include <string>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "worker/engine/config.h"
#include "worker/engine/gpt.h"

namespace loom::engine {

struct CheckpointModel {
  GptConfig config;  // from the manifest's model fingerprint
  int64_t step = 0;
  // Every parameter, whole (a sharded checkpoint's pieces assembled), fp32,
  // CPU, by the replicated model's names ("wte.weight", "h.0.ln_1.weight").
  std::map<std::string, torch::Tensor> parameters;
};

// The checkpoint directory `path` (step-<9 digits>/, replicated or sharded),
// every file verified against its manifest first. NOT_FOUND if it is not a
// directory; DATA_LOSS if it does not verify or cannot be read.
absl::StatusOr<CheckpointModel> LoadCheckpointModel(const std::string& path);

// A Gpt of the checkpoint's config holding its parameters, in eval mode.
// FAILED_PRECONDITION when a name or shape does not match the model.
absl::StatusOr<Gpt> BuildCheckpointModel(const CheckpointModel& checkpoint);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_MODEL_H_
