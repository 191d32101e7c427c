#include "controller/recovery/spike_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"

namespace loom::recovery {

std::string SpikeVerdict::Describe() const {
  if (!spike) return "no spike";
  if (!std::isfinite(value)) {
    return absl::StrFormat("%s at step %d (%f)", signal, step, value);
  }
  return absl::StrFormat("%s %.4f at step %d vs baseline median %.4f (MAD %.4f): robust z = %.1f",
                         signal, value, step, baseline, mad, score);
}

SpikeDetector::SpikeDetector(SpikeDetectorOptions options) : options_(options) {}

SpikeDetector::Score SpikeDetector::RobustScore(
    const std::deque<std::pair<int64_t, double>>& window, double x) {
  Score s;
  if (window.empty()) return s;
  std::vector<double> v;
  v.reserve(window.size());
  for (const auto& [step, value] : window) v.push_back(value);
  auto median_of = [](std::vector<double>& a) {
    size_t n = a.size();
    std::nth_element(a.begin(), a.begin() + n / 2, a.end());
    double hi = a[n / 2];
    if (n % 2 == 1) return hi;
    double lo = *std::max_element(a.begin(), a.begin() + n / 2);
    return (lo + hi) / 2;
  };
  s.median = median_of(v);
  for (double& d : v) d = std::fabs(d - s.median);
  s.mad = median_of(v);
  // 1.4826 * MAD estimates sigma for normal data. A flat window (MAD 0)
  // would make any wiggle infinite: floor the scale at 0.1% of the level.
  double scale = std::max({1.4826 * s.mad, 1e-3 * std::fabs(s.median), 1e-12});
  s.z = (x - s.median) / scale;
  return s;
}

void SpikeDetector::Accept(int64_t step, double loss, double grad_norm) {
  // More than the window is kept so that after a rollback of up to
  // kRollbackHistory steps a full window of older steps remains.
  const int keep = options_.window + kRollbackHistory;
  losses_.emplace_back(step, loss);
  while (static_cast<int>(losses_.size()) > keep) losses_.pop_front();
  grad_norms_.emplace_back(step, grad_norm);
  while (static_cast<int>(grad_norms_.size()) > keep) grad_norms_.pop_front();
}

SpikeVerdict SpikeDetector::Observe(int64_t step, double loss, double grad_norm) {
  if (!losses_.empty() && step <= losses_.back().first) Truncate(step - 1);
  SpikeVerdict v;
  v.step = step;
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    v.spike = true;
    v.signal = std::isfinite(loss) ? "non-finite grad_norm" : "non-finite loss";
    v.value = std::isfinite(loss) ? grad_norm : loss;
    v.score = std::numeric_limits<double>::infinity();
    anomalous_run_ = 0;
    grad_anomalous_run_ = 0;
    return v;
  }
  if (static_cast<int>(losses_.size()) < options_.min_history) {
    Accept(step, loss, grad_norm);
    return v;
  }
  Score ls = RobustScore(Tail(losses_), loss);
  Score gs = RobustScore(Tail(grad_norms_), grad_norm);
  bool loss_bad = ls.z > options_.threshold;
  bool grad_bad = options_.grad_norm_threshold > 0 && gs.z > options_.grad_norm_threshold;
  anomalous_run_ = loss_bad ? anomalous_run_ + 1 : 0;
  grad_anomalous_run_ = grad_bad ? grad_anomalous_run_ + 1 : 0;
  if (!loss_bad && !grad_bad) {
    Accept(step, loss, grad_norm);
    return v;
  }
  // Anomalous: kept out of the baseline whether or not it is confirmed.
  bool loss_spike = loss_bad && anomalous_run_ >= options_.confirm_steps;
  bool grad_spike = grad_bad && grad_anomalous_run_ >= options_.grad_norm_confirm_steps;
  if (!loss_spike && !grad_spike) return v;
  anomalous_run_ = 0;
  grad_anomalous_run_ = 0;
  v.spike = true;
  if (loss_spike) {
    v.signal = "loss";
    v.value = loss;
    v.baseline = ls.median;
    v.mad = ls.mad;
    v.score = ls.z;
  } else {
    v.signal = "grad_norm";
    v.value = grad_norm;
    v.baseline = gs.median;
    v.mad = gs.mad;
    v.score = gs.z;
  }
  return v;
}

std::deque<std::pair<int64_t, double>> SpikeDetector::Tail(
    const std::deque<std::pair<int64_t, double>>& all) const {
  size_t n = std::min(all.size(), static_cast<size_t>(options_.window));
  return std::deque<std::pair<int64_t, double>>(all.end() - n, all.end());
}

void SpikeDetector::Truncate(int64_t last_step) {
  while (!losses_.empty() && losses_.back().first > last_step) losses_.pop_back();
  while (!grad_norms_.empty() && grad_norms_.back().first > last_step) grad_norms_.pop_back();
  anomalous_run_ = 0;
  grad_anomalous_run_ = 0;
}

}  // namespace loom::recovery
