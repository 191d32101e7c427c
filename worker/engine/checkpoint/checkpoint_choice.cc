#include "worker/engine/checkpoint/checkpoint_choice.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace loom::engine {
namespace {

// The payload that marks IsNoGoodCheckpoint's status.
constexpr char kNoGoodCheckpointPayload[] = "type.loom.dev/loom.engine.NoGoodCheckpoint";

// Verifies `entry`; on failure appends it to `corrupt` and its reason to
// `found` (for the error message).
absl::StatusOr<VerifiedCheckpoint> VerifyOrReport(const CheckpointEntry& entry,
                                                  std::vector<CorruptCheckpoint>* corrupt,
                                                  std::vector<std::string>* found) {
  VerificationFailure failure;
  absl::StatusOr<VerifiedCheckpoint> verified = VerifyCheckpoint(entry, &failure);
  if (!verified.ok()) {
    corrupt->push_back({entry.step, entry.generation, entry.path, failure.file, failure.check,
                        std::string(verified.status().message())});
    found->push_back(absl::StrCat(entry.path, " (", failure.check, ": ",
                                  verified.status().message(), ")"));
  }
  return verified;
}

}  // namespace

absl::StatusOr<ResumeChoice> ChooseResumeCheckpoint(const ResumeRequest& request,
                                                    std::vector<CorruptCheckpoint>* corrupt) {
  if (request.fence.has_value()) {
    RETURN_IF_ERROR(ClaimCheckpointDir(request.dir, *request.fence,
                                       [&] { RemoveTemporaries(request.dir); }));
  } else {
    RemoveTemporaries(request.dir);
  }
  const std::vector<CheckpointEntry> entries = ListCheckpoints(request.dir);
  ResumeChoice choice;
  for (const CheckpointEntry& entry : entries) {
    choice.fork_generation = std::max(choice.fork_generation, entry.generation + 1);
  }
  if (request.resume_step == 0) {
    choice.fork = !entries.empty();
    return choice;
  }
  auto qualifies = [&](const CheckpointEntry& entry) {
    return request.resume_step < 0 || entry.step <= request.resume_step;
  };
  std::vector<std::string> found;  // for the error message
  // A checkpoint whose manifest (sidecar) cannot be read has generation -1
  // and sorts last: lineage order cannot place it, so a good checkpoint
  // before it would hide it. Check those first, so that each is reported.
  std::vector<bool> rejected(entries.size(), false);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].generation >= 0 || !qualifies(entries[i])) continue;
    // (A manifest that became readable between listing and now is used below.)
    rejected[i] = !VerifyOrReport(entries[i], corrupt, &found).ok();
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const CheckpointEntry& entry = entries[i];
    if (!qualifies(entry)) {
      choice.fork = true;
      found.push_back(absl::StrCat(entry.path, " (generation ", entry.generation,
                                   ", after step ", request.resume_step, ")"));
      continue;
    }
    if (rejected[i]) continue;
    absl::StatusOr<VerifiedCheckpoint> verified = VerifyOrReport(entry, corrupt, &found);
    if (verified.ok()) {
      choice.checkpoint = *std::move(verified);
      return choice;
    }
  }
  if (request.resume_step > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume_step ", request.resume_step,
        ": no checkpoint at or before that step verifies in ", request.dir, "; found ",
        found.empty() ? std::string("none") : absl::StrJoin(found, ", ")));
  }
  choice.fork = false;
  if (entries.empty() || request.allow_start_from_scratch) return choice;
  absl::Status none = absl::DataLossError(absl::StrCat(
      "no checkpoint in ", request.dir, " verifies, so training cannot resume (",
      "recovery.allow_start_from_scratch would start again from step 0); found ",
      absl::StrJoin(found, ", ")));
  none.SetPayload(kNoGoodCheckpointPayload, absl::Cord("1"));
  return none;
}

absl::Status NoGoodCheckpointError(absl::string_view message) {
  absl::Status s = absl::DataLossError(message);
  s.SetPayload(kNoGoodCheckpointPayload, absl::Cord("1"));
  return s;
}

bool IsNoGoodCheckpoint(const absl::Status& status) {
  return absl::IsDataLoss(status) && status.GetPayload(kNoGoodCheckpointPayload).has_value();
}

}  // namespace loom::engine
