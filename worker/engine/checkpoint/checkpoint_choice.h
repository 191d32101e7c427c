// Where a run resumes: the choice of checkpoint that rank 0 makes before
// training (TrainerConfig::resume_step), and the checkpoints it found
// corrupt on the way. No LibTorch types beyond checkpoint.h's.
//
// Honest checkpoints: a checkpoint that does not verify is never
// skipped in silence. Every one the choice reads and rejects is reported
// (CorruptCheckpoint: which file, which check), and the choice falls back to
// the next checkpoint in lineage order. When checkpoints exist but none
// verifies, the run does not quietly start again from step 0: that is an
// error (IsNoGoodCheckpoint) unless the job allows it.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_CHOICE_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_CHOICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_fence.h"
#include "worker/engine/checkpoint/checkpoint_report.h"  // CorruptCheckpoint

namespace loom::engine {

struct ResumeRequest {
  std::string dir;           // TrainerConfig::checkpoint_dir (non-empty)
  int64_t resume_step = -1;  // TrainerConfig::resume_step
  // resume_step -1 only: when checkpoints exist and none verifies, start
  // from scratch (reporting them) instead of failing.
  bool allow_start_from_scratch = false;
  // Set: the directory is claimed for this attempt first (checkpoint_fence.h),
  // and the clean-up runs under the claim; a newer attempt's claim fails the
  // choice with IsCheckpointFenced before anything is read or removed.
  std::optional<FenceToken> fence;
};

struct ResumeChoice {
  std::optional<VerifiedCheckpoint> checkpoint;  // none = from scratch
  // Checkpoints newer than resume_step were passed over: the run is a new
  // branch, of generation >= fork_generation (1 + the highest in the dir).
  bool fork = false;
  int64_t fork_generation = 0;
};

// Claims `request.dir` if request.fence is set, removes what interrupted
// saves left there (RemoveTemporaries),
// lists its checkpoints and verifies them in lineage order until one
// qualifies (step <= resume_step when resume_step > 0) and verifies.
// Appends to `corrupt` (not null) every checkpoint it rejected for failing
// verification, also on error: those tried before the chosen one, and every
// one whose manifest is unreadable (which lineage order cannot place, so it
// is checked whatever else verifies). resume_step 0 reads nothing.
// Errors: FAILED_PRECONDITION if resume_step > 0 and no checkpoint at or
// before it verifies; DATA_LOSS (IsNoGoodCheckpoint) if resume_step is -1,
// checkpoints exist and none verifies, and !allow_start_from_scratch. Both
// messages list every checkpoint found and why it was not used.
absl::StatusOr<ResumeChoice> ChooseResumeCheckpoint(const ResumeRequest& request,
                                                    std::vector<CorruptCheckpoint>* corrupt);

// True for ChooseResumeCheckpoint's DATA_LOSS "no checkpoint verifies": the
// job's checkpoints are all corrupt, and restarting cannot help.
bool IsNoGoodCheckpoint(const absl::Status& status);
// A DATA_LOSS status IsNoGoodCheckpoint recognizes: a checkpoint training
// needs cannot be used, and restarting cannot help (also init_from's).
absl::Status NoGoodCheckpointError(absl::string_view message);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_CHOICE_H_
