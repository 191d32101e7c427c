// Where a node keeps its jobs' in-memory snapshots
// (worker/engine/checkpoint/snapshot_keeper.h), and their clean-up. No
// LibTorch.
//
// Layout: <root>/<job id>-<hash of its checkpoint directory>/ holds one
// job's snapshots on this node (rank_process.h; a
// checkpoint directory in host memory: step-N/, FENCE) and
// WRITER-g<attempt>.lock, which the rank that writes them for that attempt
// holds locked (ClaimSnapshotWriter). The worker exports <root> to its
// ranks as LOOM_SNAPSHOT_DIR.
#ifndef LOOM_WORKER_SNAPSHOT_DIRS_H_
#define LOOM_WORKER_SNAPSHOT_DIRS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace loom::worker {

// The environment variable that carries the root to the ranks.
inline constexpr char kSnapshotDirEnv[] = "LOOM_SNAPSHOT_DIR";

// /dev/shm/loom-snapshots-<uid> when /dev/shm is a directory (a tmpfs on
// Linux), else "" (no snapshots).
std::string DefaultSnapshotRoot();

// True if this process is now the one rank of `attempt` that writes
// snapshots into `job_dir` (created if missing): it holds
// WRITER-g<attempt>.lock locked until it exits. Another live rank of the
// same attempt on this node holding it: false.
bool ClaimSnapshotWriter(const std::string& job_dir, int64_t attempt);

// Removes each directory under `root` in which nothing changed for `max_idle` (its
// newest file or directory's modification time) and whose writer lock no
// live process holds; returns the names removed.
std::vector<std::string> RemoveIdleSnapshotDirs(const std::string& root, absl::Duration max_idle,
                                                absl::Time now);

// RemoveIdleSnapshotDirs every `period` on a thread of its own, until
// destroyed.
class SnapshotJanitor {
 public:
  SnapshotJanitor(std::string root, absl::Duration max_idle, absl::Duration period);
  ~SnapshotJanitor();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_SNAPSHOT_DIRS_H_
