// The JSON half of report.h.
#include <string>

#include "common/json_writer.h"
#include "controller/planner/report.h"

namespace loom::planner {

namespace {

void WriteLayout(const Layout& l, JsonWriter* w) {
  w->BeginObject();
  w->Field("tp", l.tp);
  w->Field("pp", l.pp);
  w->Field("dp", l.dp);
  w->Field("micro_batch", static_cast<double>(l.micro_batch));
  w->Field("virtual_stages", l.virtual_stages);
  w->Field("recompute", std::string(RecomputeName(l.recompute)));
  w->Field("zero_stage", l.zero_stage);
  w->Field("sequence_parallel", l.sequence_parallel);
  w->EndObject();
}

void WriteEvaluation(const LayoutEvaluation& e, JsonWriter* w) {
  w->BeginObject();
  w->Key("layout");
  WriteLayout(e.layout, w);
  w->Field("fits", e.fits);
  w->Field("infeasible_reason", e.infeasible_reason);
  const MemoryBreakdown& m = e.memory;
  w->Key("memory_bytes");
  w->BeginObject();
  w->Field("stage", m.stage);
  w->Field("layers", m.layers);
  w->Field("parameters", m.parameters);
  w->Field("weights", m.weights);
  w->Field("gradients", m.gradients);
  w->Field("master_weights", m.master_weights);
  w->Field("optimizer_states", m.optimizer_states);
  w->Field("activations", m.activations);
  w->Field("recompute_workspace", m.recompute_workspace);
  w->Field("logits", m.logits);
  w->Field("gathered_parameters", m.gathered_parameters);
  w->Field("checkpoint_staging", m.checkpoint_staging);
  w->Field("reserve", m.reserve);
  w->Field("total", m.total());
  w->Field("capacity", m.capacity);
  w->EndObject();
  // A layout that does not fit has no step time, throughput or MFU: the
  // time and estimate objects are left out.
  if (!e.fits) {
    w->EndObject();
    return;
  }
  const TimeBreakdown& t = e.time;
  w->Field("micro_batches", static_cast<double>(t.micro_batches));
  w->Field("bottleneck_stage", t.bottleneck_stage);
  w->Field("bottleneck_layers", t.bottleneck_layers);
  w->Field("gemm_efficiency", t.gemm_efficiency);
  w->Key("time_seconds");
  w->BeginObject();
  w->Field("compute", t.compute);
  w->Field("recompute", t.recompute);
  w->Field("tensor_parallel_comm", t.tensor_parallel_comm);
  w->Field("pipeline_p2p", t.pipeline_p2p);
  w->Field("pipeline_bubble", t.pipeline_bubble);
  w->Field("data_parallel_comm", t.data_parallel_comm);
  w->Field("data_parallel_exposed", t.data_parallel_exposed);
  w->Field("optimizer", t.optimizer);
  w->Field("step", t.step());
  w->EndObject();
  w->Key("estimate");
  w->BeginObject();
  w->Field("step_seconds", e.step.step_seconds);
  w->Field("tokens_per_second", e.step.tokens_per_second);
  w->Field("model_flops_per_step", e.step.model_flops_per_step);
  w->Field("hardware_flops_per_step", e.step.hardware_flops_per_step);
  w->Field("mfu", e.step.mfu);
  w->Field("hfu", e.step.hfu);
  w->Field("train_seconds", e.run.train_seconds);
  w->Field("device_hours", e.run.device_hours);
  w->Field("cost_usd", e.run.cost_usd);
  w->Field("fleet_power_watts", e.run.fleet_power_watts);
  w->Field("energy_kwh", e.run.energy_kwh);
  w->EndObject();
  w->EndObject();
}

}  // namespace

std::string FormatEvaluationJson(const PlanRequest&, const LayoutEvaluation& eval) {
  JsonWriter w;
  WriteEvaluation(eval, &w);
  return w.Finish();
}

std::string FormatPlanJson(const PlanRequest& request, const Plan& plan,
                           const ReportOptions& options) {
  JsonWriter w;
  w.BeginObject();
  w.Field("model", request.model.name);
  w.Field("parameters", static_cast<double>(CountParameters(request.model).total));
  w.Field("topology", request.topology.name);
  w.Field("devices", request.topology.total_devices());
  w.Key("best");
  WriteEvaluation(plan.best, &w);
  w.Key("why");
  w.BeginArray();
  for (const std::string& line : ExplainPlan(request, plan)) w.Value(line);
  w.EndArray();
  w.Key("top");
  w.BeginArray();
  for (const LayoutEvaluation& e : plan.top) WriteEvaluation(e, &w);
  w.EndArray();
  w.Key("shapes");
  w.BeginArray();
  for (const ShapeResult& s : plan.shapes) WriteEvaluation(s.best, &w);
  w.EndArray();
  w.Key("what_if");
  w.BeginArray();
  for (const WhatIf& x : plan.what_if) {
    w.BeginObject();
    w.Field("change", x.change);
    w.Field("valid", x.valid);
    if (!x.valid) w.Field("invalid_reason", x.invalid_reason);
    if (x.valid) {
      w.Key("evaluation");
      WriteEvaluation(x.evaluation, &w);
    }
    w.EndObject();
  }
  w.EndArray();
  const DeviceSweep& sweep = plan.device_sweep;
  if (!sweep.counts.empty()) {
    // Devices that don't pay (device_sweep.h): the best layout per count.
    w.Key("device_sweep");
    w.BeginObject();
    w.Field("rule", sweep.rule);
    w.Field("summary", sweep.summary);
    w.Field("recommended_devices", sweep.counts[sweep.recommended].devices);
    w.Field("fastest_devices", sweep.counts[sweep.fastest].devices);
    w.Field("cheapest_devices", sweep.counts[sweep.cheapest].devices);
    w.Key("counts");
    w.BeginArray();
    for (const DeviceCountResult& c : sweep.counts) {
      w.BeginObject();
      w.Field("devices", c.devices);
      w.Field("nodes", c.nodes);
      w.Field("devices_per_node", c.devices_per_node);
      w.Field("fits", c.fits);
      if (!c.fits) w.Field("reason", c.reason);
      if (c.fits) {
        w.Key("best");
        WriteEvaluation(c.best, &w);
      }
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.Key("search");
  w.BeginObject();
  w.Field("candidates", static_cast<double>(plan.stats.candidates));
  w.Field("memory_checked", static_cast<double>(plan.stats.memory_checked));
  w.Field("fully_evaluated", static_cast<double>(plan.stats.fully_evaluated));
  w.Field("feasible", static_cast<double>(plan.stats.feasible));
  w.EndObject();
  const Placement& p = plan.placement;
  w.Key("placement");
  w.BeginObject();
  w.Field("tp_groups", p.tp_groups);
  w.Field("tp_groups_within_one_node", p.tp_groups_within_one_node);
  w.Field("pp_groups", p.pp_groups);
  w.Field("pp_groups_within_one_node", p.pp_groups_within_one_node);
  w.Field("pp_groups_within_one_rack", p.pp_groups_within_one_rack);
  w.Field("dp_groups", p.dp_groups);
  w.Field("max_nodes_per_dp_group", p.max_nodes_per_dp_group);
  if (options.full_placement_in_json) {
    w.Key("ranks");  // [rank, node, device, rack, tp_rank, pp_rank, dp_rank]
    w.BeginArray();
    for (const RankPlacement& r : p.ranks) {
      w.InlineInts({r.rank, r.node, r.device, r.rack, r.tp_rank, r.pp_rank, r.dp_rank});
    }
    w.EndArray();
  }
  w.EndObject();
  w.EndObject();
  return w.Finish();
}

}  // namespace loom::planner
