#include "controller/planner/planner.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace loom::planner {

namespace {

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> small, large;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i != 0) continue;
    small.push_back(i);
    if (i != n / i) large.push_back(n / i);
  }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

// "layout.dp: 24 does not divide ..." -> "dp 24 does not divide ...": a
// CheckLayout() reason said of one candidate shape.
std::string ShapeReason(absl::string_view message) {
  constexpr absl::string_view kPrefix = "layout.";
  if (!absl::StartsWith(message, kPrefix)) return std::string(message);
  message.remove_prefix(kPrefix.size());
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos) return std::string(message);
  return absl::StrCat(message.substr(0, colon), " ", message.substr(colon + 2));
}

// ": tp 1 x pp 1 x dp 384: dp 384 does not divide ...; tp 2 x ...", the
// first kMaxListed shapes and how many more there were.
std::string ListShapes(const std::vector<std::string>& shapes) {
  constexpr size_t kMaxListed = 12;
  if (shapes.empty()) return "";
  std::string out = ": ";
  for (size_t i = 0; i < shapes.size() && i < kMaxListed; ++i) {
    absl::StrAppend(&out, i > 0 ? "; " : "", shapes[i]);
  }
  if (shapes.size() > kMaxListed) {
    absl::StrAppend(&out, "; and ", shapes.size() - kMaxListed, " more shapes");
  }
  return out;
}

// Ranking: faster first; ties go to less memory, then the simpler layout.
bool Better(const LayoutEvaluation& a, const LayoutEvaluation& b) {
  if (a.step.step_seconds != b.step.step_seconds) {
    return a.step.step_seconds < b.step.step_seconds;
  }
  if (a.memory.total() != b.memory.total()) return a.memory.total() < b.memory.total();
  const Layout& x = a.layout;
  const Layout& y = b.layout;
  return std::make_tuple(x.tp, x.pp, x.zero_stage, x.virtual_stages, x.micro_batch,
                         static_cast<int>(x.recompute)) <
         std::make_tuple(y.tp, y.pp, y.zero_stage, y.virtual_stages, y.micro_batch,
                         static_cast<int>(y.recompute));
}

absl::Status CheckPolicy(const PlannerOptions& options, const ClusterTopology& topology,
                         const Layout& layout) {
  if (layout.tp > topology.devices_per_node && !options.allow_tp_across_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.tp: ", layout.tp, " spans ", layout.tp / topology.devices_per_node,
        " nodes; tensor-parallel groups stay inside one node (", topology.devices_per_node,
        " devices) unless allow_tp_across_nodes is set"));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const PlannerOptions& o) {
  auto invalid = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("options.", field, ": ", why));
  };
  if (o.top_k < 1) return invalid("top_k", "must be >= 1");
  if (o.recompute.empty()) return invalid("recompute", "must list at least one mode");
  if (o.zero_stages.empty()) return invalid("zero_stages", "must list at least one stage");
  for (int z : o.zero_stages) {
    if (z < 0 || z > 3) return invalid("zero_stages", "stages are 0..3");
  }
  if (o.max_virtual_stages < 0) return invalid("max_virtual_stages", "must be >= 0");
  if (o.max_micro_batch < 0) return invalid("max_micro_batch", "must be >= 0");
  if (o.tp < 0 || o.pp < 0 || o.dp < 0 || o.virtual_stages < 0 || o.micro_batch < 0) {
    return invalid("tp/pp/dp/virtual_stages/micro_batch", "must be >= 0 (0 = search)");
  }
  return absl::OkStatus();
}

// Keeps the k best evaluations, best first.
void InsertTop(const LayoutEvaluation& eval, size_t k, std::vector<LayoutEvaluation>* top) {
  if (top->size() >= k && !Better(eval, top->back())) return;
  auto at = std::lower_bound(top->begin(), top->end(), eval, Better);
  top->insert(at, eval);
  if (top->size() > k) top->pop_back();
}

