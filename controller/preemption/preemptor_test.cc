#include "controller/preemption/preemptor.h"

#include <string>
#include <vector>

#include "common/rank_exit.h"
#include "controller/jobs/jobs_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::RecoveryEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class PreemptorTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    queues_.preemption_grace = absl::Seconds(30);
    preemptor_ = std::make_unique<Preemptor>(jobs_.get(), &ranks_, catalog_.get(), &clock_, nullptr,
                                             &queues_);
    a_ = AddWorker("node-a");
    b_ = AddWorker("node-b");
  }
  void TearDown() override {
    preemptor_.reset();
    JobsFixture::TearDown();
  }

  static scheduling::Preemption For(const std::string& job) {
    scheduling::Preemption p;
    p.for_job_id = job;
    p.reason = scheduling::PreemptionReason::kPriority;
    p.message = "job urgent-9 (priority 100) needs the slots";
    return p;
  }

  // Rank `rank` of rec's attempt reports its exit with `code`.
  bool Exit(JobRecord& rec, int rank, int code) {
    loom::v1::ReportRankExitRequest req;
    req.set_job_id(rec.job.id());
    req.set_rank(rank);
    req.set_generation(rec.job.generation());
    req.set_exit_code(code);
    for (const auto& a : rec.job.ranks()) {
      if (a.rank() == rank) rec.live.erase({a.worker_id(), rank});
    }
    return preemptor_->OnRankExit(rec, req);
  }

  scheduling::QueueConfig queues_ = scheduling::DefaultQueueConfig();
  std::unique_ptr<Preemptor> preemptor_;
  std::string a_, b_;
};

// A move's handler as another subsystem would register it: what it was
// given, and a requeue as its outcome.
class RecordingMoveHandler : public MoveHandler {
 public:
  explicit RecordingMoveHandler(JobTable* jobs) : jobs_(jobs) {}
  void FinishMove(JobRecord& rec, const PreemptionInProgress& move) override {
    moves.push_back(move);
    jobs_->Requeue(rec, "moved");
  }
  std::vector<PreemptionInProgress> moves;

 private:
  JobTable* jobs_;
};

TEST_F(PreemptorTest, AVictimSavesStopsAndIsRequeuedPreemptedWithNothingLost) {
  JobRecord& rec = AddJob("victim-1", loom::v1::RUNNING, {a_, b_});
  Commit(rec, 40);
  Trained(rec, 40);
  preemptor_->Preempt(rec, For("urgent-9"));
  // The ask is recorded and stored before the ranks act, and each worker
  // is told to save first.
  EXPECT_THAT(EventKinds(Stored("victim-1")), ElementsAre(RecoveryEvent::PREEMPTING));
  for (const std::string& w : {a_, b_}) {
    const auto commands = TakeCommands(w);
    ASSERT_EQ(commands.size(), 1u);
    EXPECT_TRUE(commands[0].stop().checkpoint_first());
    EXPECT_THAT(commands[0].stop().reason(), HasSubstr("preempted for job urgent-9"));
  }
  EXPECT_THAT(rec.job.reason(), HasSubstr("saving a checkpoint at the next step boundary"));
  // The ranks save at step 40 and stop; the last exit finishes it.
  EXPECT_TRUE(Exit(rec, 0, kRankExitSavedAndStopped));
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  EXPECT_TRUE(Exit(rec, 1, kRankExitSavedAndStopped));
  EXPECT_EQ(rec.job.state(), loom::v1::PREEMPTED);
  EXPECT_EQ(rec.job.preemptions(), 1);
  EXPECT_EQ(rec.job.restarts(), 0);
  EXPECT_EQ(rec.job.generation(), 1);
  const RecoveryEvent& preempted = rec.job.events(1);
  EXPECT_EQ(preempted.kind(), RecoveryEvent::PREEMPTED);
  EXPECT_EQ(preempted.checkpoint_step(), 40);
  EXPECT_EQ(preempted.steps_lost(), 0);
  EXPECT_THAT(preempted.message(), HasSubstr("0 steps lost"));
  EXPECT_EQ(Stored("victim-1").state(), loom::v1::PREEMPTED);
}

TEST_F(PreemptorTest, AVictimNotYetTrainingIsRequeuedAtOnce) {
  JobRecord& rec = AddJob("victim-1", loom::v1::SCHEDULED, {a_});
  preemptor_->Preempt(rec, For("urgent-9"));
  EXPECT_EQ(rec.job.state(), loom::v1::PREEMPTED);
  EXPECT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::PREEMPTING, RecoveryEvent::PREEMPTED));
  EXPECT_THAT(rec.job.events(0).message(), HasSubstr("stop without a save"));
  // A plain stop: nothing to save.
  const auto commands = TakeCommands(a_);
  ASSERT_EQ(commands.size(), 1u);
  EXPECT_FALSE(commands[0].stop().checkpoint_first());
}

