#include "controller/workers/worker_liveness.h"

#include <string>

#include "controller/jobs/jobs_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::RecoveryEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Liveness with the failure handler it hands lost attempts to (no elastic
// re-planning: these jobs are not elastic).
class WorkerLivenessTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    MakeSubsystems();
  }
  // Failure handling and liveness over the fixture's job table and
  // `workers` (the fixture's when null).
  void MakeSubsystems(WorkerRegistry* workers = nullptr) {
    if (workers == nullptr) workers = &workers_;
    failures_ =
        std::make_unique<FailureHandler>(jobs_.get(), &ranks_, workers, catalog_.get(), &clock_,
                                         nullptr, nullptr, FailureHandler::Options{});
    liveness_ = std::make_unique<WorkerLiveness>(
        jobs_.get(), workers, &clock_, failures_.get(), nullptr, &schedule_,
        WorkerLiveness::Options{absl::Seconds(10), absl::Seconds(2), absl::Milliseconds(500)});
  }
  void TearDown() override {
    liveness_.reset();
    failures_.reset();
    JobsFixture::TearDown();
  }

  absl::StatusOr<loom::v1::RegisterWorkerResponse> Register(const std::string& node,
                                                            const std::string& running_job = "",
                                                            int64_t generation = 0) {
    loom::v1::RegisterWorkerRequest req;
    req.set_node(node);
    req.set_address(node + ":1");
    req.set_slots(2);
    if (!running_job.empty()) {
      auto* r = req.add_running();
      r->set_job_id(running_job);
      r->set_rank(0);
      r->set_generation(generation);
    }
    Store::WorkerRow row;
    return liveness_->Register(req, &row);
  }

  loom::v1::HeartbeatResponse Beat(const std::string& worker_id, const std::string& job = "",
                                   int64_t generation = 0) {
    loom::v1::HeartbeatRequest req;
    req.set_worker_id(worker_id);
    if (!job.empty()) {
      auto* r = req.add_running();
      r->set_job_id(job);
      r->set_rank(0);
      r->set_generation(generation);
    }
    loom::v1::HeartbeatResponse resp;
    absl::StatusOr<WorkerLiveness::Beat> beat = liveness_->Heartbeat(req, &resp);
    EXPECT_TRUE(beat.ok()) << beat.status();
    if (beat.ok()) liveness_->SendCommands(*beat, &resp);
    return resp;
  }

  ScheduleSignal schedule_;
  std::unique_ptr<FailureHandler> failures_;
  std::unique_ptr<WorkerLiveness> liveness_;
};

TEST_F(WorkerLivenessTest, RegistrationAnswersTheLeaseAndAskForASchedulingCycle) {
  schedule_.Reset();
  auto resp = Register("node-a");
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->heartbeat_interval_ms(), 500);
  EXPECT_EQ(resp->lease_grace_ms(), 10000);
  EXPECT_TRUE(schedule_.Due(clock_.Now()));
  loom::v1::RegisterWorkerRequest bad;
  Store::WorkerRow row;
  EXPECT_EQ(liveness_->Register(bad, &row).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkerLivenessTest, TheFirstHeartbeatShowingARankMarksTheAttemptRunning) {
  const std::string a = Register("node-a")->worker_id();
  JobRecord& rec = AddJob("job-1", loom::v1::SCHEDULED, {a});
  Beat(a, "job-1", 0);
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  EXPECT_THAT(rec.job.reason(), HasSubstr("rank 0 started on node-a"));
}

TEST_F(WorkerLivenessTest, ARankOfAnEndedJobIsStoppedAndItsSlotFreed) {
  const std::string a = Register("node-a")->worker_id();
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a});
  jobs_->Stop(rec, loom::v1::CANCELLED, "cancelled by user");
  // The stop went out with the cancel; the worker still runs it: again.
  loom::v1::HeartbeatResponse resp = Beat(a, "job-1", 0);
  ASSERT_EQ(resp.commands_size(), 1);
  EXPECT_TRUE(resp.commands(0).has_stop());
  // Once it is gone, its slot is free.
  Beat(a);
  EXPECT_TRUE(workers_.Find(a)->ranks.empty());
}

TEST_F(WorkerLivenessTest, AWorkerSilentPastItsLeaseFailsItsAttemptWhichWaitsOutTheMargin) {
  const std::string a = Register("node-a")->worker_id();
  const std::string b = Register("node-b")->worker_id();
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a, b});
  clock_.Advance(absl::Seconds(6));
  Beat(a, "job-1", 0);
  clock_.Advance(absl::Seconds(5));  // node-b silent for 11 s
  liveness_->CheckLeases();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.restarts(), 1);
  EXPECT_THAT(rec.job.events(0).message(),
              HasSubstr("on node node-b stopped heartbeating (silent for 11.0s, timeout 10.0s)"));
  EXPECT_EQ(rec.job.events(0).cause(), kCauseWorkerLost);
  // Not placed again before its ranks there are surely dead: G + M after
  // node-b was last heard.
  EXPECT_EQ(rec.not_before, clock_.Now() - absl::Seconds(11) + absl::Seconds(12));
}

