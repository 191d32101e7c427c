#include "common/cpu_list.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CpuListTest, ParsesNumbersAndRangesAscendingWithoutRepeats) {
  EXPECT_THAT(*ParseCpuList("3"), ElementsAre(3));
  EXPECT_THAT(*ParseCpuList("0-3,8,10-11"), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_THAT(*ParseCpuList("8,2-3,3"), ElementsAre(2, 3, 8));
}

TEST(CpuListTest, RejectsWhatIsNotACpuListQuotingTheItem) {
  for (const char* bad : {"", "a", "3-1", "1,,2", "-1", "1-", "+1", " 1", "1-2-3", "99999"}) {
    absl::StatusOr<std::vector<int>> r = ParseCpuList(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseCpuList("0,x-2").status().message(), HasSubstr("\"x-2\" in CPU list"));
}

TEST(CpuListTest, FormatsWithRangesJoined) {
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({5}), "5");
  EXPECT_EQ(FormatCpuList({}), "");
}

TEST(CpuListTest, APinnedThreadAndTheThreadsItStartsRunOnlyThere) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  const std::vector<int> one = {allowed.back()};
  std::vector<int> inside, child;
  std::thread t([&] {
    ASSERT_TRUE(PinThisThread(one).ok());
    inside = AllowedCpus();
    std::thread c([&] { child = AllowedCpus(); });
    c.join();
  });
  t.join();
  EXPECT_EQ(inside, one);
  EXPECT_EQ(child, one);
  EXPECT_EQ(AllowedCpus(), allowed);  // the test's own thread is untouched
}

TEST(CpuListTest, PinningToCpusThisProcessMayNotUseSaysWhich) {
  absl::Status s;
  std::thread t([&] { s = PinThisThread({CPU_SETSIZE - 1}); });
  t.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cannot run on CPUs"));
}

}  // namespace
}  // namespace loom
