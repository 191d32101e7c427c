#include "controller/planner/report.h"

#include <cstdio>
#include <string>

#include "common/json_writer.h"
#include "controller/planner/test_models.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace loom::planner {
namespace {

using test_models::kMegatronRows;
using test_models::MegatronGpt;

PlanRequest MegatronRequest(int row_index) {
  const auto& row = kMegatronRows[row_index];
  PlanRequest request;
  request.model = MegatronGpt(row.name, row.layers, row.hidden, row.heads);
  request.training.global_batch_sequences = row.batch;
  request.training.token_budget = 450e9;
  absl::StatusOr<ClusterTopology> topo = MakeTopology("A100-80GB", row.gpus / 8, 8, 25e9);
  EXPECT_TRUE(topo.ok());
  request.topology = *topo;
  request.topology.price_per_device_hour_usd = 2.0;
  request.topology.host_power_watts = 2500;
  request.topology.nodes_per_rack = 4;
  return request;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(ReportTest, TextHasEverySection) {
  const PlanRequest request = MegatronRequest(0);
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok());
  const std::string text = FormatPlanText(request, *plan);
  EXPECT_TRUE(Contains(text, "Model     GPT 18.4B, 18.4B parameters: 40 layers")) << text;
  EXPECT_TRUE(Contains(text, "Chosen layout\n  " + LayoutToString(plan->best.layout) + "\n"));
  EXPECT_TRUE(Contains(text, "\nWhy\n  - Fits: "));
  EXPECT_TRUE(Contains(text, "Pure data parallelism (dp 256)"));
  EXPECT_TRUE(Contains(text, "time to train 450.0B tokens"));
  EXPECT_TRUE(Contains(text, "cost at $2/device-hour"));
  EXPECT_TRUE(Contains(text, "kWh"));
  EXPECT_TRUE(Contains(text, "Memory per device, stage "));
  EXPECT_TRUE(Contains(text, "Step time, "));
  EXPECT_TRUE(Contains(text, "\nTop 5 layouts\n"));
  EXPECT_TRUE(Contains(text, "\nBest layout per shape\n"));
  EXPECT_TRUE(Contains(text, "\nWhat if (one change to the chosen layout)\n"));
  EXPECT_TRUE(Contains(text, absl::StrCat("TP groups within one node: ", plan->placement.tp_groups,
                                          "/", plan->placement.tp_groups)));
  EXPECT_TRUE(Contains(text, "within one rack: "));
  EXPECT_TRUE(Contains(text, "... 240 more ranks (full table: -o json)"));
}

TEST(ReportTest, JsonIsValidAndCarriesTheNumbers) {
  const PlanRequest request = MegatronRequest(1);
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok());
  const std::string json = FormatPlanJson(request, *plan);
  YAML::Node root = YAML::Load(json);  // JSON is YAML flow style
  EXPECT_EQ(root["devices"].as<int>(), 1536);
  EXPECT_EQ(root["best"]["layout"]["tp"].as<int>(), plan->best.layout.tp);
  EXPECT_EQ(root["best"]["layout"]["recompute"].as<std::string>(),
            RecomputeName(plan->best.layout.recompute));
  EXPECT_NEAR(root["best"]["estimate"]["step_seconds"].as<double>(), plan->best.step.step_seconds,
              1e-9 * plan->best.step.step_seconds);
  EXPECT_NEAR(root["best"]["memory_bytes"]["total"].as<double>(), plan->best.memory.total(),
              1e-9 * plan->best.memory.total());
  EXPECT_EQ(root["best"]["micro_batches"].as<int>(), plan->best.time.micro_batches);
  EXPECT_EQ(root["top"].size(), plan->top.size());
  EXPECT_EQ(root["shapes"].size(), plan->shapes.size());
  EXPECT_EQ(root["placement"]["ranks"].size(), 1536u);
  EXPECT_EQ(root["placement"]["ranks"][9][0].as<int>(), 9);
  EXPECT_GE(root["why"].size(), 2u);
}

