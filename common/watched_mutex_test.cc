#include "common/watched_mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

namespace loom {
namespace {

using std::chrono::milliseconds;

// A hold is slow once it passes the threshold: the holder sleeps past it, so
// the hold is longer however loaded the machine is.
void HoldFor(WatchedMutex& mu, const char* holder, milliseconds how_long) {
  WatchedLock lock(mu, holder);
  std::this_thread::sleep_for(how_long);
}

TEST(WatchedMutexTest, ASlowHoldIsSaidWithItsHolderAndTheLock) {
  WatchedMutex mu("loom-controller: the controller lock", milliseconds(1));
  testing::internal::CaptureStderr();
  HoldFor(mu, "Tick", milliseconds(20));
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(mu.slow_holds(), 1);
  EXPECT_EQ(said.rfind("loom-controller: Tick held the controller lock for ", 0), 0u) << said;
  EXPECT_NE(said.find(" ms (waited "), std::string::npos) << said;
}

TEST(WatchedMutexTest, AHoldUnderTheThresholdIsNotSaid) {
  // A threshold no hold in this test comes near.
  WatchedMutex mu("the lock", std::chrono::hours(1));
  testing::internal::CaptureStderr();
  HoldFor(mu, "Heartbeat", milliseconds(5));
  { std::lock_guard<WatchedMutex> plain(mu); }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(mu.slow_holds(), 0);
}

TEST(WatchedMutexTest, SaysAtMostOneLineASecondAndCountsTheRest) {
  WatchedMutex mu("the lock", milliseconds(1));
  testing::internal::CaptureStderr();
  // Three slow holds well inside one second: the first is said.
  for (int i = 0; i < 3; ++i) HoldFor(mu, "Tick", milliseconds(3));
  const std::string first = testing::internal::GetCapturedStderr();
  EXPECT_EQ(mu.slow_holds(), 3);
  EXPECT_EQ(first.rfind("Tick held the lock for ", 0), 0u) << first;
  EXPECT_EQ(first.find('\n'), first.size() - 1) << first;
  // A second later the next slow hold is said with the two left unsaid.
  std::this_thread::sleep_for(milliseconds(1100));
  testing::internal::CaptureStderr();
  HoldFor(mu, "Submit", milliseconds(3));
  const std::string next = testing::internal::GetCapturedStderr();
  EXPECT_EQ(mu.slow_holds(), 4);
  EXPECT_NE(next.find("Submit held the lock"), std::string::npos) << next;
  EXPECT_NE(next.find("(+2 slow hold(s) in the second before, not said)"), std::string::npos)
      << next;
}

TEST(WatchedMutexTest, ExcludesLikeAMutex) {
  WatchedMutex mu("the lock", milliseconds(1));
  int counter = 0;
  std::thread other([&] {
    for (int i = 0; i < 10000; ++i) {
      std::lock_guard<WatchedMutex> lock(mu);
      ++counter;
    }
  });
  for (int i = 0; i < 10000; ++i) {
    WatchedLock lock(mu, "main");
    ++counter;
  }
  other.join();
  EXPECT_EQ(counter, 20000);
}

}  // namespace
}  // namespace loom
