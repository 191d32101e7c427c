#include "worker/engine/checkpoint/checkpoint_fence.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CheckpointFenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/loom_fence_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    dir_ = root_ + "/ckpt";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Runs a no-op under the fence; true if it ran.
  absl::Status Touch(const FenceToken& token, bool* ran) {
    *ran = false;
    return WhileFenceHeld(dir_, token, [&] {
      *ran = true;
      return absl::OkStatus();
    });
  }

  std::string root_;
  std::string dir_;
};

TEST_F(CheckpointFenceTest, ClaimCreatesTheDirectoryAndRecordsTheToken) {
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 3}).ok());
  absl::StatusOr<FenceToken> held = ReadFence(dir_);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->owner, "job-1");
  EXPECT_EQ(held->attempt, 3);
  bool ran = false;
  EXPECT_TRUE(Touch({"job-1", 3}, &ran).ok());
  EXPECT_TRUE(ran);
  // Claiming again with the same token changes nothing and runs on_claimed.
  bool claimed = false;
  EXPECT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 3}, [&] { claimed = true; }).ok());
  EXPECT_TRUE(claimed);
}

// The split brain: attempt 3 is still alive when attempt 4
// claims the directory. From then on attempt 3 can neither commit, prune
// nor clean up, nor claim the directory back.
TEST_F(CheckpointFenceTest, ANewerAttemptFencesTheOlderOne) {
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 3}).ok());
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 4}).ok());
  bool ran = true;
  absl::Status stale = Touch({"job-1", 3}, &ran);
  EXPECT_FALSE(ran);
  EXPECT_TRUE(IsCheckpointFenced(stale)) << stale;
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.message()), HasSubstr("attempt 3 of job 'job-1'"));
  EXPECT_THAT(std::string(stale.message()), HasSubstr("attempt 4 of job 'job-1' claimed it"));

  bool claimed = false;
  absl::Status back = ClaimCheckpointDir(dir_, {"job-1", 3}, [&] { claimed = true; });
  EXPECT_TRUE(IsCheckpointFenced(back)) << back;
  EXPECT_FALSE(claimed);
  EXPECT_EQ(ReadFence(dir_)->attempt, 4);
  EXPECT_TRUE(Touch({"job-1", 4}, &ran).ok());
  EXPECT_TRUE(ran);
}


// A save that failed while a newer attempt held the directory failed because
// of it (the newer start removed its temporary directory, say): the error
// says so and is marked fenced, so that the old attempt stops as fenced.
// The holder's own failures are left as they are.
TEST_F(CheckpointFenceTest, ASaveFailureUnderANewerClaimIsExplainedAsFenced) {
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 3}).ok());
  const absl::Status io = absl::InternalError("create step-000000050.tmp-7/MANIFEST.json: gone");
  EXPECT_EQ(ExplainSaveFailure(dir_, {"job-1", 3}, io), io);
  EXPECT_TRUE(ExplainSaveFailure(dir_, {"job-1", 3}, absl::OkStatus()).ok());

  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 4}).ok());
  absl::Status explained = ExplainSaveFailure(dir_, {"job-1", 3}, io);
  EXPECT_TRUE(IsCheckpointFenced(explained)) << explained;
  EXPECT_THAT(std::string(explained.message()), HasSubstr("attempt 4 of job 'job-1' claimed it"));
  EXPECT_THAT(std::string(explained.message()), HasSubstr("MANIFEST.json: gone"));
  EXPECT_EQ(ExplainSaveFailure(dir_, {"job-1", 4}, io), io);
  EXPECT_EQ(ReadFence(dir_)->attempt, 4);  // nothing written
}
// The early look a save takes before writing: only another claim in force
// refuses it; a missing or garbled FENCE is left to the commit to judge.
TEST_F(CheckpointFenceTest, TheEarlyCheckRefusesOnlyAnotherClaimInForce) {
  EXPECT_TRUE(CheckFenceHeld(dir_, {"job-1", 3}).ok());  // no directory yet
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 3}).ok());
  EXPECT_TRUE(CheckFenceHeld(dir_, {"job-1", 3}).ok());
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 4}).ok());
  absl::Status stale = CheckFenceHeld(dir_, {"job-1", 3});
  EXPECT_TRUE(IsCheckpointFenced(stale)) << stale;
  EXPECT_THAT(std::string(stale.message()), HasSubstr("attempt 4 of job 'job-1' claimed it"));
  EXPECT_TRUE(CheckFenceHeld(dir_, {"job-1", 4}).ok());
  EXPECT_TRUE(IsCheckpointFenced(CheckFenceHeld(dir_, {"job-2", 0})));
  std::ofstream(fs::path(dir_) / kFenceFileName) << "not a fence\n";
  EXPECT_TRUE(CheckFenceHeld(dir_, {"job-1", 3}).ok());
  fs::remove(fs::path(dir_) / kFenceFileName);
  EXPECT_TRUE(CheckFenceHeld(dir_, {"job-1", 3}).ok());
}

