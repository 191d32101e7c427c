// Fencing of a checkpoint directory between the attempts of a job.
// No LibTorch.
//
// Why. The controller fences a stale attempt's reports, and a worker that
// loses its lease stops its ranks, but the checkpoint directory is shared
// storage that neither guard covers: a rank that is frozen, slow to die or
// cut off in a way its worker did not notice could still commit, prune or
// clean up after the next attempt has started in the same directory. So the
// directory itself holds a fencing token (Kleppmann's argument: the storage
// checks the token, not the writer's belief that it still holds the lock).
//
// On disk, inside the checkpoint directory:
//   FENCE        "loom-fence 1\n<owner>\n<attempt>\n": the claim in force
//                (owner: the job's id; attempt: its attempt generation,
//                which the controller persists and only increases)
//   FENCE.lock   empty; flock(2)ed around every check-and-act below, so a
//                claim and a commit never interleave
//
// Rules:
//   * an attempt claims the directory before it reads or cleans it (at
//     start, ClaimCheckpointDir); a claim is refused if the same owner's
//     newer attempt holds the directory; another owner's claim is taken
//     over (the controller keeps two live jobs from sharing a directory);
//   * every commit, prune and clean-up runs under the lock and only while
//     the caller's token is the one in FENCE (WhileFenceHeld); otherwise
//     nothing is touched and the error is FAILED_PRECONDITION, marked
//     IsCheckpointFenced: the caller's attempt is over and it must stop.
// So no attempt ever deletes or overwrites a checkpoint committed by a
// newer one: once the newer attempt's claim is on disk, the older one's
// every write to the directory's listing is refused.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_FENCE_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_FENCE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::engine {

inline constexpr char kFenceFileName[] = "FENCE";
inline constexpr char kFenceLockFileName[] = "FENCE.lock";

struct FenceToken {
  std::string owner;    // the job's id; no newline
  int64_t attempt = 0;  // the attempt's generation (>= 0)
};

// Claims `dir` (created if missing) for `token`, then runs `on_claimed`
// (if set) still holding the lock: a start cleans up what interrupted saves
// left there, which only the owner may do. FAILED_PRECONDITION marked
// IsCheckpointFenced if `token.owner`'s attempt > token.attempt holds it;
// RESOURCE_EXHAUSTED marked IsCheckpointVolumeFull if the claim cannot be
// written for lack of space; INTERNAL for other I/O errors, and for a FENCE
// file that does not parse (it is not overwritten: a person should look).
absl::Status ClaimCheckpointDir(const std::string& dir, const FenceToken& token,
                                const std::function<void()>& on_claimed = nullptr);

// Runs `fn` under `dir`'s fence lock if `token` is the claim in force and
// returns its status; otherwise returns FAILED_PRECONDITION marked
// IsCheckpointFenced, naming the claim that replaced it, without running
// `fn`. A directory whose FENCE is missing (emptied by hand) is claimed
// again for `token` first.
absl::Status WhileFenceHeld(const std::string& dir, const FenceToken& token,
                            const std::function<absl::Status()>& fn);

// What a save that failed with `error` tells its caller: if a newer claim
// than `token` holds `dir`, the failure is the fence's doing (the newer
// attempt's start cleaned up the temporary directory this save was writing
// into, say), so the result is FAILED_PRECONDITION marked
// IsCheckpointFenced, naming the claim and keeping `error`'s message;
// otherwise (OK, already fenced, still the holder, or the fence cannot be
// read) `error` unchanged. Takes the fence lock; writes nothing.
absl::Status ExplainSaveFailure(const std::string& dir, const FenceToken& token,
                                absl::Status error);

// A save's early look, before it writes anything: FAILED_PRECONDITION
// marked IsCheckpointFenced if `dir`'s FENCE holds another claim than
// `token`; OK otherwise, also when FENCE is missing, unreadable or does not
// parse (the commit's WhileFenceHeld decides those). Takes no lock and
// writes nothing, so it may pass a claim that lands just after; the commit
// still refuses that one. What it adds: a stale attempt stops at its next
// save point instead of after writing a whole checkpoint that the commit
// would refuse.
absl::Status CheckFenceHeld(const std::string& dir, const FenceToken& token);

// The claim in force: NOT_FOUND if `dir` has none.
absl::StatusOr<FenceToken> ReadFence(const std::string& dir);

// True for the errors above that say a newer attempt holds the directory.
bool IsCheckpointFenced(const absl::Status& status);

// The checkpoint code's errno error: RESOURCE_EXHAUSTED marked
// IsCheckpointVolumeFull for ENOSPC / EDQUOT (a save cannot succeed until
// space is freed), INTERNAL otherwise; "<what> <path>: <strerror>".
absl::Status CheckpointErrnoError(absl::string_view what, const std::string& path);

// True for an error that says the checkpoint volume is full or over quota
// (a failed allocation of staging memory is RESOURCE_EXHAUSTED too, but not
// this).
bool IsCheckpointVolumeFull(const absl::Status& status);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_FENCE_H_
