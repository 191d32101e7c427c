// Human- and machine-readable renderings of a plan, for `loomctl plan` and
// for storing with a job: the chosen layout and why, the iron-law
// estimates, memory and step-time breakdowns, the top-k alternatives, the
// best layout per (tp, pp, dp) shape, one-knob what-ifs, and the placement.
//
// Text is plain ASCII tables meant to be pasted into a design doc; JSON has
// every number in base units (bytes, seconds, FLOPs) and field names that
// say the unit. Pure functions; thread-safe.
#ifndef LOOM_CONTROLLER_PLANNER_REPORT_H_
#define LOOM_CONTROLLER_PLANNER_REPORT_H_

#include <string>
#include <vector>

#include "controller/planner/cost_model.h"
#include "controller/planner/planner.h"

namespace loom::planner {

struct ReportOptions {
  int placement_rows = 16;  // rank-table rows in the text report (0 = none)
  bool full_placement_in_json = true;  // every rank in the JSON report
};

// Sentences explaining why plan.best was chosen over the alternatives.
std::vector<std::string> ExplainPlan(const PlanRequest& request, const Plan& plan);

// The full plan as text tables.
std::string FormatPlanText(const PlanRequest& request, const Plan& plan,
                           const ReportOptions& options = {});
// The full plan as one JSON object (pretty-printed).
std::string FormatPlanJson(const PlanRequest& request, const Plan& plan,
                           const ReportOptions& options = {});

// One evaluated layout (an explicit layout from a job spec): whether it fits
// and why not, estimates, and the breakdowns.
std::string FormatEvaluationText(const PlanRequest& request, const LayoutEvaluation& eval);
std::string FormatEvaluationJson(const PlanRequest& request, const LayoutEvaluation& eval);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_REPORT_H_
