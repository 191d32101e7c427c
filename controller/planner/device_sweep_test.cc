#include "controller/planner/device_sweep.h"

#include <cstdio>
#include <string>
#include <vector>

#include "controller/planner/planner.h"
#include "controller/planner/test_models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

using ::testing::ElementsAre;

PlanRequest Request(const ModelSpec& model, int64_t batch, int nodes, int per_node,
                    double token_budget) {
  PlanRequest request;
  request.model = model;
  request.training.global_batch_sequences = batch;
  request.training.precision = Precision::kBf16;
  request.training.token_budget = token_budget;
  absl::StatusOr<ClusterTopology> topo = MakeTopology("A100-80GB", nodes, per_node, 25e9);
  EXPECT_TRUE(topo.ok()) << topo.status();
  request.topology = *topo;
  request.topology.price_per_device_hour_usd = 2.0;
  return request;
}

void Print(const char* title, const DeviceSweep& sweep) {
  std::printf("%s\n", title);
  for (size_t i = 0; i < sweep.counts.size(); ++i) {
    const DeviceCountResult& r = sweep.counts[i];
    if (!r.fits) {
      std::printf("  %7d  does not fit: %s\n", r.devices, r.reason.c_str());
      continue;
    }
    std::printf("  %7d  %-50s step %8.3f s  MFU %5.1f%%  train %8.1f days  $%.3gM%s%s\n",
                r.devices, LayoutToString(r.best.layout).c_str(), r.best.step.step_seconds,
                100 * r.best.step.mfu, r.best.run.train_seconds / 86400, r.best.run.cost_usd / 1e6,
                static_cast<int>(i) == sweep.recommended ? "  <- recommended" : "",
                static_cast<int>(i) == sweep.fastest ? "  (fastest)" : "");
  }
  std::printf("  %s\n", sweep.summary.c_str());
}

TEST(SweepDeviceCountsTest, PowersOfTwoWithinANodeThenWholeNodesThenEverything) {
  absl::StatusOr<ClusterTopology> t = MakeTopology("A100-80GB", 12, 8, 25e9);
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(SweepDeviceCounts(*t), ElementsAre(1, 2, 4, 8, 16, 32, 64, 96));
  const ClusterTopology four = SubTopology(*t, 4);
  EXPECT_EQ(four.nodes, 1);
  EXPECT_EQ(four.devices_per_node, 4);
  EXPECT_EQ(four.total_devices(), 4);
  // Above one rack only whole racks: with racks of 3 nodes, 4 and 8 nodes
  // would split one.
  t->nodes_per_rack = 3;
  EXPECT_THAT(SweepDeviceCounts(*t), ElementsAre(1, 2, 4, 8, 16, 96));
  const ClusterTopology two_nodes = SubTopology(*t, 16);
  EXPECT_EQ(two_nodes.nodes, 2);
  EXPECT_EQ(two_nodes.nodes_per_rack, 0);  // inside one rack: no spine
  EXPECT_TRUE(ValidateTopology(two_nodes).ok());
  t->nodes_per_rack = 2;
  EXPECT_THAT(SweepDeviceCounts(*t), ElementsAre(1, 2, 4, 8, 16, 32, 64, 96));
  const ClusterTopology four_nodes = SubTopology(*t, 32);
  EXPECT_EQ(four_nodes.nodes, 4);
  EXPECT_EQ(four_nodes.nodes_per_rack, 2);
  EXPECT_EQ(four_nodes.racks(), 2);
  EXPECT_TRUE(ValidateTopology(four_nodes).ok());
}

