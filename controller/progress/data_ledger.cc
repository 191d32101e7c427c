#include "controller/progress/data_ledger.h"

#include <algorithm>
#include <map>
#include <set>

namespace loom::controller {

DataLedger ComputeDataLedger(const std::vector<loom::v1::StepMetrics>& records,
                             const std::vector<loom::v1::SkipRange>& skip_ranges) {
  DataLedger ledger;
  // step -> the newest attempt's record (later reports of the same attempt
  // win too).
  std::map<int64_t, const loom::v1::StepMetrics*> committed;
  for (const loom::v1::StepMetrics& m : records) {
    if (m.step() <= 0) continue;
    auto [it, inserted] = committed.emplace(m.step(), &m);
    if (!inserted) {
      ++ledger.replayed;
      if (m.generation() >= it->second->generation()) it->second = &m;
    }
  }
  if (committed.empty()) return ledger;
  ledger.steps = static_cast<int64_t>(committed.size());
  ledger.missing_steps = committed.rbegin()->first - ledger.steps;
  std::map<int64_t, int> trained;  // data batch -> committed steps that trained it
  std::set<int32_t> layouts;
  for (const auto& [step, m] : committed) {
    trained[m->data_batch()] += 1;
    layouts.insert(m->layout_generation());
  }
  ledger.layout_generations = static_cast<int64_t>(layouts.size());
  ledger.first_batch = committed.begin()->second->data_batch();
  ledger.last_batch = committed.rbegin()->second->data_batch();
  for (const auto& [batch, count] : trained) ledger.duplicated += count > 1 ? count - 1 : 0;
  // Only a complete record (every step reported) can show a skip.
  if (ledger.missing_steps == 0) {
    for (int64_t b = 0; b <= ledger.last_batch; ++b) {
      if (trained.count(b) > 0) continue;
      const bool covered =
          std::any_of(skip_ranges.begin(), skip_ranges.end(),
                      [b](const loom::v1::SkipRange& r) { return b >= r.begin() && b < r.end(); });
      if (!covered) ++ledger.skipped;
    }
  }
  return ledger;
}

}  // namespace loom::controller
