#include "controller/recovery/failure_handler.h"

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
using ::testing::IsEmpty;

class FailureHandlerTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    failures_ = std::make_unique<FailureHandler>(
        jobs_.get(), &ranks_, &workers_, catalog_.get(), &clock_, nullptr, nullptr,
        FailureHandler::Options{absl::Seconds(1), /*max_rendezvous_retries=*/2});
    a_ = AddWorker("node-a");
    b_ = AddWorker("node-b");
  }
  void TearDown() override {
    failures_.reset();
    JobsFixture::TearDown();
  }

  JobRecord& Running(const std::string& id, int max_restarts) {
    loom::v1::JobSpec spec;
    spec.mutable_recovery()->set_max_restarts(max_restarts);
    return AddJob(id, loom::v1::RUNNING, {a_, b_}, spec);
  }

  void Exit(JobRecord& rec, int rank, int code, bool lease_expired = false) {
    loom::v1::ReportRankExitRequest req;
    req.set_job_id(rec.job.id());
    req.set_rank(rank);
    req.set_generation(rec.job.generation());
    req.set_exit_code(code);
    req.set_lease_expired(lease_expired);
    req.set_reason(code == 0 ? "" : "boom");
    failures_->OnRankExit(rec, req, rank == 0 ? "node-a" : "node-b");
  }

  // Workers heartbeat (their leases are fresh) and the failure settles.
  void Settle() {
    clock_.Advance(absl::Milliseconds(1500));
    for (const std::string& w : {a_, b_}) ASSERT_TRUE(workers_.RecordHeartbeat(w, 0).ok());
    failures_->ResolveSettled();
  }

  std::unique_ptr<FailureHandler> failures_;
  std::string a_, b_;
};

TEST_F(FailureHandlerTest, EveryRankFinishingEndsTheJobSucceeded) {
  JobRecord& rec = Running("job-1", 1);
  Exit(rec, 0, 0);
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  Exit(rec, 1, 0);
  EXPECT_EQ(rec.job.state(), loom::v1::SUCCEEDED);
  EXPECT_EQ(Stored("job-1").state(), loom::v1::SUCCEEDED);
}

TEST_F(FailureHandlerTest, AFailedRankStopsItsPeersAtOnceAndRestartsOnceSettled) {
  JobRecord& rec = Running("job-1", 2);
  Commit(rec, 30);
  Trained(rec, 34);
  Exit(rec, 1, 1);
  // The peers are told to stop now; the decision waits for the settle time.
  EXPECT_EQ(TakeCommands(a_).size(), 1u);
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  failures_->ResolveSettled();
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  Settle();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.restarts(), 1);
  EXPECT_EQ(rec.job.generation(), 1);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::RESTART));
  const RecoveryEvent& restart = rec.job.events(0);
  EXPECT_EQ(restart.checkpoint_step(), 30);
  EXPECT_EQ(restart.steps_lost(), 4);
  EXPECT_THAT(restart.message(), HasSubstr("rank 1 on node-b exited with code 1: boom"));
  EXPECT_THAT(rec.job.reason(), HasSubstr("restart 1/2 from the newest checkpoint"));
  EXPECT_EQ(Stored("job-1").restarts(), 1);
}

TEST_F(FailureHandlerTest, NoRestartsLeftFailsTheJobAndSaysWhy) {
  JobRecord& rec = Running("job-1", 1);
  rec.job.set_restarts(1);
  Exit(rec, 0, 1);
  Settle();
  EXPECT_EQ(rec.job.state(), loom::v1::FAILED);
  EXPECT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::GAVE_UP));
  EXPECT_THAT(rec.job.reason(), HasSubstr("(after 1 restart(s))"));
}

TEST_F(FailureHandlerTest, AFailureARestartCannotCureFailsWithoutSpendingOne) {
  JobRecord& rec = Running("job-1", 3);
  Exit(rec, 0, kRankExitNoGoodCheckpoint);
  Settle();
  EXPECT_EQ(rec.job.state(), loom::v1::FAILED);
  EXPECT_EQ(rec.job.restarts(), 0);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::GAVE_UP));
  EXPECT_THAT(rec.job.events(0).message(), HasSubstr("no restart spent"));
}

TEST_F(FailureHandlerTest, ARendezvousThatFailedBeforeAnyStepIsPlacedAgainWithoutARestart) {
  JobRecord& rec = Running("job-1", 1);
  for (int retry = 1; retry <= 2; ++retry) {
    Exit(rec, 0, kRankExitRendezvousFailed);
    Settle();
    EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
    EXPECT_EQ(rec.job.restarts(), 0);
    EXPECT_THAT(rec.job.reason(), HasSubstr(absl::StrCat("rendezvous retry ", retry, "/2")));
    // Placed again on the same workers.
    jobs_->Transition(rec, loom::v1::SCHEDULED, "placed");
    for (int r = 0; r < 2; ++r) {
      auto* a = rec.job.add_ranks();
      a->set_rank(r);
      a->set_worker_id(r == 0 ? a_ : b_);
    }
  }
  // The retries are spent: the usual restart.
  Exit(rec, 0, kRankExitRendezvousFailed);
  Settle();
  EXPECT_EQ(rec.job.restarts(), 1);
  EXPECT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::RESTART));
}