// A 1T GPT (Narayanan et al. 2021, Table 1: 128 layers, 25,600
// wide, 160 heads) with a global batch of 3,072 sequences is laid out on all
// 131,072 A100s at 9.3% MFU (9.4% was expected). The sweep recommends fewer devices that each do
// more of the work.
TEST(SweepDevicesTest, OneTrillionOn131072A100sRecommendsFewerDevicesAtHigherMfu) {
  const test_models::MegatronRow& row = test_models::kMegatronRows[3];
  PlanRequest request =
      Request(test_models::MegatronGpt(row.name, row.layers, row.hidden, row.heads), row.batch,
              131072 / 8, 8, /*token_budget=*/450e9);
  request.options.sweep_devices = true;
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->best.step.mfu, 0.094, 0.005);
  const DeviceSweep& sweep = plan->device_sweep;
  Print("GPT 1008B, global batch 3,072, on up to 131,072 A100-80GB, 450B tokens:", sweep);
  ASSERT_GE(sweep.counts.size(), 2u);
  EXPECT_EQ(sweep.counts.back().devices, 131072);
  EXPECT_EQ(sweep.counts.back().best.step.step_seconds, plan->best.step.step_seconds);
  ASSERT_GE(sweep.recommended, 0);
  const DeviceCountResult& pick = sweep.counts[sweep.recommended];
  EXPECT_LT(pick.devices, 131072);
  EXPECT_GT(pick.best.step.mfu, plan->best.step.mfu);
  EXPECT_LT(pick.best.run.cost_usd, plan->best.run.cost_usd);
  // The rule: the fastest count within 2x the cheapest count's
  // device-hours (MFU at least half the best), so the next larger count is
  // over that bound.
  const DeviceCountResult& cheapest = sweep.counts[sweep.cheapest];
  EXPECT_LE(pick.best.run.device_hours, 2 * cheapest.best.run.device_hours);
  EXPECT_GE(pick.best.step.mfu, 0.5 * cheapest.best.step.mfu);
  ASSERT_LT(sweep.recommended + 1, static_cast<int>(sweep.counts.size()));
  const DeviceCountResult& more = sweep.counts[sweep.recommended + 1];
  EXPECT_GT(more.best.run.device_hours, 2 * cheapest.best.run.device_hours);
  EXPECT_GT(more.best.step.tokens_per_second, pick.best.step.tokens_per_second);
  EXPECT_EQ(sweep.fastest, static_cast<int>(sweep.counts.size()) - 1);
  // Time to train = token budget / tokens per second; cost = device-hours x price.
  EXPECT_NEAR(pick.best.run.train_seconds, 450e9 / pick.best.step.tokens_per_second,
              1e-6 * pick.best.run.train_seconds);
  EXPECT_NEAR(pick.best.run.cost_usd, 2.0 * pick.devices * pick.best.run.train_seconds / 3600,
              1e-6 * pick.best.run.cost_usd);
  // Counts where nothing fits are not listed below the first that fits.
  EXPECT_TRUE(sweep.counts.front().fits);
  EXPECT_GT(sweep.counts.front().devices, 8);
  EXPECT_THAT(sweep.summary, ::testing::HasSubstr("fewer device-hours"));
}

// GPT-2 XL with a batch of 512 on 64 A100s: every doubling still nearly
// doubles throughput, so all devices pay.
TEST(SweepDevicesTest, SmallModelWithABigBatchUsesEveryDevice) {
  PlanRequest request = Request(test_models::Gpt2Xl(), 512, 8, 8, 10e9);
  absl::StatusOr<DeviceSweep> sweep = SweepDevices(request);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  Print("GPT-2 XL, global batch 512, on up to 64 A100-80GB, 10B tokens:", *sweep);
  ASSERT_FALSE(sweep->counts.empty());
  EXPECT_EQ(sweep->counts.back().devices, 64);
  EXPECT_EQ(sweep->recommended, static_cast<int>(sweep->counts.size()) - 1);
  EXPECT_EQ(sweep->fastest, sweep->recommended);
  EXPECT_EQ(sweep->summary, "all 64 devices pay");
  // Throughput grows with every count.
  for (size_t i = 1; i < sweep->counts.size(); ++i) {
    EXPECT_GT(sweep->counts[i].best.step.tokens_per_second,
              sweep->counts[i - 1].best.step.tokens_per_second);
  }
}

TEST(SweepDevicesTest, CostRatioOneRecommendsTheCheapestAndBadOptionsAreRefused) {
  const test_models::MegatronRow& row = test_models::kMegatronRows[0];
  PlanRequest request =
      Request(test_models::MegatronGpt(row.name, row.layers, row.hidden, row.heads), row.batch,
              32, 8, 0);
  DeviceSweepOptions cheapest;
  cheapest.max_cost_ratio = 1;
  absl::StatusOr<DeviceSweep> sweep = SweepDevices(request, cheapest);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->recommended, sweep->cheapest);
  DeviceSweepOptions fastest;
  fastest.max_cost_ratio = 1e9;
  sweep = SweepDevices(request, fastest);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->recommended, sweep->fastest);
  cheapest.max_cost_ratio = 0.5;
  EXPECT_EQ(SweepDevices(request, cheapest).status().message(),
            "options.sweep.max_cost_ratio: must be >= 1");
  request.options.dp = 32;
  EXPECT_EQ(SweepDevices(request).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::planner
