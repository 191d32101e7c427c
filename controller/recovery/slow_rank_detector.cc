#include "controller/recovery/slow_rank_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace loom::recovery {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (*std::max_element(v.begin(), v.begin() + mid) + upper) / 2;
}

}  // namespace

std::string SlowRankFinding::Describe() const {
  return absl::StrFormat(
      "rank %d computes %.2fx slower than its peers: %.4f s against their median %.4f s a "
      "step, on %d consecutive reports from step %d to %d (robust z-score >= %.1f)",
      rank, slowdown, seconds, peer_seconds, reports, first_slow_step, step, z);
}

SlowRankDetector::SlowRankDetector(SlowRankOptions options) : options_(options) {}

void SlowRankDetector::Reset() {
  reports_.clear();
  steps_.clear();
  named_.clear();
  seen_ = 0;
}

std::vector<SlowRankFinding> SlowRankDetector::Observe(int64_t step,
                                                       const std::vector<double>& seconds) {
  std::vector<SlowRankFinding> found;
  const int n = static_cast<int>(seconds.size());
  if (n < 2) return found;
  if (!reports_.empty() && static_cast<int>(reports_.back().size()) != n) Reset();
  for (double s : seconds) {
    if (!std::isfinite(s) || s < 0) return found;  // not a measurement: ignore the report
  }
  ++seen_;
  if (seen_ <= options_.min_history) return found;
  reports_.push_back(seconds);
  steps_.push_back(step);
  const size_t keep = static_cast<size_t>(options_.window + options_.confirm_reports);
  while (reports_.size() > keep) {
    reports_.pop_front();
    steps_.pop_front();
  }
  const int confirm = options_.confirm_reports;
  if (static_cast<int>(reports_.size()) < confirm) return found;
  const size_t first_confirming = reports_.size() - confirm;
  for (int r = 0; r < n; ++r) {
    if (named_.count(r) > 0) continue;
    // The peers' trailing window: every other rank's last `window` reports.
    std::vector<double> peers;
    const size_t from = reports_.size() > static_cast<size_t>(options_.window)
                            ? reports_.size() - options_.window
                            : 0;
    for (size_t i = from; i < reports_.size(); ++i) {
      for (int q = 0; q < n; ++q) {
        if (q != r) peers.push_back(reports_[i][q]);
      }
    }
    const double median = Median(peers);
    std::vector<double> deviations;
    deviations.reserve(peers.size());
    for (double p : peers) deviations.push_back(std::abs(p - median));
    const double scale = std::max(1.4826 * Median(deviations), 0.02 * median);
    if (!(scale > 0)) continue;
    double min_ratio = std::numeric_limits<double>::infinity();
    double min_z = std::numeric_limits<double>::infinity();
    std::vector<double> own;
    for (size_t i = first_confirming; i < reports_.size(); ++i) {
      std::vector<double> same_step;
      for (int q = 0; q < n; ++q) {
        if (q != r) same_step.push_back(reports_[i][q]);
      }
      const double peer_now = Median(same_step);
      const double x = reports_[i][r];
      min_ratio = std::min(min_ratio, peer_now > 0 ? x / peer_now : 0.0);
      min_z = std::min(min_z, (x - median) / scale);
      own.push_back(x);
    }
    if (min_ratio < options_.min_slowdown || min_z < options_.threshold) continue;
    SlowRankFinding f;
    f.rank = r;
    f.step = steps_.back();
    f.seconds = Median(own);
    f.peer_seconds = median;
    f.slowdown = min_ratio;
    f.z = min_z;
    f.reports = confirm;
    f.first_slow_step = steps_[first_confirming];
    named_.insert(r);
    found.push_back(f);
  }
  return found;
}

}  // namespace loom::recovery
