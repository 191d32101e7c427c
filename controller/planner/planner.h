// The parallelism planner: picks tensor/pipeline/data-parallel degrees,
// micro-batch size, pipeline interleaving, activation recompute and ZeRO
// stage for a model on a cluster, from the analytical cost model
// (cost_model.h), and places the ranks (placement.h).
//
//   PlanRequest request{model, training, topology, options};
//   ASSIGN_OR_RETURN(Plan plan, MakePlan(request));
//   std::cout << FormatPlanText(request, plan);       // report.h
//
// Search: every tp dividing the devices per node (or, when allowed, whole
// nodes) and the heads; every pp dividing N / tp up to the layer count
// (stages may be uneven, split as the engine splits them); dp = N / (tp pp)
// dividing the global batch; every interleaving v dividing the layers per
// stage (equal stages only); every micro-batch size dividing the
// per-replica batch; recompute none/selective/full; ZeRO 0-3, with or
// without pipeline parallelism. Layouts that do not fit
// are dropped (memory only grows with the micro-batch, so a branch stops at
// the first micro-batch that does not fit); the rest are ranked by
// estimated step time.
//
// Pure functions of their arguments; thread-safe.
#ifndef LOOM_CONTROLLER_PLANNER_PLANNER_H_
#define LOOM_CONTROLLER_PLANNER_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/planner/cost_model.h"
#include "controller/planner/device_sweep.h"
#include "controller/planner/model.h"
#include "controller/planner/placement.h"
#include "controller/planner/topology.h"

namespace loom::planner {

struct PlannerOptions {
  int top_k = 5;                       // alternatives to keep, best included
  bool allow_tp_across_nodes = false;  // TP groups may span whole nodes
  bool sequence_parallel = true;       // use sequence parallelism when tp > 1
  // Search space.
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kSelective,
                                      Recompute::kFull};
  std::vector<int> zero_stages = {0, 1, 2, 3};
  int max_virtual_stages = 0;          // 0 = no cap
  int64_t max_micro_batch = 0;         // 0 = no cap
  // Constraints: 0 = search this dimension, > 0 = fixed to this value.
  int tp = 0;
  // > 0: only tensor degrees that divide it (what an engine that splits
  // MLP columns can run).
  int64_t tp_must_divide = 0;
  // > 0: only tensor degrees that divide these key/value heads or that they
  // divide (an engine that splits them, or copies each to several ranks).
  int64_t tp_kv_heads = 0;
  int pp = 0;
  int dp = 0;
  int virtual_stages = 0;
  int64_t micro_batch = 0;
  // false = evaluate every candidate fully (the benchmark's baseline);
  // the result is the same.
  bool prune = true;
  // Also plan on fewer devices and recommend a count (device_sweep.h):
  // Plan::device_sweep. Off by default (it plans once per count); `loomctl
  // plan` and the Plan RPC turn it on. Ignored when dp is pinned.
  bool sweep_devices = false;
  DeviceSweepOptions sweep;
  CostOptions cost;
};

struct PlanRequest {
  ModelSpec model;
  TrainingSpec training;
  ClusterTopology topology;
  PlannerOptions options;
};

// The best layout found for one (tp, pp, dp) shape: the fastest that fits,
// or, when none fits, the one needing the least memory (with its reason).
struct ShapeResult {
  bool fits = false;
  LayoutEvaluation best;
};

// One knob of the chosen layout changed, everything else kept.
struct WhatIf {
  std::string change;        // e.g. "recompute none", "micro-batch 2"
  bool valid = false;        // false: the layout itself is not allowed
  std::string invalid_reason;
  LayoutEvaluation evaluation;  // when valid
};

struct SearchStats {
  int64_t candidates = 0;        // layouts in the search space
  int64_t memory_checked = 0;    // candidates whose memory was computed
  int64_t fully_evaluated = 0;   // candidates whose time was computed
  int64_t feasible = 0;          // candidates that fit
};

struct Plan {
  LayoutEvaluation best;
  std::vector<LayoutEvaluation> top;   // fastest first; top[0] == best
  std::vector<ShapeResult> shapes;     // fitting shapes fastest first, then the rest
  std::vector<WhatIf> what_if;         // one-knob changes of `best`
  Placement placement;                 // of `best`
  SearchStats stats;
  // options.sweep_devices: the best layout per device count and the count
  // recommended; `counts` is empty otherwise. `best` above always uses
  // every device.
  DeviceSweep device_sweep;
};

// Plans. Returns:
//   INVALID_ARGUMENT   the model, training, topology or options are invalid
//                      (message starts with the field path);
//   FAILED_PRECONDITION nothing fits, e.g. "no layout fits in memory on
//                      1 x A100-80GB: the least memory-hungry, tp 1 | pp 1 |
//                      dp 1 | ..., needs 112.0 GB
//                      per device before activations, device has 80 GB",
//                      or no layout is valid, or the device lacks the
//                      precision.
absl::StatusOr<Plan> MakePlan(const PlanRequest& request);

// Evaluates one explicit layout (e.g. a job spec's). INVALID_ARGUMENT when
// the layout is not allowed ("layout.tp: ..."); otherwise the evaluation,
// whose `fits` and `infeasible_reason` say whether it can run.
// `sequence_parallel` is taken from the layout, not the options.
absl::StatusOr<LayoutEvaluation> EvaluateLayout(const PlanRequest& request,
                                                const Layout& layout);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_PLANNER_H_
