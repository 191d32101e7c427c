#include "controller/scheduling/fair_share.h"

#include <cmath>

namespace loom::scheduling {

FairShare::FairShare(absl::Duration half_life) : half_life_(half_life) {}

void FairShare::Observe(absl::Time now, const std::map<std::string, Resources>& usage) {
  if (last_ != absl::InfinitePast() && now > last_) {
    // The fraction of the old average that survives dt (the formula in the
    // header).
    const double keep = std::exp2(-absl::FDivDuration(now - last_, half_life_));
    for (auto& [name, e] : queues_) {
      e.decayed.slots = e.decayed.slots * keep + static_cast<double>(e.current.slots) * (1 - keep);
      e.decayed.gpus = e.decayed.gpus * keep + static_cast<double>(e.current.gpus) * (1 - keep);
    }
  }
  if (last_ == absl::InfinitePast() || now > last_) last_ = now;
  for (auto& [name, e] : queues_) e.current = Resources{};
  for (const auto& [name, u] : usage) queues_[name].current = u;
}

DecayedUsage FairShare::Usage(const std::string& queue) const {
  auto it = queues_.find(queue);
  return it == queues_.end() ? DecayedUsage{} : it->second.decayed;
}

}  // namespace loom::scheduling
