#include "controller/elastic.h"

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
