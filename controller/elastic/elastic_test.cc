#include "controller/elastic/elastic.h"

#include <cstdio>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/jobspec.h"
#include "controller/admission/job_planning.h"
#include "controller/jobs/jobs_test_fixture.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

std::vector<std::pair<int, int>> Shapes(const std::vector<ElasticShape>& c) {
  std::vector<std::pair<int, int>> out;
  for (const ElasticShape& s : c) out.push_back({s.ranks, s.workers});
  return out;
}

TEST(ElasticTest, CandidatesGoFromTheLargestGangDownOnTheFewestWorkers) {
  // Workers with 1, 3 and 2 free slots; a job of 2 to 6 ranks. 6 ranks fit
  // no split (3 + 3, or 2 + 2 + 2); 5 go 3 + 2; 4 go 2 + 2; 3 and 2 fit on
  // the worker with 3.
  EXPECT_EQ(Shapes(ElasticCandidates({1, 3, 2}, 2, 6)),
            (std::vector<std::pair<int, int>>{{5, 2}, {4, 2}, {3, 1}, {2, 1}}));
  // Odd counts on single-slot workers: one rank each.
  EXPECT_EQ(Shapes(ElasticCandidates({1, 1, 1, 0}, 1, 4)),
            (std::vector<std::pair<int, int>>{{3, 3}, {2, 2}, {1, 1}}));
  // Nothing free, or less than min_ranks: no candidate.
  EXPECT_TRUE(ElasticCandidates({0, 0}, 1, 2).empty());
  EXPECT_TRUE(ElasticCandidates({1, 1}, 3, 4).empty());
}

TEST(ElasticTest, TheSpecKeepsItsBatchAndLeavesTheLayoutToThePlanner) {
  loom::v1::JobSpec spec;
  spec.mutable_resources()->set_ranks(4);
  spec.mutable_resources()->set_workers(4);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_batch()->set_global_batch(24);
  spec.mutable_batch()->set_micro_batch(2);
  const loom::v1::JobSpec out = SpecForShape(spec, {3, 2});
  EXPECT_EQ(out.resources().ranks(), 3);
  EXPECT_EQ(out.resources().workers(), 2);
  EXPECT_TRUE(out.parallelism().auto_());
  EXPECT_EQ(out.parallelism().tensor(), 0);
  EXPECT_EQ(out.parallelism().data(), 0);
  EXPECT_EQ(out.batch().global_batch(), 24);
  EXPECT_EQ(out.batch().micro_batch(), 2);
}

}  // namespace
}  // namespace loom::controller

namespace loom::controller {
namespace {

// Elastic re-planning at the edges: on a shrunken, uneven cluster (three
// workers with 5, 2 and 1 free slots) every gang from 1 to 8 ranks either
// plans an executable layout for exactly that many ranks, or says why not:
// no split of the ranks fits the workers, or the planner's reason for the
// shape that does.
TEST(ElasticTest, EveryGangOnAnOddClusterPlansOrSaysWhy) {
  loom::v1::JobSpec spec = TinyGptSpec("edges");
  spec.mutable_resources()->set_workers(1);
  spec.mutable_resources()->set_ranks(1);
  ApplyJobSpecDefaults(&spec);
  std::vector<loom::v1::WorkerInfo> workers;
  for (int slots : {5, 2, 1}) {
    loom::v1::WorkerInfo w;
    w.set_alive(true);
    w.set_slots(slots);
    w.set_cpus(8);
    w.set_memory_bytes(static_cast<uint64_t>(8e9));
    w.set_gemm_flops_per_second_per_thread(50e9);
    w.set_memory_bandwidth_bytes_per_second(12e9);
    workers.push_back(w);
  }
  std::set<int> planned;
  for (int ranks = 1; ranks <= 8; ++ranks) {
    SCOPED_TRACE(absl::StrCat(ranks, " rank(s)"));
    const std::vector<ElasticShape> shapes = ElasticCandidates({5, 2, 1}, ranks, ranks);
    if (shapes.empty()) {
      std::printf("%d rank(s): no split fits workers with 5, 2 and 1 free slots\n", ranks);
      continue;
    }
    ASSERT_EQ(shapes.size(), 1u);
    loom::v1::JobSpec candidate = SpecForShape(spec, shapes[0]);
    absl::StatusOr<LiveTopology> topology = TopologyForSpec(candidate, workers);
    ASSERT_TRUE(topology.ok()) << topology.status();
    absl::StatusOr<loom::v1::JobPlan> plan = PlanAtSubmit(&candidate, *topology);
    if (!plan.ok()) {
      EXPECT_FALSE(plan.status().message().empty());
      std::printf("%d rank(s) on %d worker(s): %s\n", ranks, shapes[0].workers,
                  std::string(plan.status().message()).c_str());
      continue;
    }
    EXPECT_TRUE(plan->layout().fits());
    EXPECT_EQ(plan->layout().data() * plan->layout().tensor() * plan->layout().pipeline(), ranks);
    std::printf("%d rank(s) on %d worker(s): %s\n", ranks, shapes[0].workers,
                plan->layout().summary().c_str());
    planned.insert(ranks);
  }
  // What a 2-layer, 2-head model with 6 micro-batches of 2 can run on it.
  EXPECT_EQ(planned, (std::set<int>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace loom::controller
