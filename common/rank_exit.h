// Exit codes of a training rank (loom-rank) that the controller acts on.
// Header-only; shared by the rank and the controller's recovery policy.
#ifndef LOOM_COMMON_RANK_EXIT_H_
#define LOOM_COMMON_RANK_EXIT_H_

namespace loom {

// The rank could not join its job's process groups (the TCP store or a
// Gloo/NCCL connection failed) before any training. Nothing was computed,
// so the controller places the attempt again without counting a restart
// (a bounded number of times; JobManagerOptions::max_rendezvous_retries).
// 75 is sysexits.h's EX_TEMPFAIL.
inline constexpr int kRankExitRendezvousFailed = 75;

// The job's checkpoint directory holds checkpoints and none verifies
// (worker/engine/checkpoint/checkpoint_choice.h, IsNoGoodCheckpoint), and the job does
// not allow starting from scratch. Restarting cannot help: the controller
// fails the job with the rank's reason, without spending a restart.
// 65 is sysexits.h's EX_DATAERR.
inline constexpr int kRankExitNoGoodCheckpoint = 65;

// Training stopped because a checkpoint save found the volume full or over
// quota (RESOURCE_EXHAUSTED from the writer). A restart resumes with a save
// that would fail the same way, so the controller fails the job with the
// rank's reason, without spending a restart. 74 is sysexits.h's EX_IOERR.
inline constexpr int kRankExitCheckpointVolumeFull = 74;

// The job's checkpoint directory is fenced to another attempt
// (worker/engine/checkpoint/checkpoint_fence.h): a newer attempt of this job, or
// another job, claimed it, so this rank committed and deleted nothing more
// and stopped. For a stale attempt the exit is only accounted; for the
// current attempt the controller fails the job with the rank's reason,
// without spending a restart (a restart would take the directory back from
// whoever holds it). 77 is sysexits.h's EX_NOPERM.
inline constexpr int kRankExitCheckpointFenced = 77;

// Checkpoint-then-preempt: the rank was asked to save and stop (SIGUSR1,
// StopRank.checkpoint_first), and every rank of the job agreed at a step
// boundary, saved the state reached (or found it already saved) and
// stopped with that checkpoint committed. The controller requeues the job
// as PREEMPTED, to resume from that checkpoint, without counting a restart.
// 79 is Loom's own (past sysexits.h's range).
inline constexpr int kRankExitSavedAndStopped = 79;

}  // namespace loom

#endif  // LOOM_COMMON_RANK_EXIT_H_
