// Loss-spike detection for one job, PaLM-style (Chowdhery et al. 2022, §5.1:
// restart ~100 steps before the spike and skip ~200-500 batches).
//
// Each step's global loss (already averaged over data-parallel ranks) and
// gradient norm are scored against a trailing window of accepted steps with
// a robust z-score: z = (x - median) / (1.4826 * MAD), the MAD scaled to a
// normal standard deviation (Rousseeuw & Croux 1993). Only rises count.
// Non-finite loss or gradient norm is a spike at once. Values judged
// anomalous never enter the baseline.
//
// Not thread-safe; the owner (JobManager) serialises calls.
#ifndef LOOM_CONTROLLER_RECOVERY_SPIKE_DETECTOR_H_
#define LOOM_CONTROLLER_RECOVERY_SPIKE_DETECTOR_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

namespace loom::recovery {

struct SpikeDetectorOptions {
  int window = 128;          // trailing accepted steps in the baseline
  int min_history = 64;      // no decision (other than non-finite) before this many
  double threshold = 6.0;    // robust z-score above which a step is anomalous
  int confirm_steps = 1;     // consecutive anomalous steps needed to declare a spike
  // The gradient norm is a secondary signal: it declares a spike only when
  // its own z-score exceeds this (0 disables it) on grad_norm_confirm_steps
  // consecutive steps. Single-step gradient-norm outliers of several times
  // the median are common in small-batch training and clipping absorbs
  // them (seen here: 3.7x and 7x on ordinary text batches).
  double grad_norm_threshold = 12.0;
  int grad_norm_confirm_steps = 3;
};

struct SpikeVerdict {
  bool spike = false;
  std::string signal;   // "loss", "grad_norm", "non-finite loss", "non-finite grad_norm"
  double value = 0;     // the offending value
  double baseline = 0;  // median of the window
  double mad = 0;       // median absolute deviation of the window
  double score = 0;     // robust z-score (inf for non-finite)
  int64_t step = 0;
  std::string Describe() const;
};

class SpikeDetector {
 public:
  explicit SpikeDetector(SpikeDetectorOptions options = {});

  // Scores one step. Steps must increase; a step <= the last seen one is
  // treated as a replay after a rollback (call Truncate first to be explicit).
  SpikeVerdict Observe(int64_t step, double loss, double grad_norm);

  // Forgets everything after `last_step` (the checkpoint a rollback resumes
  // from), and any pending unconfirmed anomaly.
  void Truncate(int64_t last_step);

  // Accepted steps available to the baseline (at most window).
  int history() const { return std::min<int>(losses_.size(), options_.window); }

  // Steps of history kept beyond the window, for rollbacks.
  static constexpr int kRollbackHistory = 1024;

 private:
  struct Score {
    double median = 0, mad = 0, z = 0;
  };
  static Score RobustScore(const std::deque<std::pair<int64_t, double>>& window, double x);
  void Accept(int64_t step, double loss, double grad_norm);
  std::deque<std::pair<int64_t, double>> Tail(
      const std::deque<std::pair<int64_t, double>>& all) const;

  const SpikeDetectorOptions options_;
  std::deque<std::pair<int64_t, double>> losses_;      // (step, loss), accepted only
  std::deque<std::pair<int64_t, double>> grad_norms_;  // (step, norm), accepted only
  int anomalous_run_ = 0;       // consecutive anomalous-loss steps so far
  int grad_anomalous_run_ = 0;  // consecutive anomalous-grad-norm steps so far
};

}  // namespace loom::recovery

#endif  // LOOM_CONTROLLER_RECOVERY_SPIKE_DETECTOR_H_
