// The published-runs regression suite: large training runs from
// papers and reports (testdata/published_runs.yaml, each with its source),
// each written as a job spec and a topology the way a user would, and put
// through what `loomctl plan SPEC --topology T` does: plan validation
// (common/jobspec_validate.h), then the planner with its device sweep. For
// every run:
//   1. parallelism.auto plans (no schedule, no micro-batch given);
//   2. the published layout, pinned completely (tp, pp, dp, micro-batch,
//      ZeRO stage, recompute, interleaving, sequence parallelism), validates
//      and fits;
//   3. the chosen layout is at least as fast as the published one under the
//      planner's own model, keeps TP inside a node, and its MFU lies in
//      [0.25, 0.70];
//   4. where the source reports TFLOP/s per device (or MFU), the planner's
//      figure for the published layout is within +-25% of it.
// The table is printed; a failing row names the check that broke. Plan time
// is printed, not asserted (no timed assertions in unit tests): the bench
// `./bench/run.sh published-plans` holds each plan to under a second.
#include "controller/planner/published_runs.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/jobspec.h"
#include "controller/planner/planner.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

constexpr double kMinMfu = 0.25;
constexpr double kMaxMfu = 0.70;
constexpr double kReportedTolerance = 0.25;

std::vector<PublishedRun> LoadRuns() {
  absl::StatusOr<std::vector<PublishedRun>> runs =
      LoadPublishedRuns(LOOM_SOURCE_DIR "/controller/planner/testdata/published_runs.yaml");
  EXPECT_TRUE(runs.ok()) << runs.status();
  return runs.ok() ? *runs : std::vector<PublishedRun>{};
}

TEST(PublishedRunsTest, CoverTheRangeTheIssueAsksFor) {
  const std::vector<PublishedRun> runs = LoadRuns();
  ASSERT_GE(runs.size(), 10u);
  int64_t fewest = INT64_MAX, most = 0;
  std::set<std::string> styles, devices;
  bool gqa = false, gated = false, untied = false;
  for (const PublishedRun& run : runs) {
    fewest = std::min(fewest, run.devices());
    most = std::max(most, run.devices());
    styles.insert(run.style);
    devices.insert(run.topology.device.name);
    const ModelShape& m = run.request.model;
    gqa |= m.n_kv_head > 0 && m.n_kv_head < m.n_head;
    gated |= m.gated_mlp;
    untied |= !m.tied_embeddings;
    EXPECT_FALSE(run.source.empty()) << run.name << ": no source";
  }
  EXPECT_LE(fewest, 8);
  EXPECT_GE(most, 16384);
  for (const char* style : {"gpt", "bloom", "llama"}) EXPECT_EQ(styles.count(style), 1u) << style;
  for (const char* device : {"V100", "A100-40GB", "A100-80GB", "H100-SXM"}) {
    if (std::string(device) == "A100-40GB") continue;  // either A100 counts
    EXPECT_EQ(devices.count(device), 1u) << device;
  }
  EXPECT_TRUE(gqa && gated && untied) << "grouped-query attention, gated MLP, untied embeddings";
}

// "8x16x64 mb1 v1 none Z1 SP": tp x pp x dp, micro-batch, interleaving,
// recompute, ZeRO stage, sequence parallelism; for the table.
std::string Compact(const Layout& l) {
  return absl::StrCat(l.tp, "x", l.pp, "x", l.dp, " mb", l.micro_batch, " v", l.virtual_stages,
                      " ", RecomputeName(l.recompute), " Z", l.zero_stage,
                      l.sequence_parallel ? " SP" : "");
}

// Where the published layout's predicted step goes, for a row whose
// prediction is off: "step 12.3 s = compute 9.1 (recompute 2.2) + TP 0.4 +
// PP 0.1 + bubble 2.0 + DP 0.6 + optimizer 0.1".
std::string StepParts(const TimeBreakdown& t) {
  return absl::StrFormat(
      "step %.3g s = compute %.3g (recompute %.3g) + TP %.3g + PP %.3g + bubble %.3g + DP "
      "%.3g + optimizer %.3g, %lld micro-batches",
      t.step(), t.compute, t.recompute, t.tensor_parallel_comm, t.pipeline_p2p, t.pipeline_bubble,
      t.data_parallel_exposed, t.optimizer, static_cast<long long>(t.micro_batches));
}

// One row of the printed table, and what broke.
struct Row {
  std::string name;
  int64_t devices = 0;
  std::string chosen;
  std::string published;
  double chosen_mfu = 0;
  double published_mfu = 0;
  std::string versus_reported = "-";
  double plan_seconds = 0;
  // (check, what broke): checks "auto", "published", "fits", "speed",
  // "tp_in_node", "mfu_range", "reported".
  std::vector<std::pair<std::string, std::string>> broke;
};

