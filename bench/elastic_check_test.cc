#include "bench/elastic_check.h"

#include <gtest/gtest.h>

namespace loom::bench {
namespace {

// A job that ran 2 ranks, grew to 3 from checkpoint 10 (attempt 1, killed
// after step 11), shrank to 2 from the same checkpoint (attempt 2) and grew
// back to 3 from checkpoint 20 (attempt 3); 30 steps in all.
struct ElasticRun {
  loom::v1::Job job;
  loom::v1::GetStepMetricsResponse records;
  std::map<int, Losses> refs;

  ElasticRun() {
    auto replan = [&](int64_t from, int64_t generation, const char* a, const char* b,
                      const char* cause) {
      auto* e = job.add_events();
      e->set_kind(loom::v1::RecoveryEvent::REPLANNED);
      e->set_checkpoint_step(from);
      e->set_generation(generation);
      e->set_from_layout(a);
      e->set_to_layout(b);
      e->set_cause(cause);
    };
    replan(10, 1, "tp 1 | pp 1 | dp 2", "tp 1 | pp 1 | dp 3", "capacity_returned");
    replan(10, 2, "tp 1 | pp 1 | dp 3", "tp 1 | pp 1 | dp 2", "worker_lost");
    replan(20, 3, "tp 1 | pp 1 | dp 2", "tp 1 | pp 1 | dp 3", "capacity_returned");
    job.set_layout_generation(3);
    for (int s = 1; s <= 30; ++s) {
      refs[2][s] = 5.0 - 0.01 * s;
      refs[3][s] = 5.0 - 0.01 * s + (s > 15 ? 1e-4 : 0);  // the layouts part at step 16
    }
    auto report = [&](int s, int generation, int layout, double loss) {
      auto* m = records.add_steps();
      m->set_step(s);
      m->set_generation(generation);
      m->set_layout_generation(layout);
      m->set_loss(loss);
    };
    for (int s = 1; s <= 10; ++s) report(s, 0, 0, refs[2][s]);
    report(11, 1, 1, refs[2][11]);  // the grow's first step, then the kill
    for (int s = 11; s <= 20; ++s) report(s, 2, 2, refs[2][s]);
    report(21, 3, 3, refs[2][21]);  // the grow back's first step: same parameters
    for (int s = 22; s <= 30; ++s) report(s, 3, 3, refs[3][s] * 1.01);
  }
};

TEST(ElasticCheckTest, ABitExactPrefixAndMatchingFirstStepsPass) {
  ElasticRun run;
  const ElasticCheck c = CheckElasticLosses(run.job, run.records, run.refs, 3);
  EXPECT_TRUE(c.layouts_known);
  EXPECT_EQ(c.first_ranks, 2);
  EXPECT_EQ(c.prefix, 20);
  EXPECT_EQ(c.prefix_diff, 0);
  EXPECT_EQ(c.checked, 3);
  EXPECT_EQ(c.past_prefix, 0);
  EXPECT_EQ(c.unreported, 0);
  EXPECT_LE(c.first_step_diff, 1e-12);
  EXPECT_NEAR(c.later, 0.01, 1e-6);
  EXPECT_TRUE(c.ok());
  EXPECT_FALSE(c.ok(/*later_bound=*/0.001));
  ASSERT_EQ(c.replans.size(), 3u);
  EXPECT_EQ(c.replans[1], "worker_lost from 10");
}

TEST(ElasticCheckTest, ALastBitInThePrefixFails) {
  ElasticRun run;
  run.records.mutable_steps(14)->set_loss(run.records.steps(14).loss() * (1 + 1e-15));
  const ElasticCheck c = CheckElasticLosses(run.job, run.records, run.refs, 3);
  EXPECT_GT(c.prefix_diff, 0);
  EXPECT_FALSE(c.ok());
}

TEST(ElasticCheckTest, AWrongFirstStepAfterAReplanFails) {
  ElasticRun run;
  run.records.mutable_steps(10)->set_loss(run.refs[2][12]);  // the grow's step 11: step 12's batch
  const ElasticCheck c = CheckElasticLosses(run.job, run.records, run.refs, 3);
  EXPECT_EQ(c.prefix_diff, 0);  // the grow's record was replayed: not in the committed prefix
  EXPECT_GT(c.first_step_diff, 1e-3);
  EXPECT_FALSE(c.ok());
}

TEST(ElasticCheckTest, UnknownLayoutsOrNoReplanFail) {
  ElasticRun run;
  run.job.set_layout_generation(4);  // an event missing
  EXPECT_FALSE(CheckElasticLosses(run.job, run.records, run.refs, 3).ok());
  loom::v1::Job never_replanned;
  EXPECT_FALSE(CheckElasticLosses(never_replanned, run.records, run.refs, 3).ok());
  EXPECT_EQ(DataParallelOf("tp 2 | pp 1 | dp 4 | mb 2"), 4);
  EXPECT_EQ(DataParallelOf("no layout"), 0);
}

}  // namespace
}  // namespace loom::bench
