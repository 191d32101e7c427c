// Choosing whom to preempt, so that preemption loses nothing:
// whole gangs only, the victims that lose the least work, a minimal set,
// and never a job inside its no-thrash window.
//
// Which running jobs are candidates at all (same queue and lower priority,
// a borrower of the cohort, ...) is the admission policy's business
// (admission.h); this file orders them and picks the set.
//
// Pure functions; thread-safe.
#ifndef LOOM_CONTROLLER_SCHEDULING_PREEMPTION_H_
#define LOOM_CONTROLLER_SCHEDULING_PREEMPTION_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "controller/scheduling/snapshot.h"

namespace loom::scheduling {

// The victim order, cheapest first: fewest steps since the last checkpoint
// (the work a save that fails to commit would lose), then the lowest
// priority, then the most recently started (it has run least), then id.
bool CheaperVictim(const RunningJob& a, const RunningJob& b);

// No thrashing: a job that was preempted before is not preempted again
// until its current run has lasted `min_run_time`. A job never preempted is
// not protected: a preemption saves its work, and a new job that must make
// way for a reclaim or a higher priority should do so at once.
bool ProtectedFromPreemption(const RunningJob& job, absl::Duration min_run_time, absl::Time now);

// Whether a job could be a victim at all: preemptible, not already saving,
// not protected.
bool Preemptible(const RunningJob& job, absl::Duration min_run_time, absl::Time now);

// The victim set among candidates 0..n-1 (already in CheaperVictim order):
// take candidates in order, each only when `allowed(candidate, chosen)`
// (rules that depend on who else goes, e.g. "its queue still borrows"),
// until `fits(chosen)`; then drop, costliest first, every victim without
// which the set still fits and is still allowed. The result is minimal: no
// victim can be spared. nullopt when even all allowed candidates do not
// make the preemptor fit (then nobody is preempted).
std::optional<std::vector<int>> ChooseVictims(
    int candidates, const std::function<bool(const std::vector<int>& chosen)>& fits,
    const std::function<bool(int candidate, const std::vector<int>& chosen)>& allowed);

}  // namespace loom::scheduling

#endif  // LOOM_CONTROLLER_SCHEDULING_PREEMPTION_H_
