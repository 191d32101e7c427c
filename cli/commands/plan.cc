// `loomctl plan SPEC [--topology T]`: layouts for a job spec, planned
// offline on a topology file (cli/plan_command.h) or by the controller on
// the live cluster (the Plan RPC) (cli/commands/commands.h).
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/plan_command.h"
#include "common/jobspec.h"
#include "controller/planner/topology_yaml.h"

namespace loom::cli {
namespace {

// `loomctl plan SPEC` without --topology: the controller plans on the live
// cluster (its registered workers) through the Plan RPC.
int PlanOnController(const Globals& g, const loom::v1::JobSpec& spec, const PlanCommandOptions& o,
                     bool executable_only) {
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::PlanRequest req;
  *req.mutable_spec() = spec;
  req.set_top_k(o.top_k);
  req.set_executable_only(executable_only);
  loom::v1::PlanResponse resp;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::Plan, req, &resp);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    resp.clear_report();  // the structured fields say it all
    std::cout << ToJson(resp) << std::endl;
  } else {
    std::cout << resp.report();
  }
  return 0;
}

}  // namespace

int CmdPlan(const Globals& g, const std::vector<std::string>& args) {
  std::string spec_path, topology_path;
  PlanCommandOptions o;
  o.json = g.json;
  bool executable_only = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--executable-only") {
      executable_only = true;
    } else if ((args[i] == "--topology" || args[i] == "--cluster") && i + 1 < args.size()) {
      // --cluster FILE: the cluster described by a topology file (an older
      // spelling); without either flag the live cluster is asked.
      topology_path = args[++i];
    } else if (args[i] == "--top" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &o.top_k) || o.top_k < 1) return Usage("--top: expected >= 1");
    } else if (args[i] == "--tokens" && i + 1 < args.size()) {
      if (!absl::SimpleAtod(args[++i], &o.token_budget) || o.token_budget < 0) {
        return Usage("--tokens: expected a token count");
      }
    } else if (!args[i].empty() && args[i][0] == '-') {
      return Usage("plan: unknown flag " + args[i]);
    } else if (spec_path.empty()) {
      spec_path = args[i];
    } else {
      return Usage("plan: one spec at a time");
    }
  }
  if (spec_path.empty()) return Usage("plan: expected SPEC [--topology TOPOLOGY.yaml]");
  auto spec = LoadJobSpecFile(spec_path);
  if (!spec.ok()) return Fail(spec.status());
  if (topology_path.empty()) {
    if (o.token_budget > 0) return Usage("plan: --tokens needs --topology (offline planning)");
    return PlanOnController(g, *spec, o, executable_only);
  }
  if (executable_only) return Usage("plan: --executable-only applies to the live cluster only");
  const auto& par = spec->parallelism();
  o.evaluate_spec_layout =
      !par.auto_() && (par.data() > 0 || par.tensor() > 0 || par.pipeline() > 0);
  ApplyJobSpecDefaults(&*spec);
  // As the Plan RPC does: what a plan needs (no schedule, up to the
  // planner's device count, layouts Loom does not execute yet), with the
  // field path of any malformed value.
  if (absl::Status valid = ValidatePlanSpec(*spec); !valid.ok()) return Fail(valid);
  auto topology = planner::LoadTopologyFile(topology_path);
  if (!topology.ok()) {
    return Fail(absl::Status(topology.status().code(),
                             absl::StrCat(topology_path, ": ", topology.status().message())));
  }
  auto report = RunPlan(*spec, *topology, o);
  if (!report.ok()) return Fail(report.status());
  std::cout << *report;
  return 0;
}

}  // namespace loom::cli