TEST_F(WorkerLivenessTest, AfterAControllerRestartRunningRanksAreReadoptedWithoutARestart) {
  // The controller restarts: the job was RUNNING with one rank on node-a.
  JobRecord& rec = AddJob("job-1", loom::v1::PENDING, {});
  auto* placed = rec.job.add_ranks();
  placed->set_rank(0);
  placed->set_node("node-a");
  placed->set_worker_id("old-worker");
  jobs_->Transition(rec, loom::v1::SCHEDULED, "placed");
  jobs_->Transition(rec, loom::v1::RUNNING, "started");
  liveness_->AwaitReadoption("controller c1 failed over to c2");
  // The worker re-registers with its rank still running.
  const std::string a = Register("node-a", "job-1", 0)->worker_id();
  EXPECT_EQ(rec.job.ranks(0).worker_id(), a);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::READOPTED));
  EXPECT_THAT(rec.job.events(0).message(),
              HasSubstr("after controller c1 failed over to c2; no restart, nothing lost"));
  EXPECT_EQ(rec.job.restarts(), 0);
  EXPECT_EQ(workers_.Find(a)->ranks.size(), 1u);
}

TEST_F(WorkerLivenessTest, AnAttemptNotReadoptedInTimeRestartsOnce) {
  JobRecord& rec = AddJob("job-1", loom::v1::PENDING, {});
  auto* placed = rec.job.add_ranks();
  placed->set_rank(0);
  placed->set_node("node-gone");
  jobs_->Transition(rec, loom::v1::SCHEDULED, "placed");
  jobs_->Transition(rec, loom::v1::RUNNING, "started");
  liveness_->AwaitReadoption("the controller restarted");
  clock_.Advance(absl::Seconds(11));
  liveness_->CheckAdoptions();
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  clock_.Advance(absl::Seconds(2));
  liveness_->CheckAdoptions();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.restarts(), 1);
  EXPECT_THAT(rec.job.events(0).message(),
              HasSubstr("only 0 of 1 rank(s) were re-adopted within 12.0s"));
}

// A rank that finished training before a takeover is known to the new
// controller (its exit was stored before it was acknowledged): the other
// rank is re-adopted, nothing waits for the finished one, and the job
// succeeds instead of restarting for a rank no worker reports.
TEST_F(WorkerLivenessTest, ARankThatFinishedBeforeATakeoverIsAccountedFor) {
  const std::string a = Register("node-a")->worker_id();
  const std::string b = Register("node-b")->worker_id();
  AddJob("job-1", loom::v1::RUNNING, {a, b});
  loom::v1::ReportRankExitRequest exit;
  exit.set_job_id("job-1");
  exit.set_rank(0);
  exit.set_worker_id(a);
  failures_->OnRankExit(*jobs_->Find("job-1"), exit, "node-a");
  EXPECT_EQ(jobs_->Find("job-1")->job.state(), loom::v1::RUNNING);
  EXPECT_FALSE(jobs_->Unpersisted("job-1"));

  // Another controller takes over from the store, knowing no worker yet.
  liveness_.reset();
  failures_.reset();
  WorkerRegistry workers(&clock_, WorkerRegistryOptions{});
  jobs_ = std::make_unique<JobTable>(store_.get(), &clock_, &ranks_);
  ASSERT_TRUE(jobs_->Load().ok());
  MakeSubsystems(&workers);
  liveness_->AwaitReadoption("controller c1 failed over to c2");
  JobRecord& rec = *jobs_->Find("job-1");
  EXPECT_THAT(rec.job.finished_ranks(), ElementsAre(0));
  // node-b's worker registers again with rank 1 still running.
  loom::v1::RegisterWorkerRequest again;
  again.set_node("node-b");
  again.set_address("node-b:1");
  again.set_slots(2);
  auto* running = again.add_running();
  running->set_job_id("job-1");
  running->set_rank(1);
  running->set_generation(0);
  Store::WorkerRow row;
  auto registered = liveness_->Register(again, &row);
  ASSERT_TRUE(registered.ok()) << registered.status();
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::READOPTED)) << rec.job.DebugString();
  clock_.Advance(absl::Seconds(13));  // past the re-adoption deadline
  liveness_->CheckAdoptions();
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  exit.set_rank(1);
  exit.set_worker_id(registered->worker_id());
  failures_->OnRankExit(rec, exit, "node-b");
  EXPECT_EQ(rec.job.state(), loom::v1::SUCCEEDED);
  EXPECT_EQ(rec.job.restarts(), 0);
  liveness_.reset();  // before `workers` goes
  failures_.reset();
}

}  // namespace
}  // namespace loom::controller
