// Timing plans for the planner benchmarks (planner_bench.cc,
// published_plans_bench.cc). Header-only.
#ifndef LOOM_BENCH_PLAN_TIMING_H_
#define LOOM_BENCH_PLAN_TIMING_H_

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "controller/planner/planner.h"

namespace loom::bench {

// Median wall time of `repetitions` (>= 1) plans of `request`, in seconds;
// the last plan in `last`. A plan that fails prints "<name>: <status>" and
// exits 1.
inline double MedianPlanSeconds(const planner::PlanRequest& request, int repetitions,
                                planner::Plan* last, const char* name) {
  std::vector<double> seconds;
  for (int i = 0; i < repetitions; ++i) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(request);
    const auto stop = std::chrono::steady_clock::now();
    if (!plan.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, plan.status().ToString().c_str());
      std::exit(1);
    }
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
    *last = *std::move(plan);
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace loom::bench

#endif  // LOOM_BENCH_PLAN_TIMING_H_