Row Check(const PublishedRun& run) {
  Row row;
  row.name = run.name;
  row.devices = run.devices();
  auto broke = [&row](const std::string& check, const std::string& what) {
    row.broke.emplace_back(check, what);
  };

  // 1. parallelism.auto, as `loomctl plan` runs it (with the device sweep).
  absl::Status valid = ValidatePlanSpec(run.auto_spec);
  if (!valid.ok()) {
    broke("auto", absl::StrCat("auto spec refused: ", valid.ToString()));
    return row;
  }
  PlanRequest request = run.request;
  request.options.sweep_devices = true;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Plan> plan = MakePlan(request);
  row.plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!plan.ok()) {
    broke("auto", absl::StrCat("auto does not plan: ", plan.status().ToString()));
    return row;
  }
  const LayoutEvaluation& chosen = plan->best;
  row.chosen = Compact(chosen.layout);
  row.chosen_mfu = chosen.step.mfu;

  // 3, the chosen layout on its own: TP inside a node, MFU in range.
  if (chosen.layout.tp > run.topology.devices_per_node ||
      plan->placement.tp_groups_within_one_node != plan->placement.tp_groups) {
    broke("tp_in_node", absl::StrCat("chosen tp ", chosen.layout.tp, " leaves the node (",
                                     plan->placement.tp_groups_within_one_node, " of ",
                                     plan->placement.tp_groups, " TP groups inside one)"));
  }
  if (chosen.step.mfu < kMinMfu || chosen.step.mfu > kMaxMfu) {
    broke("mfu_range", absl::StrFormat("chosen MFU %.3f outside [%.2f, %.2f]", chosen.step.mfu,
                                       kMinMfu, kMaxMfu));
  }

  // 2. The published layout, pinned.
  row.published = Compact(run.published);
  if (absl::Status v = ValidatePlanSpec(run.published_spec); !v.ok()) {
    broke("published", absl::StrCat("published spec refused: ", v.ToString()));
  }
  absl::StatusOr<LayoutEvaluation> published = EvaluateLayout(run.request, run.published);
  if (!published.ok()) {
    broke("published", absl::StrCat("published layout invalid: ", published.status().ToString()));
    return row;
  }
  if (!published->fits) {
    broke("fits", absl::StrCat("published layout does not fit: ", published->infeasible_reason));
    return row;
  }
  row.published_mfu = published->step.mfu;

  // 3. The chosen layout against the published one.
  if (chosen.step.tokens_per_second < published->step.tokens_per_second * (1 - 1e-9)) {
    broke("speed",
          absl::StrFormat("chosen %.0f tok/s is slower than published %.0f tok/s",
                          chosen.step.tokens_per_second, published->step.tokens_per_second));
  }
  // 4. Against what the source reports.
  const double step = published->step.step_seconds;
  const double devices = static_cast<double>(run.devices());
  if (run.reported_tflops_per_device > 0) {
    const double flops = run.reported_counts_recompute ? published->step.hardware_flops_per_step
                                                       : published->step.model_flops_per_step;
    const double predicted = flops / step / devices / 1e12;
    const double ratio = predicted / run.reported_tflops_per_device;
    row.versus_reported =
        absl::StrFormat("%.0f/%.0f TF (%.2f)", predicted, run.reported_tflops_per_device, ratio);
    if (std::abs(ratio - 1) > kReportedTolerance) {
      broke("reported",
            absl::StrFormat("predicted %.0f TFLOP/s per device vs reported %.0f (%+.0f%%); %s",
                            predicted, run.reported_tflops_per_device, 100 * (ratio - 1),
                            StepParts(published->time)));
    }
  } else if (run.reported_mfu > 0) {
    const double ratio = published->step.mfu / run.reported_mfu;
    row.versus_reported =
        absl::StrFormat("MFU %.3f/%.3f (%.2f)", published->step.mfu, run.reported_mfu, ratio);
    if (std::abs(ratio - 1) > kReportedTolerance) {
      broke("reported", absl::StrFormat("predicted MFU %.3f vs reported %.3f (%+.0f%%); %s",
                                        published->step.mfu, run.reported_mfu, 100 * (ratio - 1),
                                        StepParts(published->time)));
    }
  }
  return row;
}

TEST(PublishedRunsTest, AutoPlansAndBeatsThePublishedLayout) {
  const std::vector<PublishedRun> runs = LoadRuns();
  ASSERT_FALSE(runs.empty());
  std::printf("| %-30s | %6s | %-28s | %-28s | %6s | %6s | %-24s | %7s |\n", "run", "devices",
              "chosen (tp x pp x dp ...)", "published", "MFU", "pubMFU",
              "published vs reported", "plan s");
  for (const PublishedRun& run : runs) {
    const Row row = Check(run);
    std::printf("| %-30s | %6lld | %-28s | %-28s | %6.3f | %6.3f | %-24s | %7.3f |\n",
                row.name.c_str(), static_cast<long long>(row.devices), row.chosen.c_str(),
                row.published.c_str(), row.chosen_mfu, row.published_mfu,
                row.versus_reported.c_str(), row.plan_seconds);
    // A known gap (the data file's known_gaps, each with its reason) must
    // still be one: when the model improves, the file says so.
    for (const auto& [check, what] : row.broke) {
      if (run.known_gaps.count(check) > 0) {
        std::printf("  %s: known gap (%s): %s\n", run.name.c_str(),
                    run.known_gaps.at(check).c_str(), what.c_str());
      } else {
        ADD_FAILURE() << run.name << " (" << run.source << "): " << check << ": " << what;
      }
    }
    for (const auto& [check, why] : run.known_gaps) {
      const bool still = std::any_of(row.broke.begin(), row.broke.end(),
                                     [&](const auto& b) { return b.first == check; });
      EXPECT_TRUE(still) << run.name << ": the known gap \"" << check
                         << "\" no longer breaks; remove it from published_runs.yaml (" << why
                         << ")";
    }
  }
  for (const PublishedRun& run : runs)
    std::printf("  %s: %s\n", run.name.c_str(), run.source.c_str());
}

}  // namespace
}  // namespace loom::planner
