// StepSeriesIndex: GetStepSeries over the store, as fast for a job of a
// million steps as for one of a thousand.
//
// Per job it keeps, in memory, a summary of every block of kBlockSteps
// steps (aligned at step 0) that the job has finished recording: each
// series' first, last, min and max (StepSummary). A query cut into buckets
// of at least 2 * kBlockSteps steps is answered from the blocks, plus the
// records of the steps at its ends that no complete block covers; a zoomed
// query (narrower buckets) reads its steps' records from the store, at
// most 2 * kBlockSteps * buckets of them. A block counts in the bucket of
// its first step, so a bucket's edges may move by up to a block: each
// bucket says which steps it holds.
//
// The blocks are built from the store the first time a job is asked for
// (in chunks, letting the store's other users in between) and brought up
// to date at each query from the last complete block on. When the job's
// generation changes (a restart or a rollback re-records steps from its
// resume step), the blocks from the resume step's on are dropped and read
// again. At most kMaxJobs jobs and kMaxBlocks blocks are kept; the least
// recently asked job goes first.
//
// Thread-safe. A job's first read (about a second for a million steps)
// runs outside the lock; queries of kept jobs take turns.
#ifndef LOOM_CONTROLLER_PROGRESS_STEP_SERIES_INDEX_H_
#define LOOM_CONTROLLER_PROGRESS_STEP_SERIES_INDEX_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/progress/step_series.h"
#include "controller/store/store.h"

namespace loom::controller {

class StepSeriesIndex {
 public:
  static constexpr int64_t kBlockSteps = 32;
  static constexpr size_t kMaxJobs = 256;
  // Blocks kept in all (about 360 bytes each), so that a few huge jobs do
  // not take the controller's memory; least recently asked jobs go first.
  static constexpr size_t kMaxBlocks = 500'000;

  // `store` must outlive the index.
  explicit StepSeriesIndex(Store* store) : store_(store) {}

  // The series of `request.job_id()`, whose current attempt is
  // `generation`, resumed at `resume_step` (-1 or 0: from the start).
  // INVALID_ARGUMENT as StepSeriesBuilder::Start; the store's errors.
  absl::StatusOr<loom::v1::GetStepSeriesResponse> Query(
      const loom::v1::GetStepSeriesRequest& request, int64_t generation, int64_t resume_step);

  // Reads `job_id`'s blocks now unless they are kept already (as a query
  // would, but for no one waiting): a controller that starts warms the
  // longest jobs, so that their first chart after a restart or a failover
  // is as fast as the next. The store's errors.
  absl::Status Warm(const std::string& job_id, int64_t generation, int64_t resume_step);

  // How many complete blocks are kept for `job_id` (tests).
  size_t BlocksOf(const std::string& job_id);

 private:
  struct JobBlocks {
    int64_t generation = -1;
    int64_t first_block = 0;          // the block index of blocks[0]
    std::vector<StepSummary> blocks;  // complete blocks, consecutive
    uint64_t last_used = 0;
    // Steps below this are in complete blocks (first_block + blocks.size()).
    int64_t indexed_to() const {
      return (first_block + static_cast<int64_t>(blocks.size())) * kBlockSteps;
    }
  };
  // Brings `job`'s blocks up to the last complete one for steps up to
  // `last_step`.
  absl::Status Refresh(const std::string& job_id, JobBlocks* job, int64_t first_step,
                       int64_t last_step, int64_t generation, int64_t resume_step);
  // A job's blocks read whole, without the lock.
  absl::StatusOr<JobBlocks> Build(const std::string& job_id, int64_t first_step, int64_t last_step,
                                  int64_t generation, int64_t resume_step);
  // Drops the least recently asked jobs while over kMaxJobs or kMaxBlocks.
  void EvictLocked();
  // With `lock` held on mu_: `job_id` kept, read with Build (the lock
  // released meanwhile) unless kept already or being read by another
  // caller, whom this one then waits for.
  absl::Status EnsureKept(std::unique_lock<std::mutex>& lock, const std::string& job_id,
                          int64_t first_step, int64_t last_step, int64_t generation,
                          int64_t resume_step);

  Store* const store_;
  std::mutex mu_;
  std::map<std::string, JobBlocks> jobs_;  // guarded by mu_
  uint64_t uses_ = 0;                      // guarded by mu_
  std::set<std::string> building_;         // being read by Build; guarded by mu_
  std::condition_variable built_;          // a Build ended
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_STEP_SERIES_INDEX_H_
