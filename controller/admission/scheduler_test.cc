#include "controller/admission/scheduler.h"

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

WorkerOffer Offer(const std::string& node, int free_slots, const std::string& rack = "",
                  const std::string& zone = "", std::vector<int> free_gpus = {}) {
  WorkerOffer o;
  o.info.set_id(node + "-00000a");
  o.info.set_node(node);
  o.info.set_rack(rack);
  o.info.set_zone(zone);
  o.info.set_alive(true);
  o.free_slots = free_slots;
  o.free_gpus = std::move(free_gpus);
  return o;
}

GangRequest Gang(int workers, int data, int pipeline, int tensor) {
  GangRequest g;
  g.workers = workers;
  g.layout = ParallelLayout{data, tensor, pipeline};
  return g;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::string NodeOf(const GangPlacement& p, int rank) {
  return p.workers[p.ranks[rank].worker].node();
}

std::vector<std::string> Nodes(const GangPlacement& p) {
  std::vector<std::string> nodes;
  for (const auto& w : p.workers) nodes.push_back(w.node());
  return nodes;
}

// Every rank is placed once, with the layout's coordinates, and no worker
// runs more ranks than it offered.
void ExpectConsistent(const GangRequest& gang, const GangPlacement& p) {
  ASSERT_EQ(static_cast<int>(p.ranks.size()), gang.layout.world_size());
  ASSERT_EQ(static_cast<int>(p.workers.size()), gang.workers);
  for (int r = 0; r < gang.layout.world_size(); ++r) {
    EXPECT_EQ(p.ranks[r].rank, r);
    EXPECT_EQ(p.ranks[r].at, CoordinatesOf(gang.layout, r)) << "rank " << r;
  }
}

TEST(SchedulerTest, TensorGroupNeverSpansWorkers) {
  struct Case {
    int workers, data, pipeline, tensor, slots;
  };
  // Even splits, a tensor group as large as a worker, and uneven splits
  // (6 ranks of TP2 on 2 workers: 4 + 2).
  for (const Case& c : std::vector<Case>{{4, 2, 2, 2, 2},
                                         {2, 1, 2, 2, 2},
                                         {1, 1, 1, 4, 4},
                                         {2, 2, 1, 4, 4},
                                         {4, 1, 4, 2, 4},
                                         {2, 3, 1, 2, 4},
                                         {2, 1, 3, 2, 4}}) {
    SCOPED_TRACE(testing::Message() << "workers " << c.workers << " dp" << c.data << " pp"
                                    << c.pipeline << " tp" << c.tensor);
    const GangRequest gang = Gang(c.workers, c.data, c.pipeline, c.tensor);
    std::vector<WorkerOffer> offers;
    for (const char* n : {"n1", "n2", "n3", "n4", "n5"}) offers.push_back(Offer(n, c.slots));
    auto placed = PlaceGang(gang, offers);
    ASSERT_TRUE(placed.ok()) << placed.status();
    ExpectConsistent(gang, *placed);
    for (const auto& group : AllGroups(gang.layout, GroupKind::kTensor)) {
      std::set<int> workers;
      for (int r : group) workers.insert(placed->ranks[r].worker);
      EXPECT_EQ(workers.size(), 1u) << "tensor group of rank " << group[0];
    }
    std::vector<int> per_worker(c.workers, 0);
    for (const auto& r : placed->ranks) ++per_worker[r.worker];
    for (int n : per_worker) {
      EXPECT_GT(n, 0);
      EXPECT_LE(n, c.slots);
    }
  }
}

// Four one-slot workers in two racks, their names interleaved across the
// racks: a PP2 x DP2 job keeps each replica's two stages inside one rack.
TEST(SchedulerTest, EachReplicasStagesShareARack) {
  const GangRequest gang = Gang(4, /*data=*/2, /*pipeline=*/2, /*tensor=*/1);
  std::vector<WorkerOffer> offers = {Offer("a", 1, "r1"), Offer("b", 1, "r2"),
                                     Offer("c", 1, "r1"), Offer("d", 1, "r2")};
  auto placed = PlaceGang(gang, offers);
  ASSERT_TRUE(placed.ok()) << placed.status();
  ExpectConsistent(gang, *placed);
  EXPECT_EQ(placed->topology.nodes, 4);
  EXPECT_EQ(placed->topology.devices_per_node, 1);
  EXPECT_EQ(placed->topology.nodes_per_rack, 2);
  for (const auto& pipeline : AllGroups(gang.layout, GroupKind::kPipeline)) {
    ASSERT_EQ(pipeline.size(), 2u);
    const auto& first = placed->workers[placed->ranks[pipeline[0]].worker];
    const auto& second = placed->workers[placed->ranks[pipeline[1]].worker];
    EXPECT_NE(first.node(), second.node());
    EXPECT_EQ(first.rack(), second.rack()) << "replica of rank " << pipeline[0];
  }
  // The data-parallel groups span the racks.
  EXPECT_NE(placed->workers[placed->ranks[0].worker].rack(),
            placed->workers[placed->ranks[2].worker].rack());
}

TEST(SchedulerTest, WorkersGivenOutOfOrderArePlacedInRackOrder) {
  const GangRequest gang = Gang(4, /*data=*/2, /*pipeline=*/2, /*tensor=*/1);
  std::vector<WorkerOffer> offers = {Offer("d", 1, "r2", "z1"), Offer("a", 1, "r1", "z1"),
                                     Offer("c", 1, "r1", "z1"), Offer("b", 1, "r2", "z1")};
  auto placed = PlaceGang(gang, offers);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(Nodes(*placed), ElementsAre("a", "c", "b", "d"));
  EXPECT_EQ(NodeOf(*placed, 0), "a");  // dp0 pp0, and the rendezvous host
  EXPECT_EQ(NodeOf(*placed, 1), "c");  // dp0 pp1
  EXPECT_EQ(NodeOf(*placed, 2), "b");  // dp1 pp0
  EXPECT_EQ(NodeOf(*placed, 3), "d");  // dp1 pp1
  // Zones order before racks: z0's rack r9 comes first.
  offers.push_back(Offer("e", 1, "r9", "z0"));
  placed = PlaceGang(Gang(1, 1, 1, 1), offers);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(Nodes(*placed), ElementsAre("e"));
}

// A replica (two one-slot stages) goes to a rack that holds all of it, not
// to the first rack in order, which has room for one stage only.
TEST(SchedulerTest, PrefersARackThatHoldsAWholeReplica) {
  const GangRequest gang = Gang(2, /*data=*/1, /*pipeline=*/2, /*tensor=*/1);
  auto placed =
      PlaceGang(gang, {Offer("a", 1, "r1"), Offer("b", 1, "r2"), Offer("c", 1, "r2")});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(Nodes(*placed), ElementsAre("b", "c"));
  EXPECT_EQ(placed->topology.nodes_per_rack, 2);
  // A worker that is full does not count as room.
  placed = PlaceGang(gang, {Offer("a", 1, "r1"), Offer("b", 0, "r2"), Offer("c", 1, "r2")});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(Nodes(*placed), ElementsAre("a", "c"));
  EXPECT_EQ(placed->topology.nodes_per_rack, 1);
}

TEST(SchedulerTest, UnevenRacksAndNoLabelsGiveNoRackStructure) {
  const GangRequest gang = Gang(3, 3, 1, 1);
  auto placed = PlaceGang(gang, {Offer("a", 1, "r1"), Offer("b", 1, "r1"), Offer("c", 1, "r2")});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->topology.nodes_per_rack, 0);
  placed = PlaceGang(gang, {Offer("c", 1), Offer("b", 1), Offer("a", 1)});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->topology.nodes_per_rack, 0);
  EXPECT_THAT(Nodes(*placed), ElementsAre("a", "b", "c"));
}

