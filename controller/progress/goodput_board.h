// GoodputBoard: the newest goodput figures of each job (goodput.h), so that
// the controller's Prometheus refresh, `GetGoodput` and the console read a
// job's step reports once per few seconds, not once per reader: computing a
// million-step job's buckets reads a million step records.
//
// Figures computed less than `max_age` ago are answered as they are; so are
// those of an ended job computed after its last change (they cannot move
// again). Figures of a job not ended that had no step reports yet are never
// reused. Otherwise Get computes them afresh. At most `max_jobs` jobs are
// kept; the least recently computed go first. Thread-safe; the step reports
// are read outside the lock.
#ifndef LOOM_CONTROLLER_PROGRESS_GOODPUT_BOARD_H_
#define LOOM_CONTROLLER_PROGRESS_GOODPUT_BOARD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/progress/goodput.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class GoodputBoard {
 public:
  // A job's step reports, any order (JobManager::StepMetrics).
  using StepsFn =
      std::function<absl::StatusOr<std::vector<loom::v1::StepMetrics>>(const std::string& job_id)>;

  explicit GoodputBoard(StepsFn steps, absl::Duration max_age = absl::Seconds(5),
                        size_t max_jobs = 4096);

  // Computes `job`'s figures as of `now` and keeps them.
  absl::StatusOr<loom::v1::GetGoodputResponse> Refresh(const loom::v1::Job& job, absl::Time now);
  // The kept figures while they hold (above), else Refresh.
  absl::StatusOr<loom::v1::GetGoodputResponse> Get(const loom::v1::Job& job, absl::Time now);

  // The figures as the RPC answers them.
  static loom::v1::GetGoodputResponse ToResponse(const GoodputBuckets& buckets,
                                                 int64_t step_reports, absl::Time computed);
  // The buckets back from a response (for the Prometheus series).
  static GoodputBuckets FromResponse(const loom::v1::GetGoodputResponse& response);

  size_t size();  // jobs kept (tests)

 private:
  struct Entry {
    loom::v1::GetGoodputResponse figures;
    absl::Time computed;
    int64_t job_updated_unix_ms = 0;  // the job record they were computed from
    bool job_ended = false;
  };

  const StepsFn steps_;
  const absl::Duration max_age_;
  const size_t max_jobs_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;  // by job id; guarded by mu_
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_GOODPUT_BOARD_H_
