// Slow-rank detection for one job attempt.
//
// Each step report carries every rank's forward+backward seconds
// (StepMetrics.rank_compute_seconds). A rank is slow when, on at least
// three in four of its newest reports spanning `confirm_seconds` (and at
// least `confirm_reports` of them; a few milliseconds of a busy machine's
// scheduling are not a slow rank, however many tiny steps they cover, and
// one fast report among slow ones does not clear it):
//   - its compute time is at least `min_slowdown` times its peers' median in
//     that same report (a slowdown of the whole machine, a checkpoint stall
//     or a longer batch moves every rank together and does not count), and
//   - its robust z-score against its peers' trailing window is at least
//     `threshold`: z = (x - median) / max(1.4826 * MAD, 2% of the median),
//     the median and the MAD over every other rank's last `window` reports
//     (the floor keeps a near-constant baseline from turning jitter into
//     large scores).
// A rank is named once per attempt (Reset starts again, e.g. after a
// re-plan). The first reports of an attempt are noisy (warm-up, a restore),
// so nothing is decided before `min_history` reports.
//
// Not thread-safe; the owner (JobManager) serialises calls.
#ifndef LOOM_CONTROLLER_RECOVERY_SLOW_RANK_DETECTOR_H_
#define LOOM_CONTROLLER_RECOVERY_SLOW_RANK_DETECTOR_H_

#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <vector>

namespace loom::recovery {

struct SlowRankOptions {
  double min_slowdown = 1.5;
  double threshold = 6.0;
  int confirm_reports = 4;
  double confirm_seconds = 3.0;
  int window = 32;
  int min_history = 3;  // reports of the attempt ignored before deciding
};

struct SlowRankFinding {
  int rank = 0;
  int64_t step = 0;             // the report that confirmed it
  double seconds = 0;           // its median compute seconds over the confirming reports
  double peer_seconds = 0;      // its peers' median over their window
  double slowdown = 0;          // seconds / peer_seconds
  double z = 0;                 // the lower quartile of the reports' robust z-scores
  double slow_for_seconds = 0;  // from the first to the confirming report
  int reports = 0;              // confirming reports
  int64_t first_slow_step = 0;  // the first of them
  std::string Describe() const;
};

class SlowRankDetector {
 public:
  explicit SlowRankDetector(SlowRankOptions options = {});

  // One step report's per-rank compute seconds (index = rank), made at
  // `time_seconds` (any epoch; reports come in time order). Returns the
  // ranks newly found slow by it. A report whose rank count differs from
  // the previous one (a new layout) starts the history again.
  std::vector<SlowRankFinding> Observe(int64_t step, double time_seconds,
                                       const std::vector<double>& seconds);

  // Forgets the history and the ranks named (a new attempt or layout).
  void Reset();

  const std::set<int>& named() const { return named_; }

 private:
  // One report, as one rank's score.
  struct Entry {
    double time = 0;
    int64_t step = 0;
    double seconds = 0;      // its compute time
    double ratio = 0;        // to its peers' median in the same report
    double z = 0;            // against its peers' trailing window
    double peer_median = 0;  // of that window
  };
  // Reports kept per rank: more in confirm_seconds (steps of a few
  // milliseconds) and this many decide.
  static constexpr size_t kMaxEntries = 1024;
  const SlowRankOptions options_;
  std::deque<std::vector<double>> reports_;  // newest last, at most window
  // By rank: the newest reports that span confirm_seconds (and at least
  // confirm_reports of them).
  std::vector<std::deque<Entry>> histories_;
  std::set<int> named_;
  int seen_ = 0;  // reports since Reset
};

}  // namespace loom::recovery

#endif  // LOOM_CONTROLLER_RECOVERY_SLOW_RANK_DETECTOR_H_
