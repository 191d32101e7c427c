// Planning-time benchmark: plan the 1008B-parameter GPT of
// Narayanan et al. 2021, Table 1 on 3072 A100-80GB (384 nodes x 8) over the
// full search space, and compare with a baseline measured in the same run:
// the same search with pruning off, i.e. every candidate layout evaluated
// fully (memory and time). Both return the same plan (planner_test.cc
// checks this); the ratio is baseline time / planner time, so machine
// noise mostly cancels. The budget is 1 s per plan.
//
// Prints one summary line per figure; the last is
//   planner: <figure> ratio=<baseline / planner>
// Usage: loom_planner_bench [repetitions] (default 30; the median is used).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/plan_timing.h"
#include "controller/planner/planner.h"
#include "controller/planner/test_models.h"

using loom::planner::MakeTopology;
using loom::planner::Plan;
using loom::planner::PlanRequest;

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 30;
  const auto& row = loom::planner::test_models::kMegatronRows[3];  // 1008B, 3072 GPUs
  PlanRequest request;
  request.model =
      loom::planner::test_models::MegatronGpt(row.name, row.layers, row.hidden, row.heads);
  request.training.global_batch_sequences = row.batch;
  absl::StatusOr<loom::planner::ClusterTopology> topology =
      MakeTopology("A100-80GB", row.gpus / 8, 8, 25e9);
  if (!topology.ok()) {
    std::fprintf(stderr, "planner: %s\n", topology.status().ToString().c_str());
    return 1;
  }
  request.topology = *topology;

  Plan plan, baseline_plan;
  loom::bench::MedianPlanSeconds(request, 3, &plan, "planner");  // warm-up
  const double planner_s = loom::bench::MedianPlanSeconds(request, repetitions, &plan, "planner");
  PlanRequest exhaustive = request;
  exhaustive.options.prune = false;
  const double baseline_s =
      loom::bench::MedianPlanSeconds(exhaustive, repetitions, &baseline_plan, "planner");

  const double candidates = static_cast<double>(plan.stats.candidates);
  const double layouts_per_s = candidates / planner_s;
  std::printf(
      "planner: %s on %d x A100-80GB, full search: %.0f layouts, %lld fully evaluated, "
      "%lld fit\n",
      row.name, row.gpus, candidates, static_cast<long long>(plan.stats.fully_evaluated),
      static_cast<long long>(plan.stats.feasible));
  std::printf("planner: chosen %s, %.1f s/step, MFU %.1f%%\n",
              loom::planner::LayoutToString(plan.best.layout).c_str(), plan.best.step.step_seconds,
              plan.best.step.mfu * 100);
  std::printf(
      "planner: plan time %.3f ms (median of %d), %.2fM layouts/s, %.4f of the 1 s budget\n",
      planner_s * 1e3, repetitions, layouts_per_s / 1e6, planner_s / 1.0);
  std::printf("planner: baseline (no pruning, every layout evaluated) %.3f ms, same plan: %s\n",
              baseline_s * 1e3, plan.best.layout == baseline_plan.best.layout ? "yes" : "NO");
  std::printf("planner: plan_1008B_3072gpu_ms=%.3f layouts_per_s=%.3g ratio=%.2f\n",
              planner_s * 1e3, layouts_per_s, baseline_s / planner_s);
  return plan.best.layout == baseline_plan.best.layout ? 0 : 1;
}