// Another job's claim takes the directory over (the controller keeps two
// live jobs apart); the first job is then fenced.
TEST_F(CheckpointFenceTest, AnotherOwnerTakesTheDirectoryOver) {
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 7}).ok());
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-2", 0}).ok());
  bool ran = true;
  EXPECT_TRUE(IsCheckpointFenced(Touch({"job-1", 7}, &ran)));
  EXPECT_FALSE(ran);
  EXPECT_TRUE(Touch({"job-2", 0}, &ran).ok());
}

TEST_F(CheckpointFenceTest, AMissingFenceIsClaimedAgainAndAGarbledOneIsLeftAlone) {
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 1}).ok());
  fs::remove(fs::path(dir_) / kFenceFileName);
  bool ran = false;
  EXPECT_TRUE(Touch({"job-1", 1}, &ran).ok());
  EXPECT_TRUE(ran);
  EXPECT_EQ(ReadFence(dir_)->attempt, 1);

  std::ofstream(fs::path(dir_) / kFenceFileName) << "not a fence\n";
  absl::Status garbled = Touch({"job-1", 1}, &ran);
  EXPECT_EQ(garbled.code(), absl::StatusCode::kInternal) << garbled;
  EXPECT_FALSE(IsCheckpointFenced(garbled));
  EXPECT_THAT(std::string(garbled.message()), HasSubstr("does not parse"));
  EXPECT_EQ(ClaimCheckpointDir(dir_, {"job-1", 2}).code(), absl::StatusCode::kInternal);
  std::ifstream in(fs::path(dir_) / kFenceFileName);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "not a fence");
}

TEST_F(CheckpointFenceTest, RejectsTokensThatCannotBeWritten) {
  EXPECT_EQ(ClaimCheckpointDir(dir_, {"job\n1", 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ClaimCheckpointDir(dir_, {"job-1", -1}).code(), absl::StatusCode::kInvalidArgument);
}

// A claim waits for an act in progress under the old claim: the claim and
// the act are ordered, never interleaved. (If the lock did not exclude, the
// claim could land while the act runs and this would fail.)
TEST_F(CheckpointFenceTest, AClaimWaitsForAnActUnderTheOldClaim) {
  ASSERT_TRUE(ClaimCheckpointDir(dir_, {"job-1", 1}).ok());
  std::mutex mu;
  std::vector<std::string> order;
  absl::Notification entered;
  absl::Notification claim_started;
  std::thread act([&] {
    absl::Status s = WhileFenceHeld(dir_, {"job-1", 1}, [&] {
      entered.Notify();
      claim_started.WaitForNotification();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard<std::mutex> l(mu);
      order.push_back("act");
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  });
  entered.WaitForNotification();
  std::thread claim([&] {
    claim_started.Notify();
    absl::Status s = ClaimCheckpointDir(dir_, {"job-1", 2}, [&] {
      std::lock_guard<std::mutex> l(mu);
      order.push_back("claim");
    });
    EXPECT_TRUE(s.ok()) << s;
  });
  act.join();
  claim.join();
  EXPECT_EQ(order, (std::vector<std::string>{"act", "claim"}));
}

}  // namespace
}  // namespace loom::engine