std::vector<WhatIf> WhatIfs(const CostModel& cost, const PlannerOptions& options,
                            const Layout& best) {
  std::vector<std::pair<std::string, Layout>> variants;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (r == best.recompute) continue;
    Layout l = best;
    l.recompute = r;
    variants.emplace_back(absl::StrCat("recompute ", RecomputeName(r)), l);
  }
  if (best.dp > 1) {
    for (int z = 0; z <= 3; ++z) {
      if (z == best.zero_stage) continue;
      Layout l = best;
      l.zero_stage = z;
      variants.emplace_back(absl::StrCat("ZeRO-", z), l);
    }
  }
  const std::vector<int64_t> mbs = Divisors(cost.training().global_batch_sequences / best.dp);
  auto at = std::find(mbs.begin(), mbs.end(), best.micro_batch);
  if (at != mbs.begin() && at != mbs.end()) {
    Layout l = best;
    l.micro_batch = *(at - 1);
    variants.emplace_back(absl::StrCat("micro-batch ", l.micro_batch), l);
  }
  if (at != mbs.end() && at + 1 != mbs.end()) {
    Layout l = best;
    l.micro_batch = *(at + 1);
    variants.emplace_back(absl::StrCat("micro-batch ", l.micro_batch), l);
  }
  if (best.pp > 1 && cost.model().n_layer % best.pp == 0) {  // interleaving needs equal stages
    const std::vector<int64_t> vs = Divisors(cost.model().n_layer / best.pp);
    auto v = std::find(vs.begin(), vs.end(), best.virtual_stages);
    if (best.virtual_stages != 1) {
      Layout l = best;
      l.virtual_stages = 1;
      variants.emplace_back("no interleaving (v 1)", l);
    }
    if (v != vs.end() && v + 1 != vs.end()) {
      Layout l = best;
      l.virtual_stages = static_cast<int>(*(v + 1));
      variants.emplace_back(absl::StrCat("interleaving v ", l.virtual_stages), l);
    }
  }
  if (best.tp > 1) {
    Layout l = best;
    l.sequence_parallel = !best.sequence_parallel;
    variants.emplace_back(best.sequence_parallel ? "sequence parallelism off"
                                                 : "sequence parallelism on",
                          l);
  }
  std::vector<WhatIf> result;
  for (const auto& [change, layout] : variants) {
    WhatIf what_if;
    what_if.change = change;
    absl::Status valid = cost.CheckLayout(layout);
    if (valid.ok()) valid = CheckPolicy(options, cost.topology(), layout);
    what_if.valid = valid.ok();
    if (valid.ok()) {
      what_if.evaluation = cost.Evaluate(layout);
    } else {
      what_if.invalid_reason = std::string(valid.message());
    }
    result.push_back(std::move(what_if));
  }
  return result;
}

}  // namespace

absl::StatusOr<LayoutEvaluation> EvaluateLayout(const PlanRequest& request,
                                                const Layout& layout) {
  RETURN_IF_ERROR(ValidateOptions(request.options));
  ASSIGN_OR_RETURN(CostModel cost, CostModel::Create(request.model, request.training,
                                                     request.topology, request.options.cost));
  RETURN_IF_ERROR(cost.CheckLayout(layout));
  RETURN_IF_ERROR(CheckPolicy(request.options, request.topology, layout));
  return cost.Evaluate(layout);
}

