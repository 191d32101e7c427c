// SeriesWarmer: reads the longest jobs' chart series ahead, so that the
// first chart of a million-step job after a controller start or a failover
// is as fast as the next (StepSeriesIndex reads a job whole the first time
// it is asked: about a second per million steps).
//
// On a thread of its own: once `leading` says this controller leads (asked
// twice a second; a standby's job table is not the one it will serve), it
// takes `jobs`, keeps those of at least kMinSteps steps, and warms the
// kMaxJobs most recently active of them, newest first
// (StepSeriesIndex::Warm). Then the thread ends. Destroying the warmer
// stops it between jobs and joins it.
#ifndef LOOM_CONTROLLER_PROGRESS_SERIES_WARMER_H_
#define LOOM_CONTROLLER_PROGRESS_SERIES_WARMER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "controller/progress/step_series_index.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

class SeriesWarmer {
 public:
  static constexpr int kMaxJobs = 4;
  static constexpr int64_t kMinSteps = 1 << 16;

  // `index` must outlive the warmer.
  SeriesWarmer(StepSeriesIndex* index, std::function<std::vector<loom::v1::Job>()> jobs,
               std::function<bool()> leading);
  ~SeriesWarmer();
  SeriesWarmer(const SeriesWarmer&) = delete;
  SeriesWarmer& operator=(const SeriesWarmer&) = delete;

  // Blocks until the thread has ended (tests).
  void WaitDone();
  // Jobs warmed, in order (tests).
  std::vector<std::string> warmed();

 private:
  void Run();
  bool Stopping();

  StepSeriesIndex* const index_;
  const std::function<std::vector<loom::v1::Job>()> jobs_;
  const std::function<bool()> leading_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                // guarded by mu_
  bool done_ = false;                // guarded by mu_
  std::vector<std::string> warmed_;  // guarded by mu_
  std::thread thread_;               // last: started when the rest is built
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_SERIES_WARMER_H_