TEST(ReportTest, InfeasibleEvaluationSaysWhy) {
  PlanRequest request = MegatronRequest(3);
  Layout layout;
  layout.tp = 8;
  layout.pp = 64;
  layout.dp = 6;  // no recompute, micro-batch 1
  absl::StatusOr<LayoutEvaluation> eval = EvaluateLayout(request, layout);
  ASSERT_TRUE(eval.ok());
  const std::string text = FormatEvaluationText(request, *eval);
  EXPECT_TRUE(Contains(text, "  does not fit: needs ")) << text;
  // No throughput or MFU for a layout that cannot run: the reason instead.
  EXPECT_TRUE(Contains(text, "No estimate: the layout does not fit (" + eval->infeasible_reason +
                                 "), so it has no step time, throughput or MFU."))
      << text;
  EXPECT_FALSE(Contains(text, "tokens/s")) << text;
  EXPECT_FALSE(Contains(text, "MFU (")) << text;
  EXPECT_FALSE(Contains(text, "time to train")) << text;
  EXPECT_FALSE(Contains(text, "Step time")) << text;
  EXPECT_TRUE(Contains(text, "Memory per device, stage 0 of 64 (2 layers)")) << text;
  YAML::Node root = YAML::Load(FormatEvaluationJson(request, *eval));
  EXPECT_FALSE(root["fits"].as<bool>());
  EXPECT_EQ(root["infeasible_reason"].as<std::string>(), eval->infeasible_reason);
  EXPECT_FALSE(root["estimate"]) << "no throughput or MFU in JSON either";
  EXPECT_FALSE(root["time_seconds"]);
  EXPECT_NEAR(root["memory_bytes"]["total"].as<double>(), eval->memory.total(),
              1e-9 * eval->memory.total());
}

TEST(ReportTest, PlanShapesThatDoNotFitShowNoEstimates) {
  PlanRequest request = MegatronRequest(3);
  request.options.zero_stages = {0, 1};  // 1T: then pure DP does not fit
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok());
  YAML::Node root = YAML::Load(FormatPlanJson(request, *plan));
  int infeasible = 0;
  for (const YAML::Node& shape : root["shapes"]) {
    if (shape["fits"].as<bool>()) {
      EXPECT_GT(shape["estimate"]["mfu"].as<double>(), 0);
    } else {
      ++infeasible;
      EXPECT_FALSE(shape["estimate"]);
    }
  }
  EXPECT_GT(infeasible, 0);
}

// Devices that don't pay: the 1T GPT with a batch of 3,072 on
// 131,072 A100s, swept, in text and JSON.
TEST(ReportTest, DeviceSweepIsATableWithTheRecommendation) {
  PlanRequest request = MegatronRequest(3);
  request.topology.nodes = 131072 / 8;
  request.options.sweep_devices = true;
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string text = FormatPlanText(request, *plan);
  const size_t at = text.find("\nDevice counts (the same request on fewer devices)\n");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string table = text.substr(at, text.find("\nBest layout per shape", at) - at);
  std::printf("%s", table.c_str());
  EXPECT_TRUE(Contains(table, "time to train 450.0B tok")) << table;
  EXPECT_TRUE(Contains(table, "cost")) << table;
  const int pick = plan->device_sweep.counts[plan->device_sweep.recommended].devices;
  EXPECT_EQ(pick, 16384);
  // The recommended row is marked, and the full cluster is the fastest.
  const size_t row = table.find("\n   16,384  ");
  ASSERT_NE(row, std::string::npos) << table;
  EXPECT_TRUE(Contains(table.substr(row, table.find('\n', row + 1) - row), "<- recommended"));
  const size_t last = table.find("\n  131,072  ");
  ASSERT_NE(last, std::string::npos) << table;
  EXPECT_TRUE(Contains(table.substr(last, table.find('\n', last + 1) - last), "fastest"));
  EXPECT_TRUE(Contains(table, "Recommended: 16,384 of 131,072 devices: ")) << table;
  EXPECT_TRUE(Contains(table, "Rule: the fastest device count whose device-hours are at most 2x"));

  const YAML::Node json = YAML::Load(FormatPlanJson(request, *plan));
  const YAML::Node sweep = json["device_sweep"];
  ASSERT_TRUE(sweep.IsMap());
  EXPECT_EQ(sweep["recommended_devices"].as<int>(), 16384);
  EXPECT_EQ(sweep["fastest_devices"].as<int>(), 131072);
  ASSERT_TRUE(sweep["counts"].IsSequence());
  EXPECT_EQ(sweep["counts"].size(), plan->device_sweep.counts.size());
  const YAML::Node full = sweep["counts"][sweep["counts"].size() - 1];
  EXPECT_EQ(full["devices"].as<int>(), 131072);
  EXPECT_NEAR(full["best"]["estimate"]["mfu"].as<double>(), plan->best.step.mfu, 1e-9);

  // Without the option there is no sweep and no section.
  request.options.sweep_devices = false;
  plan = MakePlan(request);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->device_sweep.counts.empty());
  EXPECT_FALSE(Contains(FormatPlanText(request, *plan), "Device counts"));
  EXPECT_FALSE(YAML::Load(FormatPlanJson(request, *plan))["device_sweep"].IsDefined());
}

}  // namespace
}  // namespace loom::planner