// A rank that joined and then lost its peer in the first collective may
// exit first, with another code; the peer that could not join says the
// attempt never trained: it is placed again, no restart spent.
TEST_F(FailureHandlerTest, AnyRankThatCouldNotJoinBeforeAStepMakesItARendezvousRetry) {
  JobRecord& rec = Running("job-1", 0);
  Exit(rec, 0, 1);  // "training failed: ... Connection closed by peer"
  Exit(rec, 1, kRankExitRendezvousFailed);
  Settle();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.restarts(), 0);
  EXPECT_THAT(rec.job.reason(), HasSubstr("rendezvous retry 1/2"));
  // Once a step was reported, a failure to join is no such thing.
  JobRecord& trained = Running("job-2", 0);
  Trained(trained, 5);
  Exit(trained, 0, 1);
  Exit(trained, 1, kRankExitRendezvousFailed);
  Settle();
  EXPECT_EQ(trained.job.state(), loom::v1::FAILED);
}

TEST_F(FailureHandlerTest, ASilentWorkerIsNamedAsTheCause) {
  JobRecord& rec = Running("job-1", 1);
  Exit(rec, 0, 1);
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(workers_.RecordHeartbeat(a_, 0).ok());  // node-b stays silent
  failures_->ResolveSettled();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_THAT(rec.job.events(0).message(),
              HasSubstr("on node node-b stopped heartbeating (silent for 3.0s); then rank 0"));
}

TEST_F(FailureHandlerTest, ARankKilledWhenItsLeaseRanOutSaysSo) {
  JobRecord& rec = Running("job-1", 1);
  Exit(rec, 1, 137, /*lease_expired=*/true);
  ASSERT_TRUE(rec.pending_failure.has_value());
  EXPECT_EQ(rec.pending_failure->cause_kind, kCauseWorkerLost);
  EXPECT_THAT(rec.pending_failure->reason,
              HasSubstr("rank 1 on node-b was killed when its worker's lease ran out"));
}

TEST_F(FailureHandlerTest, ARestartResumesFromTheNewestSnapshotANodeStillAliveHolds) {
  // Checkpoint at 30, trained to 47; rank 0's node (node-a) holds a
  // snapshot of step 46 in memory, rank 1's (node-b) one of step 45.
  JobRecord& rec = Running("job-1", 2);
  Commit(rec, 30);
  Trained(rec, 47);
  rec.attempt_snapshot_steps = {46, 45};
  Exit(rec, 1, 1);
  Settle();
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::RESTART));
  EXPECT_EQ(rec.job.events(0).checkpoint_step(), 46);
  EXPECT_EQ(rec.job.events(0).steps_lost(), 1);
  EXPECT_THAT(rec.job.reason(), HasSubstr("restart 1/2 from the in-memory snapshot at step 46"));
  EXPECT_TRUE(rec.attempt_snapshot_steps.empty());  // the next attempt reports its own

  // node-a is lost (its lease ran out): its memory went with it.
  JobRecord& other = Running("job-2", 2);
  Commit(other, 30);
  Trained(other, 47);
  other.attempt_snapshot_steps = {46, 45};
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(workers_.RecordHeartbeat(b_, 0).ok());
  ASSERT_EQ(workers_.ExpireLeases().size(), 1u);
  failures_->FailOrRestart(other, "worker on node-a lost", kCauseWorkerLost);
  ASSERT_THAT(EventKinds(other), ElementsAre(RecoveryEvent::RESTART));
  EXPECT_EQ(other.job.events(0).checkpoint_step(), 45);
  EXPECT_EQ(other.job.events(0).steps_lost(), 2);

  // With no snapshot newer than the checkpoint, the checkpoint as before.
  JobRecord& plain = Running("job-3", 2);
  Commit(plain, 30);
  Trained(plain, 47);
  plain.attempt_snapshot_steps = {-1, 20};
  failures_->FailOrRestart(plain, "rank failed", kCauseWorkerLost);
  EXPECT_EQ(plain.job.events(0).checkpoint_step(), 30);
  EXPECT_THAT(plain.job.reason(), HasSubstr("from the newest checkpoint"));
}

TEST_F(FailureHandlerTest, AnEndedJobIsNotRestarted) {
  JobRecord& rec = Running("job-1", 1);
  jobs_->Stop(rec, loom::v1::CANCELLED, "cancelled by user");
  failures_->FailOrRestart(rec, "worker lost", kCauseWorkerLost);
  EXPECT_EQ(rec.job.state(), loom::v1::CANCELLED);
  EXPECT_THAT(EventKinds(rec), IsEmpty());
}

}  // namespace
}  // namespace loom::controller
