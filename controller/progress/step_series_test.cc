#include "controller/progress/step_series.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;

loom::v1::StepMetrics Step(int64_t step, double loss, std::optional<double> val = std::nullopt) {
  loom::v1::StepMetrics m;
  m.set_step(step);
  m.set_loss(loss);
  m.set_tokens_per_second(1000 + step);
  if (val) {
    m.set_val_loss(*val);
    m.set_has_val_loss(true);
  }
  return m;
}

loom::v1::GetStepSeriesRequest Request(int buckets, std::vector<std::string> series = {"loss"},
                                       int64_t from = 0, int64_t to = 0) {
  loom::v1::GetStepSeriesRequest r;
  r.set_job_id("j");
  r.set_buckets(buckets);
  r.set_from_step(from);
  r.set_to_step(to);
  for (auto& s : series) r.add_series(s);
  return r;
}

// A million steps into a thousand buckets: a thousand buckets come out,
// and a one-step spike is the maximum of its bucket.
TEST(StepSeriesBuilderTest, AMillionStepsAnswerInTheBucketsAskedAndKeepASpike) {
  auto b = StepSeriesBuilder::Start(Request(1000), 1, 1'000'000);
  ASSERT_TRUE(b.ok()) << b.status();
  for (int64_t s = 1; s <= 1'000'000; ++s) b->Add(Step(s, s == 654'321 ? 9.0 : 2.0));
  const loom::v1::GetStepSeriesResponse r = b->Finish();
  EXPECT_EQ(r.steps(), 1'000'000);
  ASSERT_EQ(r.bucket_first_step_size(), 1000);
  EXPECT_EQ(r.bucket_first_step(0), 1);
  EXPECT_EQ(r.bucket_last_step(0), 1000);
  EXPECT_EQ(r.bucket_last_step(999), 1'000'000);
  ASSERT_EQ(r.series_size(), 1);
  const auto& loss = r.series(0);
  EXPECT_EQ(loss.name(), "loss");
  int spikes = 0;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(loss.min(i), 2.0f);
    if (loss.max(i) == 9.0f) {
      ++spikes;
      EXPECT_LE(r.bucket_first_step(i), 654'321);
      EXPECT_GE(r.bucket_last_step(i), 654'321);
    }
  }
  EXPECT_EQ(spikes, 1);
}

// Fewer steps than buckets: one bucket per step, first = last = min = max.
TEST(StepSeriesBuilderTest, FewStepsAreSentAsTheyAre) {
  auto b = StepSeriesBuilder::Start(Request(1000, {"loss", "tokens_per_second"}), 1, 5);
  ASSERT_TRUE(b.ok());
  for (int s = 1; s <= 5; ++s) b->Add(Step(s, s * 0.5));
  const auto r = b->Finish();
  ASSERT_EQ(r.bucket_first_step_size(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r.bucket_first_step(i), i + 1);
    EXPECT_EQ(r.bucket_last_step(i), i + 1);
    EXPECT_EQ(r.series(0).first(i), (i + 1) * 0.5f);
    EXPECT_EQ(r.series(0).max(i), (i + 1) * 0.5f);
    EXPECT_EQ(r.series(1).last(i), 1001.0f + i);
  }
}

// Validation loss exists on some steps only: NaN elsewhere; the first and
// last of a bucket are its first and last validated steps.
TEST(StepSeriesBuilderTest, SparseSeriesAreNaNWhereABucketHasNone) {
  auto b = StepSeriesBuilder::Start(Request(10, {"val_loss"}), 1, 100);
  ASSERT_TRUE(b.ok());
  for (int s = 1; s <= 100; ++s) {
    b->Add(Step(s, 1.0, s % 25 == 0 ? std::optional<double>(s / 100.0) : std::nullopt));
  }
  const auto r = b->Finish();
  ASSERT_EQ(r.bucket_first_step_size(), 10);
  int set = 0;
  for (int i = 0; i < 10; ++i) set += std::isnan(r.series(0).first(i)) ? 0 : 1;
  EXPECT_EQ(set, 4);
  EXPECT_EQ(r.series(0).first(2), 0.25f);  // steps 21..30 hold step 25
  EXPECT_TRUE(std::isnan(r.series(0).max(0)));
}

// A re-trained step (records of it come in recording order) counts once,
// as its latest record; a zoomed range reads only its steps.
TEST(StepSeriesBuilderTest, ARetrainedStepCountsOnceAsItsLatestRecord) {
  auto b = StepSeriesBuilder::Start(Request(100, {"loss"}, 3, 4), 1, 10);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->from(), 3);
  EXPECT_EQ(b->to(), 4);
  for (int s = 1; s <= 10; ++s) {
    b->Add(Step(s, 8.0));  // the first training (a spike at every step)
    b->Add(Step(s, 1.0));  // after the rollback
  }
  const auto r = b->Finish();
  EXPECT_EQ(r.steps(), 2);
  ASSERT_EQ(r.bucket_first_step_size(), 2);
  EXPECT_EQ(r.series(0).max(0), 1.0f);
  EXPECT_EQ(r.first_step(), 1);
  EXPECT_EQ(r.last_step(), 10);
}

TEST(StepSeriesBuilderTest, BadRequestsNameTheField) {
  EXPECT_THAT(StepSeriesBuilder::Start(Request(10, {"loss", "colour"}), 1, 5).status().message(),
              HasSubstr("series: unknown series \"colour\""));
  EXPECT_THAT(StepSeriesBuilder::Start(Request(10, {"loss", "loss"}), 1, 5).status().message(),
              HasSubstr("asked twice"));
  EXPECT_THAT(StepSeriesBuilder::Start(Request(20001), 1, 5).status().message(),
              HasSubstr("buckets:"));
  EXPECT_THAT(StepSeriesBuilder::Start(Request(10, {}, 9, 3), 1, 5).status().message(),
              HasSubstr("from_step: 9 is after to_step 3"));
  EXPECT_THAT(StepSeriesBuilder::Start(Request(10, {}, -1), 1, 5).status().message(),
              HasSubstr("from_step"));
  // The default series; nothing recorded yet: an empty answer.
  auto none = StepSeriesBuilder::Start(Request(0, {}), 0, -1);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  const auto r = none->Finish();
  EXPECT_EQ(r.steps(), 0);
  ASSERT_EQ(r.series_size(), 4);
  EXPECT_EQ(r.series(1).name(), "val_loss");
}

}  // namespace
}  // namespace loom::controller
