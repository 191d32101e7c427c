// Reading checkpoints of formats 1 and 2 (one torch::serialize archive per
// checkpoint, <dir>/ckpt_<8 digits>.pt, with a sha256sum sidecar .sha256;
// version 2 adds a "# loom generation=G step=S" line to the sidecar). Loom
// no longer writes them; checkpoint.cc lists, verifies and restores them
// through these functions. Internal to the checkpoint library.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_LEGACY_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_LEGACY_H_

#include <cstdint>
#include <string>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/engine/checkpoint.h"

namespace loom::engine::legacy_checkpoint {

// The step of a checkpoint file name ("ckpt_" + digits + ".pt"), or -1.
int64_t StepOfFileName(absl::string_view name);

// True for the temporary files that version 1/2 writes left ("ckpt_*.tmp.*").
bool IsTemporaryName(absl::string_view name);

std::string SidecarPath(const std::string& checkpoint_path);

// The generation the sidecar records: 0 if it has no generation line
// (format 1), -1 if it cannot be read or the line does not parse.
int64_t SidecarGeneration(const std::string& checkpoint_path);

// The file's bytes if its sidecar exists and matches them; DATA_LOSS naming
// the file (or the sidecar) otherwise.
absl::StatusOr<std::string> ReadVerified(const std::string& path);

// Restores from a version 1 or 2 archive; see RestoreCheckpoint. May throw
// c10::Error.
absl::Status Restore(absl::string_view bytes, const CheckpointShape& expected,
                     torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                     TrainingState* state);

}  // namespace loom::engine::legacy_checkpoint

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_LEGACY_H_
