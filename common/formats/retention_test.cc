#include "common/formats/retention.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;

// Checkpoints of attempt `generation` every `interval` steps up to `last`,
// in lineage order (newest first).
std::vector<RetentionCandidate> Steps(int64_t generation, int64_t interval, int64_t last) {
  std::vector<RetentionCandidate> out;
  for (int64_t s = last; s >= interval; s -= interval) {
    out.push_back({"step-" + std::to_string(s), s, generation, std::nullopt});
  }
  return out;
}

RetentionGuard Tip(int64_t step, int64_t generation = 0) {
  RetentionGuard g;
  g.tip_step = step;
  g.lineage = {{generation, 0}};
  return g;
}

std::vector<int64_t> Kept(const std::vector<RetentionVerdict>& verdicts) {
  std::vector<int64_t> out;
  for (const RetentionVerdict& v : verdicts) {
    if (v.keep) out.push_back(v.checkpoint.step);
  }
  return out;
}

TEST(RetentionTest, NewestEveryAndBestEachKeepTheirsAndSayWhy) {
  std::vector<RetentionCandidate> c = Steps(0, 10, 100);
  // Validation losses: step 30 is the best, 60 the second best.
  for (RetentionCandidate& r : c) r.val_loss = 3.0 - 0.01 * static_cast<double>(r.step);
  c[7].val_loss = 0.5;  // step 30
  c[4].val_loss = 0.7;  // step 60
  RetentionPolicy policy;
  policy.newest = 2;
  policy.every = 50;
  policy.best = 2;
  std::vector<RetentionVerdict> v = PlanRetention(c, policy, Tip(100));
  EXPECT_THAT(Kept(v), ::testing::ElementsAre(100, 90, 60, 50, 30));
  EXPECT_THAT(v[0].reason, HasSubstr("one of the newest 2"));
  EXPECT_THAT(v[0].reason, HasSubstr("multiple of 50"));  // 100 is both
  EXPECT_THAT(v[4].reason, HasSubstr("best 2 by validation loss (0.7000)"));
  EXPECT_THAT(v[5].reason, HasSubstr("multiple of 50"));
  EXPECT_FALSE(v[2].keep);
  EXPECT_EQ(
      v[2].reason,
      "not among the newest 2, not a multiple of 50, not among the best 2 by validation loss");
  EXPECT_EQ(DescribeRetention(policy), "newest 2, every 50 steps, best 2 by validation loss");
}

TEST(RetentionTest, TheRollbackWindowAndHeldCheckpointsAreNeverDeleted) {
  RetentionPolicy policy;
  policy.newest = 1;
  RetentionGuard guard = Tip(100);
  guard.rollback_distance = 25;  // resumes from the newest at or before 75: step 70
  guard.held[20] = "the resume point of attempt 0";
  std::vector<RetentionVerdict> v = PlanRetention(Steps(0, 10, 100), policy, guard);
  EXPECT_THAT(Kept(v), ::testing::ElementsAre(100, 90, 80, 70, 20));
  EXPECT_THAT(v[3].reason, HasSubstr("rollback window"));
  EXPECT_THAT(v[3].reason, HasSubstr("at or before step 75"));
  EXPECT_EQ(v[8].reason, "the resume point of attempt 0");
  EXPECT_THAT(v[4].reason, HasSubstr("older than the rollback window"));
}

TEST(RetentionTest, AnAbandonedBranchGoesOnceTheNewBranchPassesIt) {
  // Attempt 0 wrote 10..80; a spike rolled back to 40 and attempt 1 wrote
  // 50 and 60 on the new branch.
  std::vector<RetentionCandidate> c = {{"g1-60", 60, 1, 0.1}, {"g1-50", 50, 1, 0.1}};
  for (RetentionCandidate r : Steps(0, 10, 80)) c.push_back(r);
  RetentionGuard guard = Tip(60, 1);
  guard.lineage = {{0, 0}, {1, 41}};
  RetentionPolicy policy;
  policy.newest = 10;
  std::vector<RetentionVerdict> v = PlanRetention(c, policy, guard);
  // On the branch: 60, 50 (attempt 1) and 40..10 (attempt 0). Off it: 80
  // and 70 are past the tip (kept for now); attempt 0's 60 and 50 were
  // abandoned.
  EXPECT_THAT(Kept(v), ::testing::ElementsAre(60, 50, 80, 70, 40, 30, 20, 10));
  EXPECT_THAT(v[2].reason, HasSubstr("another branch, past the tip"));
  EXPECT_FALSE(v[4].keep);
  EXPECT_FALSE(v[5].keep);
  EXPECT_EQ(v[4].reason,
            "abandoned by a rollback: attempt 0's branch, at or before the tip at step 60");
  // A policy that keeps everything deletes nothing.
  policy.all = true;
  for (const RetentionVerdict& r : PlanRetention(c, policy, guard)) {
    EXPECT_TRUE(r.keep) << r.checkpoint.name;
    EXPECT_THAT(r.reason, HasSubstr("every checkpoint"));
  }
}