TEST(SchedulerTest, UnevenSplitGivesTheFirstWorkersOneTensorGroupMore) {
  // 3 ranks on 2 workers: 2 + 1, the larger share where it fits; ranks
  // follow the workers' rack order.
  GangRequest gang = Gang(2, 3, 1, 1);
  auto placed = PlaceGang(gang, {Offer("a", 1), Offer("b", 2)});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(Nodes(*placed), ElementsAre("a", "b"));
  EXPECT_EQ(NodeOf(*placed, 0), "a");
  EXPECT_EQ(NodeOf(*placed, 1), "b");
  EXPECT_EQ(NodeOf(*placed, 2), "b");
  EXPECT_EQ(placed->topology.nodes, 3);
  EXPECT_EQ(placed->topology.devices_per_node, 1);
}

TEST(SchedulerTest, GpuRanksGetTheWorkersFreeGpus) {
  GangRequest gang = Gang(1, 2, 1, 1);
  gang.gpu_per_rank = true;
  auto placed = PlaceGang(gang, {Offer("g", 4, "", "", {1, 3})});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->ranks[0].gpu, 1);
  EXPECT_EQ(placed->ranks[1].gpu, 3);
  // CPU ranks get none.
  placed = PlaceGang(Gang(1, 2, 1, 1), {Offer("g", 4, "", "", {1, 3})});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->ranks[0].gpu, -1);
}

