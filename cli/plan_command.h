// `loomctl plan`: turns a job spec and a cluster topology into a planner
// request and formats the plan. Kept apart from loomctl_main.cc so it can be
// tested as a library.
#ifndef LOOM_CLI_PLAN_COMMAND_H_
#define LOOM_CLI_PLAN_COMMAND_H_

#include <string>

#include "absl/status/statusor.h"
#include "controller/planner/planner.h"
#include "loom/v1/job.pb.h"

namespace loom::cli {

struct PlanCommandOptions {
  int top_k = 5;
  double token_budget = 0;  // 0 = total_steps x global_batch x seq_len of the spec
  bool json = false;
  // Also evaluate the spec's own parallelism.data/tensor/pipeline (the user
  // wrote them; defaults filled in do not count).
  bool evaluate_spec_layout = false;
};

// Planner input for a (defaulted, validated) spec on `topology`.
// INVALID_ARGUMENT with a field path if the spec has no GPT model.
absl::StatusOr<planner::PlanRequest> PlanRequestFromSpec(const loom::v1::JobSpec& spec,
                                                         const planner::ClusterTopology& topology,
                                                         const PlanCommandOptions& options);

// The report: the plan with its device-count sweep (which devices pay,
// planner/device_sweep.h), and with evaluate_spec_layout that layout's
// evaluation too. FAILED_PRECONDITION (with the planner's reason) when no
// layout fits and there is no spec layout to report on.
absl::StatusOr<std::string> RunPlan(const loom::v1::JobSpec& spec,
                                    const planner::ClusterTopology& topology,
                                    const PlanCommandOptions& options);

}  // namespace loom::cli

#endif  // LOOM_CLI_PLAN_COMMAND_H_