TEST(RetentionTest, BestCountsOnlyScoredCheckpointsAndBreaksTiesByNewest) {
  std::vector<RetentionCandidate> c = Steps(0, 10, 50);
  c[1].val_loss = 1.0;  // 40
  c[2].val_loss = 1.0;  // 30: a tie, 40 is newer
  RetentionPolicy policy;
  policy.newest = 1;
  policy.best = 1;
  std::vector<RetentionVerdict> v = PlanRetention(c, policy, Tip(50));
  EXPECT_THAT(Kept(v), ::testing::ElementsAre(50, 40));
  EXPECT_EQ(v[4].reason, "not among the newest 1, no validation loss");
}

TEST(RetentionTest, AnUnreadableManifestIsOnNoBranch) {
  std::vector<RetentionCandidate> c = Steps(0, 10, 30);
  c.push_back({"step-5", 5, -1, std::nullopt});
  std::vector<RetentionVerdict> v = PlanRetention(c, RetentionPolicy{}, Tip(30));
  EXPECT_FALSE(v[3].keep);
  EXPECT_THAT(v[3].reason, HasSubstr("manifest does not read"));
}

// The uploader lags the saves (it takes the newest first): a checkpoint the
// store keeps for good stays in the directory until its upload is settled,
// and one the store would only keep while it is among its newest does not.
TEST(RetentionTest, ACheckpointTheStoreKeepsForGoodWaitsForItsUpload) {
  std::vector<RetentionCandidate> c = Steps(0, 100, 2300);
  for (RetentionCandidate& r : c) r.awaiting_upload = r.step > 1900;
  c[3].val_loss = 0.5;  // step 2000
  c[4].val_loss = 0.4;  // step 1900, uploaded
  c[5].val_loss = 0.9;  // step 1800, uploaded
  RetentionPolicy local;
  local.newest = 2;
  RetentionGuard guard = Tip(2300);
  guard.upload = RetentionPolicy{};
  guard.upload->newest = 2;
  guard.upload->every = 1000;
  std::vector<RetentionVerdict> v = PlanRetention(c, local, guard);
  // 2100 and 2200 await their uploads too, but the store would prune them
  // once 2300 is there.
  EXPECT_THAT(Kept(v), ::testing::ElementsAre(2300, 2200, 2000));
  EXPECT_EQ(v[3].reason, "waiting for its upload (the store keeps each multiple of 1000)");
  c[3].awaiting_upload = false;  // settled: it goes
  EXPECT_THAT(Kept(PlanRetention(c, local, guard)), ::testing::ElementsAre(2300, 2200));

  // The store's best by validation loss: 2000 is second best to 1900.
  c[3].awaiting_upload = true;
  guard.upload->every = 0;
  guard.upload->best = 2;
  v = PlanRetention(c, local, guard);
  EXPECT_THAT(Kept(v), ::testing::ElementsAre(2300, 2200, 2000));
  EXPECT_EQ(v[3].reason, "waiting for its upload (the store keeps the best 2 by validation loss)");

  // Every checkpoint: the newest kMaxHeldForUpload that await it, so that an
  // outage cannot fill the disk.
  for (RetentionCandidate& r : c) r.awaiting_upload = true;
  guard.upload = RetentionPolicy{};
  guard.upload->all = true;
  v = PlanRetention(c, local, guard);
  EXPECT_EQ(Kept(v).size(), static_cast<size_t>(kMaxHeldForUpload));
  EXPECT_EQ(v[kMaxHeldForUpload - 1].reason,
            "waiting for its upload (the store keeps every checkpoint)");
  EXPECT_FALSE(v[kMaxHeldForUpload].keep);

  // No store named: nothing waits.
  guard.upload.reset();
  EXPECT_THAT(Kept(PlanRetention(c, local, guard)), ::testing::ElementsAre(2300, 2200));
}

TEST(RetentionTest, TheUploadMarkSitsBesideTheCheckpoints) {
  const std::string dir = ::testing::TempDir() + "/retention-mark-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string ckpt = dir + "/step-000000100";
  std::filesystem::create_directories(ckpt);
  EXPECT_EQ(UploadSettledPath(ckpt), dir + "/upload-settled/step-000000100");
  EXPECT_FALSE(UploadSettled(ckpt));
  MarkUploadSettled(ckpt);
  EXPECT_TRUE(UploadSettled(ckpt));
  // The directory still lists only its checkpoints.
  const std::vector<CheckpointEntry> entries = ListCheckpoints(dir);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].step, 100);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom::engine
