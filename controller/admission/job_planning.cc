#include "controller/admission/job_planning.h"

#include <algorithm>
#include <numeric>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/jobspec.h"
#include "controller/planner/report.h"
#include "controller/admission/scheduler.h"

namespace loom::controller {
namespace {

double Gb(double bytes) { return bytes / 1e9; }

// The degree a user most likely has to change when the spec's layout does
// not fit: the model-parallel one they set, else the data-parallel one.
std::string LayoutFieldPath(const loom::v1::JobSpec& spec) {
  if (spec.parallelism().tensor() > 1) return "parallelism.tensor";
  if (spec.parallelism().pipeline() > 1) return "parallelism.pipeline";
  return "parallelism.data";
}

}  // namespace

planner::Recompute SpecRecompute(const loom::v1::JobSpec& spec) {
  return spec.activation_checkpointing() != 0 ? planner::Recompute::kFull
                                              : planner::Recompute::kNone;
}

absl::StatusOr<planner::PlanRequest> SpecToPlanRequest(const loom::v1::JobSpec& spec,
                                                       const planner::ClusterTopology& topology,
                                                       int top_k, double token_budget) {
  if (!spec.model().has_gpt() && !spec.model().has_llama()) {
    return absl::InvalidArgumentError("model: required (model.gpt or model.llama)");
  }
  const loom::v1::GptModel g = EffectiveDecoder(spec.model());
  planner::PlanRequest req;
  // The one description of the model's shape (common/model_shape.h).
  req.model = ModelShapeOf(spec.model());
  req.model.name = spec.name();
  req.training.global_batch_sequences = spec.batch().global_batch();
  switch (spec.precision()) {
    case loom::v1::BF16:
      req.training.precision = planner::Precision::kBf16;
      break;
    case loom::v1::FP16:
      req.training.precision = planner::Precision::kFp16;
      break;
    default:
      req.training.precision = planner::Precision::kFp32;
  }
  req.training.optimizer = planner::Optimizer::kAdamW;
  req.training.token_budget =
      token_budget > 0 ? token_budget
                       : static_cast<double>(spec.schedule().total_steps()) *
                             spec.batch().global_batch() * g.seq_len();
  req.topology = topology;
  req.options.top_k = top_k;
  return req;
}

// What the engine executes (worker/engine/parallel/layout_engine.h):
// tensor parallelism inside a node without sequence parallelism, pipeline
// parallelism with the plain (not interleaved) 1F1B schedule, ZeRO 0-2, on
// CPU ranks; GPU ranks and dropout under TP run data parallelism only.
// Recompute: the engine checkpoints whole blocks (activation_checkpointing
// 1 keeps each block's input and reruns the block in backward: the
// planner's full recompute), so the search may choose none or full; a spec
// that sets activation_checkpointing keeps it (counted as full). The spec's
// micro-batch is kept as it is.
void RestrictToExecutable(const loom::v1::JobSpec& spec, planner::PlannerOptions* options) {
  options->allow_tp_across_nodes = false;
  options->sequence_parallel = false;
  options->virtual_stages = 1;
  options->recompute = {SpecRecompute(spec)};
  if (spec.activation_checkpointing() == 0) {
    options->recompute.push_back(planner::Recompute::kFull);
  }
  // ZeRO-3 does not execute (ValidateJobSpec refuses it).
  options->zero_stages = {0, 1, 2};
  const loom::v1::GptModel model = EffectiveDecoder(spec.model());
  if (model.dropout() > 0) options->tp = 1;
  // MLP columns are split across a tensor group, and key/value heads split
  // or copied: only such degrees execute (ValidateSupported).
  const ModelShape shape = ModelShapeOf(spec.model());
  options->tp_must_divide = FfnHidden(shape);
  options->tp_kv_heads = KvHeads(shape);
  if (spec.resources().gpus_per_rank() > 0) {
    options->tp = 1;
    options->pp = 1;
    options->zero_stages = {0};
  }
  if (spec.batch().micro_batch() > 0) options->micro_batch = spec.batch().micro_batch();
}

constexpr char kExecutableSearchNote[] =
    "layouts Loom executes (tensor parallelism inside a worker, no sequence parallelism; "
    "pipeline 1F1B, not interleaved; ZeRO 0-2; CPU ranks; recompute none or full (activation "
    "checkpointing of every block); the spec's micro-batch)";

planner::Layout SpecLayout(const loom::v1::JobSpec& spec) {
  const auto& par = spec.parallelism();
  planner::Layout layout;
  layout.dp = par.data() > 0 ? par.data() : 1;
  layout.tp = par.tensor() > 0 ? par.tensor() : 1;
  layout.pp = par.pipeline() > 0 ? par.pipeline() : 1;
  layout.micro_batch = spec.batch().micro_batch() > 0 ? spec.batch().micro_batch() : 1;
  layout.zero_stage = par.zero_stage();
  layout.recompute = SpecRecompute(spec);
  layout.virtual_stages = par.virtual_stages() > 1 ? par.virtual_stages() : 1;
  layout.sequence_parallel = par.sequence_parallel();
  return layout;
}

loom::v1::PlannedLayout ToProto(const planner::LayoutEvaluation& e) {
  loom::v1::PlannedLayout p;
  p.set_tensor(e.layout.tp);
  p.set_pipeline(e.layout.pp);
  p.set_data(e.layout.dp);
  p.set_virtual_stages(e.layout.virtual_stages);
  p.set_micro_batch(e.layout.micro_batch);
  p.set_recompute(std::string(planner::RecomputeName(e.layout.recompute)));
  p.set_zero_stage(e.layout.zero_stage);
  p.set_sequence_parallel(e.layout.sequence_parallel);
  p.set_fits(e.fits);
  p.set_infeasible_reason(e.infeasible_reason);
  const auto& m = e.memory;
  p.set_weights_bytes(m.weights);
  p.set_gradients_bytes(m.gradients);
  p.set_master_weights_bytes(m.master_weights);
  p.set_optimizer_state_bytes(m.optimizer_states);
  p.set_activation_bytes(m.activations);
  p.set_other_bytes(m.recompute_workspace + m.logits + m.gathered_parameters +
                    m.checkpoint_staging + m.reserve);
  p.set_total_bytes(m.total());
  p.set_device_memory_bytes(m.capacity);
  p.set_summary(planner::LayoutToString(e.layout));
  // A layout that does not fit has no step time, throughput or MFU: those
  // fields stay unset (zero).
  if (!e.fits) return p;
  const auto& t = e.time;
  p.set_step_seconds(e.step.step_seconds);
  p.set_compute_seconds(t.compute);
  p.set_recompute_seconds(t.recompute);
  p.set_tensor_parallel_comm_seconds(t.tensor_parallel_comm);
  p.set_pipeline_p2p_seconds(t.pipeline_p2p);
  p.set_pipeline_bubble_seconds(t.pipeline_bubble);
  p.set_data_parallel_comm_seconds(t.data_parallel_comm);
  p.set_data_parallel_exposed_seconds(t.data_parallel_exposed);
  p.set_optimizer_seconds(t.optimizer);
  p.set_tokens_per_second(e.step.tokens_per_second);
  p.set_mfu(e.step.mfu);
  p.set_train_seconds(e.run.train_seconds);
  return p;
}

void AddDeviceSweep(const planner::DeviceSweep& sweep, loom::v1::PlanResponse* resp) {
  if (sweep.counts.empty()) return;
  for (const auto& c : sweep.counts) {
    auto* row = resp->add_device_counts();
    row->set_devices(c.devices);
    row->set_fits(c.fits);
    row->set_reason(c.reason);
    if (!c.fits) continue;
    *row->mutable_best() = ToProto(c.best);
    row->set_device_hours(c.best.run.device_hours);
    row->set_cost_usd(c.best.run.cost_usd);
  }
  resp->set_recommended_devices(sweep.counts[sweep.recommended].devices);
  resp->set_device_count_rule(sweep.rule);
  resp->set_device_count_summary(sweep.summary);
}

absl::StatusOr<loom::v1::PlanResponse> PlanSpec(const loom::v1::JobSpec& spec,
                                                const LiveTopology& topology, int top_k,
                                                bool executable_only) {
  auto req = SpecToPlanRequest(spec, topology.topology, top_k);
  if (!req.ok()) return req.status();
  if (executable_only) RestrictToExecutable(spec, &req->options);
  req->options.sweep_devices = true;  // how many of the devices pay
  loom::v1::PlanResponse resp;
  resp.set_topology(topology.description);
  resp.set_topology_measured(topology.measured);
  std::string header = absl::StrCat("Cluster: ", topology.description, "\n");
  if (!topology.measured) {
    absl::StrAppend(&header,
                    "Note: some device figures are estimates (see controller/admission/job_planning.h).\n");
  }
  if (executable_only) {
    absl::StrAppend(&header, "Search restricted to ", kExecutableSearchNote, ".\n");
  }
  absl::StrAppend(&header, "\n");
  auto plan = planner::MakePlan(*req);
  bool has_spec_layout = !spec.parallelism().auto_();
  if (plan.ok()) {
    *resp.mutable_chosen() = ToProto(plan->best);
    for (const auto& e : plan->top) *resp.add_alternatives() = ToProto(e);
    AddDeviceSweep(plan->device_sweep, &resp);
    resp.set_report(absl::StrCat(header, planner::FormatPlanText(*req, *plan)));
  } else if (!has_spec_layout) {
    return plan.status();
  } else {
    resp.set_report(absl::StrCat(header, "no plan: ", plan.status().message(), "\n"));
  }
  if (has_spec_layout) {
    auto eval = planner::EvaluateLayout(*req, SpecLayout(spec));
    if (eval.ok()) {
      *resp.mutable_spec_layout() = ToProto(*eval);
      absl::StrAppend(resp.mutable_report(),
                      "\nThe spec's own layout (parallelism.data/tensor/pipeline):\n",
                      planner::FormatEvaluationText(*req, *eval));
    } else {
      absl::StrAppend(resp.mutable_report(), "\nThe spec's own layout is not valid: ",
                      eval.status().message(), "\n");
    }
  }
  return resp;
}

absl::StatusOr<loom::v1::JobPlan> PlanAtSubmit(loom::v1::JobSpec* spec,
                                               const LiveTopology& topology) {
  constexpr int kAlternatives = 3;
  auto req = SpecToPlanRequest(*spec, topology.topology, kAlternatives + 1);
  if (!req.ok()) return req.status();
  loom::v1::JobPlan plan;
  plan.set_topology(topology.description);
  plan.set_topology_measured(topology.measured);
  if (spec->parallelism().auto_()) {
    plan.set_auto_(true);
    RestrictToExecutable(*spec, &req->options);
    plan.add_notes(absl::StrCat("parallelism.auto: searched the ", kExecutableSearchNote));
    auto made = planner::MakePlan(*req);
    if (!made.ok()) {
      if (made.status().code() != absl::StatusCode::kFailedPrecondition) return made.status();
      if (topology.measured) {
        return absl::InvalidArgumentError(
            absl::StrCat("parallelism.auto: no executable layout fits on ", topology.description,
                         ": ", made.status().message()));
      }
      // Estimated figures are not grounds to refuse a job; record why the
      // plan is empty and let the scheduler try.
      plan.add_notes(absl::StrCat("no layout fits the estimated figures: ",
                                  made.status().message()));
      auto eval = planner::EvaluateLayout(*req, SpecLayout(*spec));
      if (eval.ok()) *plan.mutable_layout() = ToProto(*eval);
      return plan;
    }
    *plan.mutable_layout() = ToProto(made->best);
    for (size_t i = 1; i < made->top.size(); ++i) *plan.add_alternatives() = ToProto(made->top[i]);
    for (const auto& line : planner::ExplainPlan(*req, *made)) plan.add_notes(line);
    auto* par = spec->mutable_parallelism();
    par->set_data(made->best.layout.dp);
    par->set_tensor(made->best.layout.tp);
    par->set_pipeline(made->best.layout.pp);
    par->set_zero_stage(made->best.layout.zero_stage);
    if (made->best.layout.recompute == planner::Recompute::kFull &&
        spec->activation_checkpointing() == 0) {
      spec->set_activation_checkpointing(1);  // every block: full recompute
    }
    spec->mutable_batch()->set_micro_batch(static_cast<int32_t>(made->best.layout.micro_batch));
    return plan;
  }
  auto eval = planner::EvaluateLayout(*req, SpecLayout(*spec));
  if (!eval.ok()) {
    // The planner's structural rules (e.g. a degree that does not divide
    // the heads) name "layout.<field>"; say which spec field that is.
    return absl::InvalidArgumentError(
        absl::StrCat(LayoutFieldPath(*spec), ": ", eval.status().message()));
  }
  *plan.mutable_layout() = ToProto(*eval);
  if (!eval->fits) {
    if (topology.measured) {
      const auto& m = eval->memory;
      bool state_too_big = m.state() + m.reserve >= m.capacity;
      return absl::InvalidArgumentError(absl::StrCat(
          LayoutFieldPath(*spec), ": layout ", planner::LayoutToString(eval->layout),
          " does not fit on ", topology.description, ": ", eval->infeasible_reason,
          state_too_big
              ? " (the training state alone does not fit: shard it with tensor or pipeline "
                "parallelism or ZeRO-1/2 over more ranks, let parallelism.auto choose, or use "
                "workers with more memory per slot)"
              : " (lower batch.micro_batch to shrink the activations)"));
    }
    plan.add_notes(absl::StrCat("does not fit the estimated figures: ", eval->infeasible_reason));
  }
  return plan;
}

absl::Status ExplainUnexecutableLayout(const loom::v1::JobSpec& spec,
                                       const LiveTopology& topology,
                                       const absl::Status& unimplemented) {
  if (!topology.measured) return unimplemented;
  auto req = SpecToPlanRequest(spec, topology.topology, 1);
  if (!req.ok()) return unimplemented;
  auto eval = planner::EvaluateLayout(*req, SpecLayout(spec));
  if (!eval.ok() || eval->fits) return unimplemented;
  return absl::InvalidArgumentError(absl::StrCat(
      LayoutFieldPath(spec), ": layout ", planner::LayoutToString(eval->layout),
      " does not fit on ", topology.description, ": ", eval->infeasible_reason,
      " (and, as asked, it cannot run yet: ", unimplemented.message(), ")"));
}

std::string FormatJobPlan(const loom::v1::JobPlan& plan) {
  std::string out;
  // A layout that does not fit has no step time, throughput or MFU to show.
  auto row = [&](const loom::v1::PlannedLayout& l) {
    if (!l.fits()) {
      return absl::StrFormat("%-60s %8.1f GB  DOES NOT FIT", l.summary(), Gb(l.total_bytes()));
    }
    return absl::StrFormat("%-60s %8.1f GB %10.4f s %12.0f tok/s  MFU %5.1f%%", l.summary(),
                           Gb(l.total_bytes()), l.step_seconds(), l.tokens_per_second(),
                           100 * l.mfu());
  };
  const auto& l = plan.layout();
  absl::StrAppend(&out, "  ", plan.auto_() ? "chosen (parallelism.auto)" : "evaluated (spec)",
                  " on ", plan.topology(), "\n");
  absl::StrAppend(&out, "    ", row(l), "\n");
  if (!l.fits() && !l.infeasible_reason().empty()) {
    absl::StrAppend(&out, "    ", l.infeasible_reason(), "\n");
  }
  absl::StrAppend(
      &out,
      absl::StrFormat("    memory/device: weights %.3f GB, grads %.3f GB, master %.3f GB, "
                      "optimizer %.3f GB, activations %.3f GB, other %.3f GB of %.1f GB\n",
                      Gb(l.weights_bytes()), Gb(l.gradients_bytes()),
                      Gb(l.master_weights_bytes()), Gb(l.optimizer_state_bytes()),
                      Gb(l.activation_bytes()), Gb(l.other_bytes()),
                      Gb(l.device_memory_bytes())));
  if (l.fits()) {
    absl::StrAppend(
      &out, absl::StrFormat("    step: compute %.4f s, bubble %.4f s, comm %.4f s (TP %.4f, "
                            "PP %.4f, DP exposed %.4f), optimizer %.4f s\n",
                            l.compute_seconds(), l.pipeline_bubble_seconds(),
                            l.tensor_parallel_comm_seconds() + l.pipeline_p2p_seconds() +
                                l.data_parallel_exposed_seconds(),
                            l.tensor_parallel_comm_seconds(), l.pipeline_p2p_seconds(),
                            l.data_parallel_exposed_seconds(), l.optimizer_seconds()));
  }
  for (const auto& a : plan.alternatives()) absl::StrAppend(&out, "    alt ", row(a), "\n");
  for (const auto& n : plan.notes()) absl::StrAppend(&out, "    - ", n, "\n");
  return out;
}

}  // namespace loom::controller
