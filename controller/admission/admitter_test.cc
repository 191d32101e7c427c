#include "controller/admission/admitter.h"

#include <string>

#include "controller/jobs/jobs_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;

// Admission alone: no preemptor, no elastic re-planning.
class AdmitterTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    admitter_ = std::make_unique<Admitter>(jobs_.get(), &workers_, catalog_.get(), &clock_,
                                           &queues_, nullptr, nullptr, &schedule_);
    jobs_->AddListener(admitter_.get());
  }
  void TearDown() override {
    admitter_.reset();
    JobsFixture::TearDown();
  }

  JobRecord& Pending(const std::string& id, int workers, int ranks) {
    loom::v1::JobSpec spec;
    spec.mutable_resources()->set_workers(workers);
    spec.mutable_resources()->set_ranks(ranks);
    return AddJob(id, loom::v1::PENDING, {}, spec);
  }

  scheduling::QueueConfig queues_ = scheduling::DefaultQueueConfig();
  ScheduleSignal schedule_;
  std::unique_ptr<Admitter> admitter_;
};

TEST_F(AdmitterTest, AQueuedJobAsksForACycleWhichPlacesItAndSendsItsStarts) {
  const std::string a = AddWorker("node-a", 2);
  const std::string b = AddWorker("node-b", 2);
  schedule_.Reset();
  JobRecord& rec = Pending("job-1", 2, 4);
  EXPECT_TRUE(schedule_.Due(clock_.Now()));
  admitter_->ScheduleIfDue();
  EXPECT_FALSE(schedule_.Due(clock_.Now()));
  ASSERT_EQ(rec.job.state(), loom::v1::SCHEDULED);
  ASSERT_EQ(rec.job.ranks_size(), 4);
  EXPECT_EQ(rec.live.size(), 4u);
  int starts = 0;
  for (const std::string& w : {a, b}) {
    EXPECT_EQ(workers_.Find(w)->ranks.size(), 2u);
    for (const auto& c : TakeCommands(w)) {
      ASSERT_TRUE(c.has_start());
      EXPECT_EQ(c.start().world_size(), 4);
      EXPECT_EQ(c.start().master_port(), 29500);
      ++starts;
    }
  }
  EXPECT_EQ(starts, 4);
  // Rank 0's worker gave its rendezvous port; it reports a fresh one next.
  EXPECT_EQ(workers_.Find(rec.job.ranks(0).worker_id())->rendezvous_port, 0);
  EXPECT_EQ(rec.placements.at(0).size(), 4u);
  EXPECT_EQ(Stored("job-1").state(), loom::v1::SCHEDULED);
}

TEST_F(AdmitterTest, AGangThatDoesNotFitWaitsAndSaysWhatIsShort) {
  AddWorker("node-a", 2);
  JobRecord& rec = Pending("job-1", 2, 2);
  admitter_->Schedule();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.queue_position(), 1);
  EXPECT_EQ(rec.job.wait_reason(), "gang does not fit");
  EXPECT_FALSE(rec.job.reason().empty());
  EXPECT_NE(rec.job.reason(), "submitted");
}

TEST_F(AdmitterTest, ARestartedJobWaitsForItsPreviousAttemptsRanksAndTheLeaseMargin) {
  AddWorker("node-a", 2);
  JobRecord& rec = Pending("job-1", 1, 1);
  rec.live.insert({"w-old", 0});
  admitter_->Schedule();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.reason(), "waiting for 1 rank(s) of the previous attempt to exit");
  rec.live.clear();
  rec.not_before = clock_.Now() + absl::Seconds(3);
  admitter_->Schedule();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_THAT(rec.job.reason(), HasSubstr("waiting 3.0s more"));
  // The cycle is due again when that time comes, not before.
  EXPECT_FALSE(schedule_.Due(clock_.Now() + absl::Seconds(2)));
  EXPECT_TRUE(schedule_.Due(clock_.Now() + absl::Seconds(3)));
  clock_.Advance(absl::Seconds(3));
  admitter_->ScheduleIfDue();
  EXPECT_EQ(rec.job.state(), loom::v1::SCHEDULED);
}

TEST_F(AdmitterTest, ACordonedNodeGetsNoNewRanks) {
  AddWorker("node-a", 2);
  workers_.Cordon("node-a", clock_.Now() + absl::Minutes(10), "slow rank");
  JobRecord& rec = Pending("job-1", 1, 1);
  admitter_->Schedule();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_TRUE(schedule_.Due(clock_.Now() + absl::Minutes(10)));
}

TEST_F(AdmitterTest, ListQueuesCountsWhatEachQueueHoldsAndWaitsFor) {
  const std::string a = AddWorker("node-a", 2);
  AddJob("running-1", loom::v1::RUNNING, {a});
  Pending("waiting-2", 3, 3);
  const loom::v1::ListQueuesResponse resp = admitter_->ListQueues();
  ASSERT_EQ(resp.queues_size(), 1);
  EXPECT_EQ(resp.queues(0).running_jobs(), 1);
  EXPECT_EQ(resp.queues(0).pending_jobs(), 1);
  EXPECT_EQ(resp.queues(0).used().slots(), 1);
}

}  // namespace
}  // namespace loom::controller
