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

// The value that at least three in four of `v` (rounded up) reach: its
// smallest for up to 4 values (`v` not empty).
double LowerQuartile(std::vector<double> v) {
  const size_t k = (v.size() - 1) / 4;
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

}  // namespace

std::string SlowRankFinding::Describe() const {
  return absl::StrFormat(
      "rank %d computes %.2fx slower than its peers: %.4f s against their median %.4f s a "
      "step, over %d reports in %.1f s from step %d to %d (robust z-score >= %.1f on 3 in 4)",
      rank, slowdown, seconds, peer_seconds, reports, slow_for_seconds, first_slow_step, step, z);
}

SlowRankDetector::SlowRankDetector(SlowRankOptions options) : options_(options) {}

void SlowRankDetector::Reset() {
  reports_.clear();
  histories_.clear();
  named_.clear();
  seen_ = 0;
}

std::vector<SlowRankFinding> SlowRankDetector::Observe(int64_t step, double time_seconds,
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
  while (reports_.size() > static_cast<size_t>(options_.window)) reports_.pop_front();
  histories_.resize(n);
  for (int r = 0; r < n; ++r) {
    if (named_.count(r) > 0) continue;
    // The peers' trailing window: every other rank's last `window` reports.
    std::vector<double> peers, same_step;
    for (const std::vector<double>& report : reports_) {
      for (int q = 0; q < n; ++q) {
        if (q != r) peers.push_back(report[q]);
      }
    }
    for (int q = 0; q < n; ++q) {
      if (q != r) same_step.push_back(seconds[q]);
    }
    const double median = Median(peers);
    std::vector<double> deviations;
    deviations.reserve(peers.size());
    for (double p : peers) deviations.push_back(std::abs(p - median));
    const double scale = std::max(1.4826 * Median(deviations), 0.02 * median);
    const double peer_now = Median(same_step);
    Entry e;
    e.time = time_seconds;
    e.step = step;
    e.seconds = seconds[r];
    e.ratio = peer_now > 0 ? seconds[r] / peer_now : 0.0;
    e.z = scale > 0 ? (seconds[r] - median) / scale : 0.0;
    e.peer_median = median;
    std::deque<Entry>& h = histories_[r];
    h.push_back(e);
    // The shortest run of newest reports with confirm_reports of them and
    // confirm_seconds between its first and the newest (or kMaxEntries).
    while (h.size() > static_cast<size_t>(options_.confirm_reports) &&
           time_seconds - h[1].time >= options_.confirm_seconds) {
      h.pop_front();
    }
    while (h.size() > kMaxEntries) h.pop_front();
    const bool enough =
        h.size() >= static_cast<size_t>(options_.confirm_reports) &&
        (time_seconds - h.front().time >= options_.confirm_seconds || h.size() == kMaxEntries);
    if (!enough) continue;
    // Slow on (at least) three reports in four of that run: the lower
    // quartile of its ratios and of its z-scores clears the bars.
    std::vector<double> ratios, zs, own;
    for (const Entry& x : h) {
      ratios.push_back(x.ratio);
      zs.push_back(x.z);
      own.push_back(x.seconds);
    }
    const double q_ratio = LowerQuartile(ratios);
    const double q_z = LowerQuartile(zs);
    if (q_ratio < options_.min_slowdown || q_z < options_.threshold) continue;
    SlowRankFinding f;
    f.rank = r;
    f.step = step;
    f.seconds = Median(own);
    f.peer_seconds = h.back().peer_median;
    f.slowdown = f.peer_seconds > 0 ? f.seconds / f.peer_seconds : q_ratio;
    f.z = q_z;
    f.reports = static_cast<int>(h.size());
    f.first_slow_step = h.front().step;
    f.slow_for_seconds = time_seconds - h.front().time;
    named_.insert(r);
    found.push_back(f);
  }
  return found;
}

}  // namespace loom::recovery