TEST_F(PreemptorTest, ASaveThatMissesTheGraceGetsAPlainStopAndCountsWhatIsLost) {
  JobRecord& rec = AddJob("victim-1", loom::v1::RUNNING, {a_});
  Commit(rec, 10);
  Trained(rec, 17);
  preemptor_->Preempt(rec, For("urgent-9"));
  TakeCommands(a_);
  clock_.Advance(absl::Seconds(29));
  preemptor_->CheckGraces();
  EXPECT_TRUE(TakeCommands(a_).empty());
  clock_.Advance(absl::Seconds(2));
  preemptor_->CheckGraces();
  const auto commands = TakeCommands(a_);
  ASSERT_EQ(commands.size(), 1u);
  EXPECT_FALSE(commands[0].stop().checkpoint_first());
  EXPECT_THAT(rec.job.reason(), HasSubstr("no checkpoint committed within the grace of 30s"));
  EXPECT_TRUE(Exit(rec, 0, 143));
  EXPECT_EQ(rec.job.state(), loom::v1::PREEMPTED);
  EXPECT_EQ(rec.job.events(1).steps_lost(), 7);
  EXPECT_THAT(rec.job.events(1).message(), HasSubstr("without a save (the grace ran out)"));
}

TEST_F(PreemptorTest, RunningJobsThatAreFailingOrAlreadyMovingAreNotPreempted) {
  JobRecord& failing = AddJob("failing-1", loom::v1::RUNNING, {a_});
  failing.pending_failure = PendingFailure{clock_.Now(), "rank 0 exited", false, "", ""};
  preemptor_->Preempt(failing, For("urgent-9"));
  EXPECT_FALSE(failing.preempting.has_value());
  JobRecord& done = AddJob("done-2", loom::v1::PENDING, {});
  preemptor_->Preempt(done, For("urgent-9"));
  EXPECT_FALSE(done.preempting.has_value());
  EXPECT_TRUE(TakeCommands(a_).empty());
}

TEST_F(PreemptorTest, EveryRankFinishingTrainingMeanwhileEndsTheJobSucceeded) {
  JobRecord& rec = AddJob("victim-1", loom::v1::RUNNING, {a_, b_});
  Trained(rec, 99);
  preemptor_->Preempt(rec, For("urgent-9"));
  EXPECT_TRUE(Exit(rec, 0, 0));
  EXPECT_TRUE(Exit(rec, 1, 0));
  EXPECT_EQ(rec.job.state(), loom::v1::SUCCEEDED);
  EXPECT_THAT(rec.job.reason(), HasSubstr("finished training before the preemption took effect"));
}

TEST_F(PreemptorTest, RanksThatSavedAndStoppedWhileTheControllerWasAwayArePreemptedNotFailed) {
  JobRecord& rec = AddJob("victim-1", loom::v1::RUNNING, {a_});
  Commit(rec, 20);
  Trained(rec, 20);
  EXPECT_TRUE(Exit(rec, 0, kRankExitSavedAndStopped));
  EXPECT_EQ(rec.job.state(), loom::v1::PREEMPTED);
  EXPECT_EQ(rec.job.restarts(), 0);
  // A plain failure is not the preemptor's.
  JobRecord& other = AddJob("other-2", loom::v1::RUNNING, {b_});
  EXPECT_FALSE(Exit(other, 0, 1));
  EXPECT_EQ(other.job.state(), loom::v1::RUNNING);
}

TEST_F(PreemptorTest, AMoveThatIsNoPreemptionFinishesThroughItsHandler) {
  RecordingMoveHandler elastic(jobs_.get());
  preemptor_->SetMoveHandler(MoveIntent::kGrow, &elastic);
  JobRecord& rec = AddJob("elastic-1", loom::v1::RUNNING, {a_});
  Trained(rec, 5);
  preemptor_
      ->SaveAndStopToMove(rec, MoveIntent::kGrow, "capacity_returned", "growing to 2 rank(s)",
                          "room for 2 rank(s): save a checkpoint, then stop to grow")
      .grow_to = 2;
  EXPECT_THAT(rec.job.reason(), HasSubstr("growing to 2 rank(s): saving a checkpoint"));
  const auto commands = TakeCommands(a_);
  ASSERT_EQ(commands.size(), 1u);
  EXPECT_TRUE(commands[0].stop().checkpoint_first());
  EXPECT_TRUE(Exit(rec, 0, kRankExitSavedAndStopped));
  ASSERT_EQ(elastic.moves.size(), 1u);
  EXPECT_EQ(elastic.moves[0].intent, MoveIntent::kGrow);
  EXPECT_EQ(elastic.moves[0].grow_to, 2);
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.preemptions(), 0);  // not a preemption
}

}  // namespace
}  // namespace loom::controller
