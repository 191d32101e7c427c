#include "controller/recovery/rollbacks.h"

#include <string>

#include "controller/jobs/jobs_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::RecoveryEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class RollbacksTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    rollbacks_ = std::make_unique<Rollbacks>(jobs_.get(), catalog_.get(), store_.get(), nullptr);
    a_ = AddWorker("node-a");
  }
  void TearDown() override {
    rollbacks_.reset();
    JobsFixture::TearDown();
  }

  JobRecord& Running(int max_rollbacks = 5) {
    loom::v1::JobSpec spec;
    spec.mutable_recovery()->set_max_rollbacks(max_rollbacks);
    spec.mutable_recovery()->set_rollback_distance(50);
    spec.mutable_recovery()->set_skip_before(4);
    spec.mutable_recovery()->set_skip_after(8);
    JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a_}, spec);
    // Step s trained on batch s.
    for (int64_t s = 1; s <= 300; ++s) rec.step_batches[s] = s;
    Trained(rec, 300);
    return rec;
  }

  static recovery::SpikeVerdict Spike(int64_t step) {
    recovery::SpikeVerdict v;
    v.spike = true;
    v.signal = "loss";
    v.value = 9.5;
    v.baseline = 3.1;
    v.score = 12;
    v.step = step;
    return v;
  }

  static loom::v1::RollbackJobRequest Request(int64_t to_step) {
    loom::v1::RollbackJobRequest req;
    req.set_job_id("job-1");
    req.set_to_step(to_step);
    return req;
  }

  std::unique_ptr<Rollbacks> rollbacks_;
  std::string a_;
};

TEST_F(RollbacksTest, ASpikeRollsBackBeforeItSkipsItsBatchesAndRequeuesWithoutARestart) {
  JobRecord& rec = Running();
  Commit(rec, 200);
  Commit(rec, 250);
  rollbacks_->OnSpike(rec, Spike(260), /*data_batch=*/260);
  // The newest checkpoint at or before 260 - 50 is step 200.
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.resume_step(), 200);
  ASSERT_EQ(rec.job.skip_batches_size(), 1);
  EXPECT_EQ(rec.job.skip_batches(0).begin(), 256);
  EXPECT_EQ(rec.job.skip_batches(0).end(), 269);
  EXPECT_EQ(rec.job.rollbacks(), 1);
  EXPECT_EQ(rec.job.restarts(), 0);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::SPIKE, RecoveryEvent::ROLLBACK));
  EXPECT_EQ(rec.job.events(1).steps_lost(), 100);
  EXPECT_EQ(rec.job.events(1).cause(), kCauseLossSpike);
  // Its ranks are told to stop, and the store has all of it.
  EXPECT_EQ(TakeCommands(a_).size(), 1u);
  EXPECT_EQ(Stored("job-1").resume_step(), 200);
}

TEST_F(RollbacksTest, ASpikeAfterTheLastRollbackIsSpentFailsTheJob) {
  JobRecord& rec = Running(/*max_rollbacks=*/1);
  rec.job.set_rollbacks(1);
  rollbacks_->OnSpike(rec, Spike(260), 260);
  EXPECT_EQ(rec.job.state(), loom::v1::FAILED);
  EXPECT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::SPIKE, RecoveryEvent::GAVE_UP));
  EXPECT_THAT(rec.job.reason(), HasSubstr("loss spike not cured after 1 rollback(s)"));
}

TEST_F(RollbacksTest, AnOperatorRollbackResumesFromTheNewestCheckpointAtOrBeforeTheStep) {
  JobRecord& rec = Running();
  Commit(rec, 100);
  Commit(rec, 200);
  loom::v1::RollbackJobRequest req = Request(150);
  req.set_reason("bad data shard");
  auto* skip = req.add_skip();
  skip->set_begin(90);  // clipped: batches up to step 100 stay trained
  skip->set_end(140);
  ASSERT_TRUE(Rollbacks::ValidateRequest(req).ok());
  ASSERT_TRUE(rollbacks_->Operator(rec, req).ok());
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.resume_step(), 150);
  ASSERT_EQ(rec.job.skip_batches_size(), 1);
  EXPECT_EQ(rec.job.skip_batches(0).begin(), 101);
  EXPECT_EQ(rec.job.operator_rollbacks(), 1);
  const RecoveryEvent& rb = rec.job.events(0);
  EXPECT_EQ(rb.cause(), kCauseOperator);
  EXPECT_EQ(rb.checkpoint_step(), 100);
  EXPECT_THAT(rb.message(), HasSubstr("operator rollback (bad data shard)"));
}

TEST_F(RollbacksTest, OperatorRollbacksThatCannotBeDoneSayWhy) {
  EXPECT_EQ(Rollbacks::ValidateRequest(Request(-1)).code(), absl::StatusCode::kInvalidArgument);
  JobRecord& rec = Running();
  Commit(rec, 200);
  // Beyond the last step.
  absl::Status s = rollbacks_->Operator(rec, Request(301));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("beyond the job's last step 300"));
  // No checkpoint that far back: not silently from scratch.
  s = rollbacks_->Operator(rec, Request(150));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("(the oldest kept is step 200)"));
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  // From scratch when asked for.
  ASSERT_TRUE(rollbacks_->Operator(rec, Request(0)).ok());
  EXPECT_EQ(rec.job.resume_step(), 0);
  // Not RUNNING any more.
  s = rollbacks_->Operator(rec, Request(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("only a RUNNING job can be rolled back"));
}

}  // namespace
}  // namespace loom::controller