absl::StatusOr<Plan> MakePlan(const PlanRequest& request) {
  const PlannerOptions& options = request.options;
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(CostModel cost, CostModel::Create(request.model, request.training,
                                                     request.topology, options.cost));
  const ClusterTopology& topology = request.topology;
  const int64_t n = topology.total_devices();
  const int64_t batch = request.training.global_batch_sequences;
  const double usable = cost.UsableBytes();
  const double capacity = static_cast<double>(topology.device.memory_bytes);

  Plan plan;
  // Why each (tp, pp, dp) shape that was ruled out before any layout of it
  // could be evaluated was ruled out, in search order.
  std::vector<std::string> invalid_shapes;
  std::vector<ShapeResult> shapes;
  for (int64_t tp : Divisors(n)) {
    if (options.tp > 0 && tp != options.tp) continue;
    if (options.tp_must_divide > 0 && options.tp_must_divide % tp != 0) continue;
    if (options.tp_kv_heads > 0 && options.tp_kv_heads % tp != 0 && tp % options.tp_kv_heads != 0) {
      continue;
    }
    if (tp > topology.devices_per_node && !options.allow_tp_across_nodes) continue;
    // Every pp the devices allow, up to one layer per stage: stages need not
    // be equal (CostModel::StageLayers splits the layers as the engine does).
    for (int64_t pp : Divisors(n / tp)) {
      if (pp > request.model.n_layer) break;
      if (options.pp > 0 && pp != options.pp) continue;
      const int64_t dp = n / tp / pp;
      if (options.dp > 0 && dp != options.dp) continue;
      Layout base;
      base.tp = static_cast<int>(tp);
      base.pp = static_cast<int>(pp);
      base.dp = static_cast<int>(dp);
      base.sequence_parallel = options.sequence_parallel && tp > 1;
      const std::string shape_name = absl::StrCat("tp ", tp, " x pp ", pp, " x dp ", dp);
      if (absl::Status shape_ok = cost.CheckLayout(base); !shape_ok.ok()) {
        invalid_shapes.push_back(
            absl::StrCat(shape_name, ": ", ShapeReason(shape_ok.message())));
        continue;
      }
      std::vector<int64_t> mbs;
      for (int64_t mb : Divisors(batch / dp)) {
        if (options.max_micro_batch > 0 && mb > options.max_micro_batch) break;
        if (options.micro_batch > 0 && mb != options.micro_batch) continue;
        mbs.push_back(mb);
      }
      if (mbs.empty()) {
        invalid_shapes.push_back(absl::StrCat(
            shape_name, ": ",
            options.micro_batch > 0
                ? absl::StrCat("micro-batch ", options.micro_batch, " does not divide the ",
                               batch / dp, " sequences per replica")
                : absl::StrCat("no micro-batch up to ", options.max_micro_batch,
                               " divides the ", batch / dp, " sequences per replica")));
        continue;
      }
      // Interleaving needs pp > 1 and equal stages of v equal chunks.
      const bool can_interleave = pp > 1 && request.model.n_layer % pp == 0;
      std::vector<int> vs;
      for (int64_t v : can_interleave ? Divisors(request.model.n_layer / pp)
                                      : std::vector<int64_t>{1}) {
        if (options.max_virtual_stages > 0 && v > options.max_virtual_stages) break;
        if (options.virtual_stages > 0 && v != options.virtual_stages) continue;
        vs.push_back(static_cast<int>(v));
      }
      ShapeResult shape;
      bool have_shape = false;
      auto note_infeasible = [&](const LayoutEvaluation& eval) {
        if (shape.fits) return;
        if (!have_shape || eval.memory.total() < shape.best.memory.total()) {
          shape.best = eval;
          have_shape = true;
        }
      };
      bool zero_done_for_dp1 = false;
      for (int zero : options.zero_stages) {
        if (dp == 1) {  // ZeRO shards over DP: with one replica every stage is the same
          if (zero_done_for_dp1) continue;
          zero_done_for_dp1 = true;
        }
        Layout z = base;
        z.zero_stage = zero;
        plan.stats.candidates += static_cast<int64_t>(vs.size() * options.recompute.size() *
                                                      mbs.size());
        if (options.prune && cost.StateBytes(z) > usable) {
          if (!shape.fits && !mbs.empty()) {
            Layout r = z;
            r.micro_batch = mbs.front();
            r.recompute = options.recompute.back();
            note_infeasible(cost.Evaluate(r));
          }
          continue;
        }
        for (int v : vs) {
          for (Recompute recompute : options.recompute) {
            for (int64_t mb : mbs) {
              Layout c = z;
              c.virtual_stages = v;
              c.recompute = recompute;
              c.micro_batch = mb;
              if (v > 1 && (batch / dp / mb) % pp != 0) continue;
              ++plan.stats.memory_checked;
              if (options.prune) {
                const MemoryBreakdown memory = cost.Memory(c);
                if (memory.total() > capacity) {
                  // Memory only grows with the micro-batch: stop this branch.
                  if (!shape.fits && (!have_shape || memory.total() < shape.best.memory.total())) {
                    note_infeasible(cost.Evaluate(c));
                  }
                  break;
                }
              }
              ++plan.stats.fully_evaluated;
              LayoutEvaluation eval = cost.Evaluate(c);
              if (!eval.fits) {
                note_infeasible(eval);
                continue;
              }
              ++plan.stats.feasible;
              if (!shape.fits || Better(eval, shape.best)) {
                shape.fits = true;
                shape.best = eval;
                have_shape = true;
              }
              InsertTop(eval, static_cast<size_t>(options.top_k), &plan.top);
            }
          }
        }
      }
      if (have_shape) shapes.push_back(std::move(shape));
    }
  }

  if (shapes.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no valid layout of ", n, " devices for this model and batch of ", batch,
        " sequences", ListShapes(invalid_shapes)));
  }
  std::sort(shapes.begin(), shapes.end(), [](const ShapeResult& a, const ShapeResult& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return Better(a.best, b.best);
    return a.best.memory.total() < b.best.memory.total();
  });
  if (plan.top.empty()) {
    const LayoutEvaluation& closest = shapes.front().best;
    const std::string cluster =
        topology.nodes == 1
            ? absl::StrCat(topology.devices_per_node, " x ", topology.device.name)
            : absl::StrCat(topology.nodes, " nodes x ", topology.devices_per_node, " ",
                           topology.device.name);
    return absl::FailedPreconditionError(
        absl::StrCat("no layout fits in memory on ", cluster, ": the least memory-hungry, ",
                     LayoutToString(closest.layout), ", ", closest.infeasible_reason));
  }
  plan.shapes = std::move(shapes);
  plan.best = plan.top.front();
  ASSIGN_OR_RETURN(plan.placement, PlaceRanks(plan.best.layout, topology));
  plan.what_if = WhatIfs(cost, options, plan.best.layout);
  if (options.sweep_devices && options.dp == 0) {
    // Nothing fitting on fewer devices is no error here: the full count fits.
    ASSIGN_OR_RETURN(plan.device_sweep, SweepDevices(request, options.sweep));
  }
  return plan;
}

}  // namespace loom::planner
