#include "bench/elastic_check.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"

namespace loom::bench {
namespace {

double RelDiff(double loss, const Losses* ref, int64_t step) {
  if (ref == nullptr) return std::numeric_limits<double>::infinity();
  auto it = ref->find(step);
  if (it == ref->end()) return std::numeric_limits<double>::infinity();
  return std::abs(loss - it->second) / std::abs(it->second);
}

const Losses* Find(const std::map<int, Losses>& refs, int ranks) {
  auto it = refs.find(ranks);
  return it == refs.end() ? nullptr : &it->second;
}

}  // namespace

bool ElasticCheck::ok(double later_bound) const {
  return layouts_known && prefix > 0 && prefix_diff == 0 && checked > 0 &&
         first_step_diff <= 1e-12 && later <= later_bound;
}

int DataParallelOf(const std::string& layout) {
  const size_t at = layout.find("dp ");
  return at == std::string::npos ? 0 : atoi(layout.c_str() + at + 3);
}

ElasticCheck CheckElasticLosses(const loom::v1::Job& done,
                                const loom::v1::GetStepMetricsResponse& records,
                                const std::map<int, Losses>& refs, int last_ranks) {
  ElasticCheck out;
  // The ranks each layout generation ran: generation 0 the first re-plan's
  // from-layout, generation k the k-th re-plan's to-layout.
  std::vector<int> ranks_of_generation;
  std::vector<const loom::v1::RecoveryEvent*> replan_events;
  for (const auto& e : done.events()) {
    if (e.kind() != loom::v1::RecoveryEvent::REPLANNED) continue;
    if (ranks_of_generation.empty()) ranks_of_generation.push_back(DataParallelOf(e.from_layout()));
    ranks_of_generation.push_back(DataParallelOf(e.to_layout()));
    replan_events.push_back(&e);
    out.replans.push_back(absl::StrCat(e.cause(), " from ", e.checkpoint_step()));
  }
  out.layouts_known = !ranks_of_generation.empty() &&
                      static_cast<int>(replan_events.size()) == done.layout_generation() &&
                      std::count(ranks_of_generation.begin(), ranks_of_generation.end(), 0) == 0;
  if (!out.layouts_known) return out;
  // The committed trajectory (each step's last record) and its exact
  // prefix: steps 1..prefix all trained under the job's first layout, so bit
  // for bit the uninterrupted run's of that many ranks.
  std::map<int64_t, const loom::v1::StepMetrics*> committed;
  for (const auto& m : records.steps()) {
    if (m.step() > 0) committed[m.step()] = &m;
  }
  out.first_ranks = ranks_of_generation.front();
  const Losses* first_ref = Find(refs, out.first_ranks);
  const Losses* last_ref = Find(refs, last_ranks);
  for (const auto& [s, m] : committed) {
    const int g = m->layout_generation();
    const bool in_prefix = s == out.prefix + 1 && g >= 0 &&
                           g < static_cast<int>(ranks_of_generation.size()) &&
                           ranks_of_generation[g] == out.first_ranks;
    if (in_prefix) {
      out.prefix = s;
      out.prefix_diff = std::max(out.prefix_diff, RelDiff(m->loss(), first_ref, s));
    } else {
      out.later = std::max(out.later, RelDiff(m->loss(), last_ref, s));
    }
  }
  // Each re-plan from a checkpoint inside the prefix: its attempt's first
  // step (kept or later replayed) starts from the uninterrupted run's
  // parameters, on its data batch.
  for (const loom::v1::RecoveryEvent* e : replan_events) {
    const int64_t c = e->checkpoint_step();
    if (c > out.prefix) {
      ++out.past_prefix;
      continue;
    }
    const loom::v1::StepMetrics* first = nullptr;
    for (const auto& m : records.steps()) {
      if (m.step() == c + 1 && m.generation() == e->generation()) first = &m;
    }
    if (first == nullptr) {
      ++out.unreported;
      continue;
    }
    ++out.checked;
    out.first_step_diff = std::max(out.first_step_diff, RelDiff(first->loss(), first_ref, c + 1));
  }
  return out;
}

}  // namespace loom::bench
