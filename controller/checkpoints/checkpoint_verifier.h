// The controller's CheckpointVerifier: the engine's own verification of a
// checkpoint's files (common/formats/checkpoint_files.h: the manifest's
// checksum, every listed file's size and CRC-32C, a legacy file's sidecar),
// exactly as a rank checks them at load, linked without LibTorch, so that it
// runs wherever the controller does (its image carries no LibTorch). The
// checkpoint directories must be reachable at the same paths from the
// controller's host (as JobManager already assumes when it lists them; the
// Kubernetes manifests mount the shared volume in both).
#ifndef LOOM_CONTROLLER_CHECKPOINTS_CHECKPOINT_VERIFIER_H_
#define LOOM_CONTROLLER_CHECKPOINTS_CHECKPOINT_VERIFIER_H_

#include <string>

#include "absl/status/statusor.h"
#include "controller/checkpoints/checkpoint_catalog.h"

namespace loom::controller {

class FileCheckpointVerifier : public CheckpointVerifier {
 public:
  // Thread-safe (no state). Reads every byte of the checkpoint on the
  // calling thread.
  // INVALID_ARGUMENT if `checkpoint_path` does not name a checkpoint
  // (step-<9 digits> or ckpt_<8 digits>.pt); a verdict otherwise.
  absl::StatusOr<Outcome> Verify(const std::string& checkpoint_path) override;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_CHECKPOINTS_CHECKPOINT_VERIFIER_H_
