// The Jepsen-style HA run (tests/failover_cluster.h), small: one
// cycle of each fault. `./bench/run.sh failover` runs more.
#include <iostream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/failover_cluster.h"

namespace loom::testing {
namespace {

TEST(FailoverTest, KillPauseAndPartitionOfTheLeaderLoseNothing) {
  FailoverOptions o;
  o.bin_dir = LOOM_BIN_DIR;
  o.cycles = 3;  // kill, pause, partition
  o.log = [](const std::string& line) { std::cout << "[ failover ] " << line << std::endl; };
  absl::StatusOr<FailoverResult> r = RunFailoverCycles(o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::cout << r->checker_output << r->one_failover << std::endl;
  ASSERT_EQ(r->cycles.size(), 3u);
  EXPECT_EQ(r->double_scheduled_gangs, 0);
  EXPECT_EQ(r->lost_acked_writes, 0);
  EXPECT_EQ(r->epochs_backwards, 0);
  EXPECT_GT(r->acked_submissions, 0);
  EXPECT_GT(r->steps_checked, 0);
  EXPECT_THAT(r->checker_output, ::testing::Not(::testing::HasSubstr("RESTARTED")));
  // Four leaders in turn: the first and one per cycle.
  EXPECT_EQ(r->leader_epochs, (std::vector<int64_t>{1, 2, 3, 4}));
  // Each failover within twice the promised 3 s (the bench reports p99).
  for (const auto& c : r->cycles) EXPECT_LT(c.failover_seconds, 6.0) << c.kind;
}

}  // namespace
}  // namespace loom::testing
