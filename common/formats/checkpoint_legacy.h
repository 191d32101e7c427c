// Reading checkpoints of formats 1 and 2 (one torch::serialize archive per
// checkpoint, <dir>/ckpt_<8 digits>.pt, with a sha256sum sidecar .sha256;
// version 2 adds a "# loom generation=G step=S" line to the sidecar). Loom
// no longer writes them; checkpoint_files.cc lists and verifies them
// through these functions, and checkpoint_restore.cc restores them. Internal
// to the checkpoint library. No LibTorch.
#ifndef LOOM_COMMON_FORMATS_CHECKPOINT_LEGACY_H_
#define LOOM_COMMON_FORMATS_CHECKPOINT_LEGACY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/formats/checkpoint_files.h"

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

}  // namespace loom::engine::legacy_checkpoint

#endif  // LOOM_COMMON_FORMATS_CHECKPOINT_LEGACY_H_
