#include "controller/planner/placement.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace loom::planner {
namespace {

ClusterTopology Cluster(int nodes, int per_node, int nodes_per_rack = 0) {
  absl::StatusOr<ClusterTopology> topo = MakeTopology("A100-80GB", nodes, per_node, 25e9);
  EXPECT_TRUE(topo.ok());
  topo->nodes_per_rack = nodes_per_rack;
  return *topo;
}

Layout Degrees(int tp, int pp, int dp) {
  Layout layout;
  layout.tp = tp;
  layout.pp = pp;
  layout.dp = dp;
  return layout;
}

TEST(PlacementTest, TensorInnermostPipelineNextDataOutermost) {
  absl::StatusOr<Placement> placement = PlaceRanks(Degrees(4, 2, 4), Cluster(4, 8));
  ASSERT_TRUE(placement.ok()) << placement.status();
  ASSERT_EQ(placement->ranks.size(), 32u);
  for (const RankPlacement& r : placement->ranks) {
    EXPECT_EQ(r.rank, r.dp_rank * 8 + r.pp_rank * 4 + r.tp_rank);
  }
  // Without racks the table is the identity: rank i on node i / 8, device i % 8.
  for (const RankPlacement& r : placement->ranks) {
    EXPECT_EQ(r.node, r.rank / 8);
    EXPECT_EQ(r.device, r.rank % 8);
  }
  EXPECT_EQ(placement->tp_groups, 8);
  EXPECT_EQ(placement->tp_groups_within_one_node, 8);
  EXPECT_EQ(placement->pp_groups_within_one_node, 16);  // a replica is 8 devices = 1 node
  EXPECT_EQ(placement->max_nodes_per_dp_group, 4);
}

TEST(PlacementTest, EveryDeviceOnceAndEveryTpGroupOnOneNode) {
  for (const auto& [tp, pp] : {std::pair{1, 1}, {2, 4}, {8, 2}, {8, 8}, {4, 16}}) {
    const ClusterTopology topo = Cluster(16, 8, 4);
    const int dp = 128 / (tp * pp);
    absl::StatusOr<Placement> placement = PlaceRanks(Degrees(tp, pp, dp), topo);
    ASSERT_TRUE(placement.ok()) << placement.status();
    std::set<std::pair<int, int>> used;
    for (const RankPlacement& r : placement->ranks) used.insert({r.node, r.device});
    EXPECT_EQ(used.size(), 128u);
    EXPECT_EQ(placement->tp_groups_within_one_node, placement->tp_groups) << tp << "x" << pp;
  }
}

TEST(PlacementTest, PipelinesStayInsideARack) {
  // Racks of 2 nodes (16 devices); a replica is tp 4 x pp 4 = 16 devices.
  absl::StatusOr<Placement> placement = PlaceRanks(Degrees(4, 4, 4), Cluster(8, 8, 2));
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->pp_groups, 16);
  EXPECT_EQ(placement->pp_groups_within_one_rack, 16);
  EXPECT_EQ(placement->pp_groups_within_one_node, 0);
}

TEST(PlacementTest, WholeReplicasFirstWhenRacksDoNotDivide) {
  // Racks of 3 nodes (24 devices, 3 TP slots of 8); replicas of 2 slots.
  // Sequential filling would split replica 1 across racks 0 and 1; the
  // placement keeps replicas 0 and 1 whole and only replica 2 spills.
  absl::StatusOr<Placement> placement = PlaceRanks(Degrees(8, 2, 3), Cluster(6, 8, 3));
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->pp_groups, 24);
  EXPECT_EQ(placement->pp_groups_within_one_rack, 16);
  EXPECT_EQ(placement->ranks[16].node, 3);  // replica 1, stage 0: first node of rack 1
  EXPECT_EQ(placement->ranks[16].rack, 1);
}

TEST(PlacementTest, TensorParallelAcrossWholeNodes) {
  absl::StatusOr<Placement> placement = PlaceRanks(Degrees(8, 1, 2), Cluster(4, 4));
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->tp_groups_within_one_node, 0);  // each spans two nodes
  EXPECT_EQ(placement->ranks[7].node, 1);
}

TEST(PlacementTest, RejectsLayoutsThatDoNotMatchTheCluster) {
  EXPECT_EQ(PlaceRanks(Degrees(8, 1, 2), Cluster(4, 8)).status().message(),
            "layout: tp x pp x dp = 16, but the cluster has 32 devices");
  EXPECT_EQ(PlaceRanks(Degrees(3, 1, 8), Cluster(3, 8)).status().message(),
            "layout.tp: 3 would split a node's 8 devices unevenly");
}

}  // namespace
}  // namespace loom::planner
