#include "cli/plan_command.h"

#include "absl/strings/str_cat.h"
#include "controller/admission/job_planning.h"
#include "controller/planner/report.h"

namespace loom::cli {

absl::StatusOr<planner::PlanRequest> PlanRequestFromSpec(const loom::v1::JobSpec& spec,
                                                         const planner::ClusterTopology& topology,
                                                         const PlanCommandOptions& options) {
  // One conversion for loomctl and the controller.
  return controller::SpecToPlanRequest(spec, topology, options.top_k, options.token_budget);
}

absl::StatusOr<std::string> RunPlan(const loom::v1::JobSpec& spec,
                                    const planner::ClusterTopology& topology,
                                    const PlanCommandOptions& options) {
  auto req = PlanRequestFromSpec(spec, topology, options);
  if (!req.ok()) return req.status();
  req->options.sweep_devices = true;  // how many of the devices pay
  bool explicit_layout = options.evaluate_spec_layout;
  std::string out;
  auto plan = planner::MakePlan(*req);
  if (plan.ok()) {
    out = options.json ? planner::FormatPlanJson(*req, *plan) : planner::FormatPlanText(*req, *plan);
  } else if (!explicit_layout) {
    return plan.status();
  } else {
    out = absl::StrCat("no plan: ", plan.status().message(), "\n");
  }
  if (explicit_layout) {
    // The same reading of the spec as the controller's at submit (ZeRO
    // stage and activation checkpointing included).
    auto eval = planner::EvaluateLayout(*req, controller::SpecLayout(spec));
    if (!eval.ok()) return eval.status();
    if (options.json) {
      // One JSON document: the plan and the spec's own layout side by side.
      out = absl::StrCat("{\"plan\": ", plan.ok() ? out : "null",
                         ", \"spec_layout\": ", planner::FormatEvaluationJson(*req, *eval), "}\n");
    } else {
      absl::StrAppend(&out, "\nThe spec's own layout (parallelism.data/tensor/pipeline):\n",
                      planner::FormatEvaluationText(*req, *eval));
    }
  }
  return out;
}

}  // namespace loom::cli
