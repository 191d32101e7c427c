// The chaos bench's check of an elastic job's losses against uninterrupted
// runs of the same spec on fixed 2-rank and 3-rank gangs.
//
// Those two runs are not bitwise alike: their losses agree within 2e-16
// while their parameters are equal (steps 1-14 of the bench's job), then
// the all-reduced gradient's sum over 2 or 3 ranks rounds a last bit
// differently, and the difference grows in jumps: measured 1.6e-7 apart at
// step 48, 6.8e-4 at step 49, 1.4% at step 77 (most likely AdamW's
// m / sqrt(v), which scales a gradient near zero up to a full-size update).
// So a check across layouts is a check of the re-plan only where the
// parameters are still equal:
//   - every committed step up to the first step trained under another
//     layout than the job's first must equal that layout's run's loss bit
//     for bit: the grow, the kill and the shrink in between (resumed from
//     the grow's checkpoint) must change nothing;
//   - each re-plan from a checkpoint within that prefix must report, for
//     its first step, that run's loss within 1e-12: the same parameters and
//     data batch under any layout (neighbouring batches' losses are a
//     median 3.8% apart);
//   - later steps, which follow a different trajectory once a bit differs,
//     must stay within a bound (the bench: 10%) of the last layout's run.
#ifndef LOOM_BENCH_ELASTIC_CHECK_H_
#define LOOM_BENCH_ELASTIC_CHECK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/v1/service.pb.h"

namespace loom::bench {

// Step -> loss.
using Losses = std::map<int64_t, double>;

struct ElasticCheck {
  bool layouts_known = false;  // every layout generation's ranks read from the events
  int first_ranks = 0;         // the job's first layout's data-parallel degree
  int64_t prefix = 0;          // committed steps 1..prefix all ran under first_ranks
  double prefix_diff = 0;      // worst relative difference there (0: bit-exact)
  int checked = 0;             // re-plans from inside the prefix whose first step was compared
  int past_prefix = 0;         // re-plans from a checkpoint past the prefix (not compared)
  int unreported = 0;          // re-plans whose attempt never reported its first step
  double first_step_diff = 0;  // worst relative difference of those first steps
  double later = 0;            // worst relative difference past the prefix, to `last_ranks`' run
  std::vector<std::string> replans;  // "<cause> from <checkpoint>", in order

  // Bit-exact prefix, at least one re-plan's first step within 1e-12, later
  // steps within `later_bound`.
  bool ok(double later_bound = 0.10) const;
};

// The data-parallel degree a REPLANNED event's layout names ("tp 1 | pp 1 |
// dp 3 | ..."), or 0.
int DataParallelOf(const std::string& layout);

// `done`: the finished job (its events and layout generation); `records`:
// its step records in report order (several per step when attempts replayed
// it; the last is the committed one); `refs`: uninterrupted runs by their
// ranks; `last_ranks`: the reference for steps past the prefix.
ElasticCheck CheckElasticLosses(const loom::v1::Job& done,
                                const loom::v1::GetStepMetricsResponse& records,
                                const std::map<int, Losses>& refs, int last_ranks);

}  // namespace loom::bench

#endif  // LOOM_BENCH_ELASTIC_CHECK_H_
