#include "controller/scheduling/preemption.h"

#include <tuple>

namespace loom::scheduling {

bool CheaperVictim(const RunningJob& a, const RunningJob& b) {
  // Later start first: compare b's start with a's.
  return std::tie(a.steps_since_checkpoint, a.priority, b.start_time, a.id) <
         std::tie(b.steps_since_checkpoint, b.priority, a.start_time, b.id);
}

bool ProtectedFromPreemption(const RunningJob& job, absl::Duration min_run_time, absl::Time now) {
  if (job.last_preempted == absl::InfinitePast()) return false;
  return now - job.start_time < min_run_time;
}

bool Preemptible(const RunningJob& job, absl::Duration min_run_time, absl::Time now) {
  return job.preemptible && !job.saving && !ProtectedFromPreemption(job, min_run_time, now);
}

std::optional<std::vector<int>> ChooseVictims(
    int candidates, const std::function<bool(const std::vector<int>&)>& fits,
    const std::function<bool(int, const std::vector<int>&)>& allowed) {
  std::vector<int> chosen;
  bool fit = false;
  for (int c = 0; c < candidates && !fit; ++c) {
    if (!allowed(c, chosen)) continue;
    chosen.push_back(c);
    fit = fits(chosen);
  }
  if (!fit) return std::nullopt;
  // Greedy over-collects (cheap victims taken before one that was needed
  // anyway); spare every victim the set does without, costliest first.
  for (int i = static_cast<int>(chosen.size()) - 1; i >= 0; --i) {
    std::vector<int> without = chosen;
    without.erase(without.begin() + i);
    if (without.empty() || !fits(without)) continue;
    bool still_allowed = true;
    for (size_t k = 0; k < without.size() && still_allowed; ++k) {
      std::vector<int> others = without;
      others.erase(others.begin() + k);
      still_allowed = allowed(without[k], others);
    }
    if (still_allowed) chosen = std::move(without);
  }
  return chosen;
}

}  // namespace loom::scheduling
