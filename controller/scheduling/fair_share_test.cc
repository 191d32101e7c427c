#include "controller/scheduling/fair_share.h"

#include "gtest/gtest.h"

namespace loom::scheduling {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1700000000);

TEST(FairShareTest, ConvergesToHeldUsageAndHalvesWhenIdle) {
  FairShare fs(absl::Minutes(10));
  fs.Observe(kStart, {{"a", {8, 2}}});
  EXPECT_DOUBLE_EQ(fs.Usage("a").slots, 0);  // the first call only records
  fs.Observe(kStart + absl::Minutes(10), {{"a", {8, 2}}});
  EXPECT_DOUBLE_EQ(fs.Usage("a").slots, 4);  // one half-life at 8
  EXPECT_DOUBLE_EQ(fs.Usage("a").gpus, 1);
  fs.Observe(kStart + absl::Minutes(20), {});  // 10 more minutes at 8, then idle
  EXPECT_DOUBLE_EQ(fs.Usage("a").slots, 6);
  fs.Observe(kStart + absl::Minutes(30), {});  // 10 idle minutes halve it
  EXPECT_DOUBLE_EQ(fs.Usage("a").slots, 3);
  EXPECT_DOUBLE_EQ(fs.Usage("never").slots, 0);
}

TEST(FairShareTest, SplitsOfAnIntervalAddUp) {
  FairShare one(absl::Minutes(5)), many(absl::Minutes(5));
  one.Observe(kStart, {{"a", {3, 0}}});
  many.Observe(kStart, {{"a", {3, 0}}});
  one.Observe(kStart + absl::Minutes(7), {{"a", {3, 0}}});
  for (int s = 1; s <= 7; ++s) many.Observe(kStart + absl::Minutes(s), {{"a", {3, 0}}});
  EXPECT_NEAR(one.Usage("a").slots, many.Usage("a").slots, 1e-12);
}

TEST(FairShareTest, TimeGoingBackwardsCountsAsNone) {
  FairShare fs(absl::Minutes(5));
  fs.Observe(kStart, {{"a", {4, 0}}});
  fs.Observe(kStart + absl::Minutes(5), {{"a", {4, 0}}});
  fs.Observe(kStart, {{"a", {4, 0}}});
  EXPECT_DOUBLE_EQ(fs.Usage("a").slots, 2);
}

}  // namespace
}  // namespace loom::scheduling
