#include "controller/scheduling/gang_fit.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::scheduling {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GangFitTest, WholeGangOrNothing) {
  const GangDemand gang = GangDemand::Even(3, {2, 0});
  EXPECT_FALSE(FitGang(gang, {{2, 0}, {2, 0}, {1, 0}}).has_value());
  EXPECT_THAT(*FitGang(gang, {{2, 0}, {2, 0}, {1, 0}, {4, 0}}), ElementsAre(0, 1, 3));
  EXPECT_FALSE(FitGang(GangDemand{}, {{1, 0}}).has_value());
}

TEST(GangFitTest, BestFitKeepsBigHolesForBigGangs) {
  // One slot goes to the 1-slot worker, not the 4-slot one.
  EXPECT_THAT(*FitGang(GangDemand::Even(1, {1, 0}), {{4, 0}, {1, 0}}), ElementsAre(1));
  // A CPU gang prefers workers without GPUs.
  EXPECT_THAT(*FitGang(GangDemand::Even(1, {1, 0}), {{2, 2}, {2, 0}}), ElementsAre(1));
}

TEST(GangFitTest, UnevenGangPlacesLargestShareFirst) {
  const GangDemand gang{{{1, 0}, {2, 0}}};
  // Largest share first: the 2 takes the 2-slot worker, the 1 the other.
  EXPECT_THAT(*FitGang(gang, {{2, 0}, {1, 0}}), ElementsAre(1, 0));
}

TEST(GangFitTest, GpusCount) {
  const GangDemand gang = GangDemand::Even(2, {1, 1});
  EXPECT_FALSE(FitGang(gang, {{4, 1}, {4, 0}}).has_value());
  EXPECT_TRUE(FitGang(gang, {{4, 1}, {4, 1}}).has_value());
}

TEST(GangFitTest, ShortageSaysWhatIsMissing) {
  EXPECT_EQ(DescribeShortage(GangDemand::Even(4, {2, 0}), {{2, 0}, {1, 0}, {3, 0}}),
            "needs 4 worker(s) with 2 slot(s) each; 2 of 3 worker(s) have room (6 slot(s) free "
            "in all)");
}

}  // namespace
}  // namespace loom::scheduling
