// What the rank process (rank_main.cc) does around training that needs no
// LibTorch: waiting as a warm rank for its assignment, running
// `loom-ckpt fetch` for the object-store tier, and its in-memory snapshots'
// settings.
#ifndef LOOM_WORKER_RANK_PROCESS_H_
#define LOOM_WORKER_RANK_PROCESS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace loom::worker {

struct WarmAssignment {
  std::string assignment_path;
  // For the rank's start-up line: " (a warm rank: LibTorch loaded in 1.41 s,
  // 37.2 s before its assignment)".
  std::string note;
};

// A warm rank (rank_supervisor.h), loaded: says so on stderr (the worker's
// warm-ranks.log), then waits for its worker to send "<assignment
// path>\t<log path>\n" on stdin, makes that log its stderr (appending) and
// stdin /dev/null. nullopt at the end of input (the worker no longer needs
// it: exit 0); an error for a line it cannot use.
absl::StatusOr<std::optional<WarmAssignment>> AwaitWarmAssignment();

// The object-store tier before a resume: `loom-ckpt fetch` (beside this
// binary) brings into `dir` the store's newest checkpoint when `dir` has
// none as new (common/object_store/remote_checkpoints.h), so that loom-rank
// itself links no HTTP client. Runs `loom-ckpt fetch REMOTE DIR
// [--resume-step N]` (none when `resume_step` is unset: REMOTE is one
// checkpoint's location) and returns its line (what it did, or why nothing
// was restored; the resume then goes on with what `dir` has); `*ok` (if not
// null) whether it said DIR is ready.
std::string FetchFromObjectStore(const std::string& remote, const std::string& dir,
                                 std::optional<int64_t> resume_step, bool* ok = nullptr);

// This rank's in-memory snapshots (CheckpointSpec.snapshots; TrainerConfig's
// snapshot_* fields): the job's directory under the worker's root
// (LOOM_SNAPSHOT_DIR, snapshot_dirs.h), named after the job and its
// checkpoint directory (two controllers' jobs of the same id on one node
// never share one), whether this rank writes them for
// its node in this attempt (ClaimSnapshotWriter), the interval, and the
// memory they may take (the spec's max_bytes, else a quarter of
// `memory_per_rank`). dir is empty (none) when the worker gives no root or
// the spec disables them.
struct RankSnapshots {
  std::string dir;
  int64_t interval = 0;
  bool writer = false;
  uint64_t max_bytes = 0;
};
RankSnapshots ChooseRankSnapshots(bool disable, int64_t interval_steps, int64_t max_bytes,
                                  const std::string& job_id, const std::string& checkpoint_dir,
                                  int64_t attempt, uint64_t memory_per_rank);

}  // namespace loom::worker

#endif  // LOOM_WORKER_RANK_PROCESS_H_
