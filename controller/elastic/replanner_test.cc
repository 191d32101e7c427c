#include "controller/elastic/replanner.h"

#include <string>

#include "common/rank_exit.h"
#include "controller/jobs/jobs_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::RecoveryEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Re-planning over the real table, registry and catalog; growing goes
// through the preemptor, which re-planning depends on by design.
class ReplannerTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    queues_.min_run_time = absl::ZeroDuration();
    preemptor_ = std::make_unique<Preemptor>(jobs_.get(), &ranks_, catalog_.get(), &clock_, nullptr,
                                             &queues_);
    replanner_ = std::make_unique<Replanner>(jobs_.get(), &workers_, catalog_.get(),
                                             preemptor_.get(), &clock_, nullptr, &queues_,
                                             Replanner::Options{absl::Seconds(1)});
    preemptor_->SetMoveHandler(MoveIntent::kGrow, replanner_.get());
    for (const char* node : {"node-a", "node-b", "node-c"}) w_.push_back(AddWorker(node, 1));
  }
  void TearDown() override {
    replanner_.reset();
    preemptor_.reset();
    JobsFixture::TearDown();
  }

  // An elastic data-parallel job of 1 to 3 ranks (a tiny GPT).
  static loom::v1::JobSpec Elastic(int ranks) {
    loom::v1::JobSpec spec = TinyGptSpec("stretchy");
    spec.mutable_schedule()->set_total_steps(1000);
    spec.mutable_resources()->set_workers(ranks);
    spec.mutable_resources()->set_ranks(ranks);
    spec.mutable_elastic()->set_min_ranks(1);
    spec.mutable_elastic()->set_max_ranks(3);
    return spec;
  }

  scheduling::QueueConfig queues_ = scheduling::DefaultQueueConfig();
  std::unique_ptr<Preemptor> preemptor_;
  std::unique_ptr<Replanner> replanner_;
  std::vector<std::string> w_;
};

TEST_F(ReplannerTest, AnElasticJobThatLostAWorkerIsReplannedForTheRestWithoutARestart) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, w_, Elastic(3));
  Commit(rec, 4);
  Trained(rec, 6);
  // node-c goes silent: only the two others can take ranks.
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(workers_.RecordHeartbeat(w_[0], 0).ok());
  ASSERT_TRUE(workers_.RecordHeartbeat(w_[1], 0).ok());
  ASSERT_TRUE(replanner_->Replan(rec, "worker w-3 stopped heartbeating", kCauseWorkerLost));
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.spec().resources().ranks(), 2);
  EXPECT_EQ(rec.job.layout_generation(), 1);
  EXPECT_EQ(rec.job.restarts(), 0);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::REPLANNED));
  const RecoveryEvent& ev = rec.job.events(0);
  EXPECT_EQ(ev.cause(), kCauseWorkerLost);
  EXPECT_EQ(ev.checkpoint_step(), 4);
  EXPECT_EQ(ev.steps_lost(), 2);
  EXPECT_THAT(ev.message(), HasSubstr("re-planned from 3 to 2 rank(s) on 2 worker(s)"));
  EXPECT_EQ(Stored("job-1").spec().resources().ranks(), 2);
}

TEST_F(ReplannerTest, AJobThatIsNotElasticOrHasNoRoomIsLeftAsItIs) {
  loom::v1::JobSpec fixed = Elastic(1);
  fixed.clear_elastic();
  JobRecord& rec = AddJob("fixed-1", loom::v1::RUNNING, {w_[0]}, fixed);
  EXPECT_FALSE(replanner_->Replan(rec, "worker lost", kCauseWorkerLost));
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  loom::v1::JobSpec tight = Elastic(3);
  tight.mutable_elastic()->set_min_ranks(3);
  JobRecord& other = AddJob("tight-2", loom::v1::RUNNING, {w_[1], w_[2]}, tight);
  EXPECT_FALSE(replanner_->GangPlans(other));  // w_[0] is taken
  EXPECT_FALSE(replanner_->Replan(other, "worker lost", kCauseWorkerLost));
  EXPECT_TRUE(other.job.events().empty());
}

TEST_F(ReplannerTest, ARunningJobBelowItsMaximumGrowsWhenRoomComesBack) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {w_[0], w_[1]}, Elastic(2));
  Commit(rec, 8);
  Trained(rec, 8);
  replanner_->Grow();
  // Asked to save and stop to grow.
  ASSERT_TRUE(rec.preempting.has_value());
  EXPECT_EQ(rec.preempting->intent, MoveIntent::kGrow);
  EXPECT_EQ(rec.preempting->grow_to, 3);
  EXPECT_THAT(rec.job.reason(), HasSubstr("growing to 3 rank(s)"));
  EXPECT_TRUE(TakeCommands(w_[0])[0].stop().checkpoint_first());
  // Its ranks saved and stopped: re-planned for three.
  RanksExited(rec);
  preemptor_->Finish(rec);
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.spec().resources().ranks(), 3);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::REPLANNED));
  EXPECT_EQ(rec.job.events(0).cause(), kCauseCapacityReturned);
  EXPECT_EQ(rec.job.events(0).steps_lost(), 0);
  EXPECT_EQ(rec.job.preemptions(), 0);
}

TEST_F(ReplannerTest, NothingGrowsWhileAJobWaits) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {w_[0]}, Elastic(1));
  Trained(rec, 3);
  AddJob("waiting-2", loom::v1::PENDING, {});
  replanner_->Grow();
  EXPECT_FALSE(rec.preempting.has_value());
}

}  // namespace
}  // namespace loom::controller