TEST(SchedulerTest, AnUnplaceableJobSaysWhichResourceIsShort) {
  // Free slots: 3 in all, but the TP2 x PP2 gang needs 2 on each of 2 workers.
  auto slots = PlaceGang(Gang(2, 1, 2, 2), {Offer("a", 2), Offer("b", 1)});
  ASSERT_EQ(slots.status().code(), absl::StatusCode::kResourceExhausted) << slots.status();
  EXPECT_EQ(Msg(slots.status()),
            "waiting for 4 rank slot(s) on 2 worker(s) (2 on each; a tensor group of 2 rank(s) "
            "sits inside one worker); 2 worker(s) alive, 1 of them with 2 free slot(s), 3 free "
            "slot(s) in all");
  // Free GPUs: slots are plenty, GPUs are not.
  GangRequest gpu = Gang(1, 2, 1, 1);
  gpu.gpu_per_rank = true;
  auto gpus = PlaceGang(gpu, {Offer("cpu", 4), Offer("g", 4, "", "", {2})});
  ASSERT_EQ(gpus.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(gpus.status()),
              StartsWith("waiting for 2 rank slot(s) with a free GPU each on 1 worker(s) (2 on "
                         "each); 2 worker(s) alive, 0 of them with 2 such slot(s), 1 such "
                         "slot(s) in all"));
  EXPECT_THAT(Msg(gpus.status()), HasSubstr("loomctl workers"));
  // Too few workers alive.
  auto workers = PlaceGang(Gang(3, 3, 1, 1), {Offer("a", 4)});
  ASSERT_EQ(workers.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(workers.status()), HasSubstr("on 3 worker(s)"));
  EXPECT_THAT(Msg(workers.status()), HasSubstr("1 worker(s) alive"));
  // An uneven split names both shares.
  auto uneven = PlaceGang(Gang(2, 3, 1, 1), {Offer("a", 1), Offer("b", 1)});
  ASSERT_EQ(uneven.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(uneven.status()),
              HasSubstr("(2 on 1 of them, 1 on the rest); 2 worker(s) alive, 0 of them with 2 "
                        "free slot(s), 2 with 1"));
}

TEST(SchedulerTest, ATensorGroupLargerThanAWorkersShareIsRefused) {
  // TP4 on 2 workers: one tensor group, which cannot be split over two.
  const GangRequest gang = Gang(2, 1, 1, 4);
  EXPECT_EQ(CheckGangShape(gang).code(), absl::StatusCode::kInvalidArgument);
  auto placed = PlaceGang(gang, {Offer("a", 4), Offer("b", 4)});
  ASSERT_EQ(placed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(placed.status()),
            "resources.workers: 2 worker(s) for 1 tensor group(s) of 4 rank(s) "
            "(parallelism.tensor); a tensor group sits inside one worker, so at most 1 "
            "worker(s) get ranks");
  EXPECT_TRUE(CheckGangShape(Gang(1, 1, 1, 4)).ok());
  EXPECT_TRUE(CheckGangShape(Gang(2, 3, 1, 1)).ok());
}

TEST(SchedulerTest, DescribesTheTensorPipelinePlacement) {
  const GangRequest gang = Gang(2, /*data=*/1, /*pipeline=*/2, /*tensor=*/2);
  auto placed = PlaceGang(gang, {Offer("node-b", 2, "r2"), Offer("node-a", 2, "r1")});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(DescribePlacement(gang, *placed),
            "placed 4 rank(s) as dp1 x pp2 x tp2 on racks [r1: node-a] [r2: node-b]: "
            "0@node-a(dp0,pp0,tp0) 1@node-a(dp0,pp0,tp1) 2@node-b(dp0,pp1,tp0) "
            "3@node-b(dp0,pp1,tp1)");
  auto plain = PlaceGang(Gang(2, 2, 1, 1), {Offer("x", 1), Offer("y", 1)});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(DescribePlacement(Gang(2, 2, 1, 1), *plain), "placed 2 rank(s): 0@x 1@y");
}

TEST(SchedulerTest, GangRequestOfReadsTheDefaultedSpec) {
  loom::v1::JobSpec spec;
  spec.mutable_resources()->set_workers(2);
  spec.mutable_resources()->set_ranks(8);
  spec.mutable_resources()->set_gpus_per_rank(1);
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_parallelism()->set_pipeline(2);
  const GangRequest gang = GangRequestOf(spec);
  EXPECT_EQ(gang.workers, 2);
  EXPECT_EQ(gang.layout, (ParallelLayout{2, 2, 2}));
  EXPECT_TRUE(gang.gpu_per_rank);
}

}  // namespace
}  // namespace loom::controller
