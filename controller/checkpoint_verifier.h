// The controller's CheckpointVerifier: runs `loom-ckpt verify PATH` (the
// engine's own verification, worker/ckpt_main.cc) in a child process, so
// that the controller checks checkpoints exactly as a rank does at load
// without linking LibTorch. The checkpoint directories must be reachable at
// the same paths from the controller's host (as JobManager already assumes
// when it lists them).
#ifndef LOOM_CONTROLLER_CHECKPOINT_VERIFIER_H_
#define LOOM_CONTROLLER_CHECKPOINT_VERIFIER_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "controller/checkpoint_catalog.h"

namespace loom::controller {

class ToolCheckpointVerifier : public CheckpointVerifier {
 public:
  // `tool` is the loom-ckpt executable's path. Thread-safe (one child per
  // call).
  explicit ToolCheckpointVerifier(std::string tool) : tool_(std::move(tool)) {}

  // INTERNAL if the tool cannot be started, is killed, or answers anything
  // but one well-formed line; a verdict otherwise.
  absl::StatusOr<Outcome> Verify(const std::string& checkpoint_path) override;

 private:
  const std::string tool_;
};

// Parses loom-ckpt verify's line for `checkpoint_path` (tab-separated:
// "ok PATH" or "corrupt PATH FILE CHECK MESSAGE"). INTERNAL if malformed.
absl::StatusOr<CheckpointVerifier::Outcome> ParseVerifyLine(const std::string& line,
                                                            const std::string& checkpoint_path);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_CHECKPOINT_VERIFIER_H_
