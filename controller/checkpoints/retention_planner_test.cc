#include "controller/checkpoints/retention_planner.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/retention.h"
#include "common/object_store/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;

class RetentionPlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/retention-planner-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    job_.set_id("gpt-7");
    job_.mutable_spec()->mutable_checkpoint()->set_dir(dir_);
    job_.mutable_spec()->mutable_recovery()->set_rollback_distance(10);  // a 20-step window
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  loom::v1::Job job_;
};

TEST_F(RetentionPlannerTest, SaysWhatEachTierWouldDeleteAndWhyAndDeletesNothing) {
  for (int64_t step = 10; step <= 100; step += 10) {
    object_store::WriteTestCheckpoint(dir_, step, 0, {100}, step == 40 ? 1.5 : 3.0);
    // Uploaded, but for step 60: the store keeps every checkpoint, so the
    // directory keeps it until its upload is settled.
    if (step != 60) engine::MarkUploadSettled(engine::CheckpointPath(dir_, step));
  }
  loom::v1::RetentionPolicy* local =
      job_.mutable_spec()->mutable_checkpoint()->mutable_retention()->mutable_local();
  local->set_newest(2);
  local->set_every(50);
  local->set_best(1);
  job_.mutable_spec()->mutable_checkpoint()->set_keep(2);
  job_.mutable_spec()->mutable_checkpoint()->set_remote("s3://bucket/runs");
  RetentionPlanner planner([]() -> absl::StatusOr<object_store::S3Config> {
    return absl::FailedPreconditionError("no credentials: set AWS_ACCESS_KEY_ID");
  });
  loom::v1::PlanCheckpointRetentionResponse plan =
      planner.Plan(job_, {{20, "init_from of other-3 (PENDING), which has no checkpoint"}});
  ASSERT_EQ(plan.verdicts_size(), 10);
  std::vector<int64_t> kept, going;
  for (const loom::v1::RetentionVerdict& v : plan.verdicts()) {
    EXPECT_EQ(v.tier(), "local");
    (v.keep() ? kept : going).push_back(v.step());
  }
  // Newest 2 (100, 90), the window (the newest at or before 80, and after
  // it), every 50 (100, 50), the best (40), the held one (20) and the one
  // not yet uploaded (60).
  EXPECT_THAT(kept, ::testing::ElementsAre(100, 90, 80, 60, 50, 40, 20));
  EXPECT_THAT(going, ::testing::ElementsAre(70, 30, 10));
  EXPECT_THAT(plan.verdicts(3).reason(), HasSubstr("not among the newest 2"));
  EXPECT_EQ(plan.verdicts(4).reason(), "waiting for its upload (the store keeps every checkpoint)");
  EXPECT_TRUE(plan.verdicts(5).has_val_loss());
  EXPECT_EQ(plan.local_policy(), "newest 2, every 50 steps, best 1 by validation loss");
  EXPECT_EQ(plan.remote_policy(), "every checkpoint");
  EXPECT_THAT(plan.remote_error(), HasSubstr("no credentials"));
  EXPECT_THAT(plan.remote_error(), HasSubstr("s3://bucket/runs/gpt-7"));
  ASSERT_EQ(plan.protections_size(), 2);
  EXPECT_THAT(plan.protections(0), HasSubstr("step 20: init_from of other-3"));
  EXPECT_THAT(plan.protections(1), HasSubstr("at or before step 80"));
  // Nothing was deleted.
  for (int64_t step = 10; step <= 100; step += 10) {
    EXPECT_TRUE(std::filesystem::exists(engine::CheckpointPath(dir_, step))) << step;
  }
}

TEST_F(RetentionPlannerTest, AJobWithNoCheckpointsHasNoVerdicts) {
  loom::v1::PlanCheckpointRetentionResponse plan = RetentionPlanner().Plan(job_, {});
  EXPECT_EQ(plan.verdicts_size(), 0);
  EXPECT_EQ(plan.local_policy(), "newest 3");
  EXPECT_TRUE(plan.remote_policy().empty());
  EXPECT_TRUE(plan.remote_error().empty());
}

}  // namespace
}  // namespace loom::controller
