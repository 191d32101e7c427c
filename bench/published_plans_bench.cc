// Planning time of the published runs: every run of
// controller/planner/testdata/published_runs.yaml planned as `loomctl plan
// SPEC --topology T` plans it (parallelism.auto, with the device sweep),
// against a baseline measured in the same run: the same plans with pruning
// off (every candidate layout evaluated fully; the answer is the same). The
// issue's budget is 1 s per plan; a plan over it fails the bench (exit 1).
//
// Prints one line per run and, last,
//   published_plans: slowest_plan_s=<s> ratio=<baseline total / planner total>
// Usage: loom_published_plans_bench DATA_FILE [repetitions] (default 3;
// the median is used).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/plan_timing.h"
#include "controller/planner/published_runs.h"

using loom::planner::Plan;
using loom::planner::PlanRequest;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DATA_FILE [repetitions]\n", argv[0]);
    return 2;
  }
  const int repetitions = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  auto runs = loom::planner::LoadPublishedRuns(argv[1]);
  if (!runs.ok()) {
    std::fprintf(stderr, "published_plans: %s\n", runs.status().ToString().c_str());
    return 1;
  }
  double planner_total = 0, baseline_total = 0, slowest = 0;
  std::string slowest_run;
  bool same = true;
  for (const auto& run : *runs) {
    PlanRequest request = run.request;
    request.options.sweep_devices = true;  // as loomctl plans
    Plan plan, baseline;
    const double planner_s =
        loom::bench::MedianPlanSeconds(request, repetitions, &plan, "published_plans");
    PlanRequest exhaustive = request;
    exhaustive.options.prune = false;
    const double baseline_s =
        loom::bench::MedianPlanSeconds(exhaustive, repetitions, &baseline, "published_plans");
    same = same && plan.best.layout == baseline.best.layout;
    planner_total += planner_s;
    baseline_total += baseline_s;
    if (planner_s > slowest) {
      slowest = planner_s;
      slowest_run = run.name;
    }
    std::printf(
        "published_plans: %-22s %6lld devices  plan %8.3f ms  unpruned "
        "%8.3f ms  "
        "chosen %s\n",
        run.name.c_str(), static_cast<long long>(run.devices()), planner_s * 1e3, baseline_s * 1e3,
        loom::planner::LayoutToString(plan.best.layout).c_str());
  }
  std::printf("published_plans: %zu runs, slowest %s, same plans unpruned: %s\n", runs->size(),
              slowest_run.c_str(), same ? "yes" : "NO");
  std::printf("published_plans: slowest_plan_s=%.3f ratio=%.2f\n", slowest,
              baseline_total / planner_total);
  return same && slowest < 1.0 ? 0 : 1;
}
