#include "controller/checkpoints/checkpoint_verifier.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/formats/checkpoint_files.h"

namespace loom::controller {

absl::StatusOr<CheckpointVerifier::Outcome> FileCheckpointVerifier::Verify(
    const std::string& checkpoint_path) {
  engine::CheckpointEntry entry;
  if (!engine::CheckpointEntryOfPath(checkpoint_path, &entry)) {
    return absl::InvalidArgumentError(absl::StrCat(
        checkpoint_path, " is not a checkpoint (step-<9 digits> or ckpt_<8 digits>.pt)"));
  }
  engine::VerificationFailure failure;
  const absl::StatusOr<engine::VerifiedCheckpoint> verified =
      engine::VerifyCheckpoint(entry, &failure);
  Outcome outcome;
  if (verified.ok()) {
    outcome.ok = true;
    return outcome;
  }
  outcome.file = failure.file;
  outcome.check = failure.check;
  outcome.message = std::string(verified.status().message());
  return outcome;
}

}  // namespace loom::controller
