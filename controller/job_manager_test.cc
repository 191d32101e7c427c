#include "controller/job_manager.h"

#include <cstdlib>
#include <map>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using loom::v1::JobState;

std::string TempDir() {
  char tmpl[] = "/tmp/loom_jm_test_XXXXXX";
  return mkdtemp(tmpl);
}

loom::v1::JobSpec Spec(int workers, int max_restarts = 0) {
  loom::v1::JobSpec spec;
  spec.mutable_recovery()->set_max_restarts(max_restarts);
  spec.set_name("tiny");
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_n_layer(2);
  gpt->set_n_head(2);
  gpt->set_d_model(32);
  gpt->set_seq_len(16);
  gpt->set_vocab_size(256);
  spec.mutable_data()->add_train("/data/train_*.bin");
  spec.mutable_optimizer()->mutable_adamw()->set_lr(1e-3);
  spec.mutable_schedule()->set_total_steps(10);
  spec.mutable_batch()->set_global_batch(8);
  spec.mutable_resources()->set_workers(workers);
  return spec;
}

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    store_ = *Store::Open(dir_);
    opts_.worker_timeout = absl::Seconds(5);
    opts_.checkpoint_root = dir_ + "/ckpt";
    manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_);
  }

  std::string Register(const std::string& node, int slots = 1) {
    loom::v1::RegisterWorkerRequest req;
    req.set_node(node);
    req.set_address("127.0.0.1");
    req.set_slots(slots);
    auto resp = manager_->RegisterWorker(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp->worker_id();
  }

  loom::v1::HeartbeatResponse Beat(const std::string& worker, int port,
                                   std::vector<std::pair<std::string, int>> running = {}) {
    loom::v1::HeartbeatRequest req;
    req.set_worker_id(worker);
    req.set_rendezvous_port(port);
    for (auto& [job, rank] : running) {
      auto* r = req.add_running();
      r->set_job_id(job);
      r->set_rank(rank);
      r->set_generation(generation_[job]);
    }
    auto resp = manager_->Heartbeat(req);
    // Like a worker, remember the attempt each started rank belongs to.
    if (resp.ok()) {
      for (const auto& c : resp->commands()) {
        if (c.has_start()) generation_[c.start().job_id()] = c.start().generation();
      }
    }
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : loom::v1::HeartbeatResponse();
  }

  absl::Status Exit(const std::string& worker, const std::string& job, int rank, int code,
                    const std::string& reason = "") {
    loom::v1::ReportRankExitRequest req;
    req.set_generation(generation_[job]);
    req.set_worker_id(worker);
    req.set_job_id(job);
    req.set_rank(rank);
    req.set_exit_code(code);
    req.set_reason(reason);
    return manager_->ReportRankExit(req);
  }

  JobState StateOf(const std::string& job) { return manager_->Get(job)->state(); }

  std::map<std::string, int64_t> generation_;  // job id -> attempt of its ranks
  std::string dir_;
  FakeClock clock_;
  JobManagerOptions opts_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobManagerTest, SubmitValidatesAndRecordsPending) {
  auto job = manager_->Submit(Spec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "tiny-1");
  EXPECT_EQ(job->state(), loom::v1::PENDING);
  ASSERT_EQ(job->history_size(), 1);
  EXPECT_EQ(job->history(0).to(), loom::v1::PENDING);
  EXPECT_EQ(job->spec().checkpoint().dir(), dir_ + "/ckpt/tiny-1");

  loom::v1::JobSpec bad = Spec(1);
  bad.mutable_model()->mutable_gpt()->set_n_head(5);
  auto rejected = manager_->Submit(bad);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rejected.status().message()), StartsWith("model.gpt.n_head"));
  EXPECT_EQ(manager_->List({}, 0).size(), 1u);
}

TEST_F(JobManagerTest, GangSchedulesOnlyWhenAllSlotsAreFree) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(2));
  EXPECT_EQ(StateOf(job.id()), loom::v1::PENDING);
  EXPECT_THAT(manager_->Get(job.id())->reason(), HasSubstr("waiting for 2 rank slot(s)"));
  EXPECT_EQ(Beat(w1, 29500).commands_size(), 0);

  std::string w2 = Register("node-b");
  auto r1 = Beat(w1, 29501);  // the head worker offers the port it will use
  EXPECT_EQ(StateOf(job.id()), loom::v1::SCHEDULED);
  auto r2 = Beat(w2, 29600);
  ASSERT_EQ(r1.commands_size() + r2.commands_size(), 2);
  std::map<int, loom::v1::StartRank> starts;
  for (auto* r : {&r1, &r2}) {
    for (const auto& c : r->commands()) {
      ASSERT_TRUE(c.has_start());
      starts[c.start().rank()] = c.start();
    }
  }
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].world_size(), 2);
  EXPECT_EQ(starts[0].master_port(), starts[1].master_port());
  EXPECT_EQ(starts[0].master_addr(), "127.0.0.1");
  EXPECT_EQ(starts[0].checkpoint_dir(), dir_ + "/ckpt/" + job.id());

  Beat(w1, 29502, {{job.id(), 0}});
  EXPECT_EQ(StateOf(job.id()), loom::v1::RUNNING);

  // Metrics flow into the summary.
  loom::v1::ReportStepMetricsRequest report;
  report.set_worker_id(w1);
  report.set_job_id(job.id());
  auto* step = report.add_events()->mutable_step();
  step->set_step(1);
  step->set_loss(5.5);
  auto* step2 = report.add_events()->mutable_step();
  step2->set_step(2);
  step2->set_loss(4.5);
  step2->set_has_val_loss(true);
  step2->set_val_loss(4.8);
  report.add_events()->mutable_checkpoint()->set_path("/ckpt/step-2");
  ASSERT_TRUE(manager_->ReportEvents(report).ok());
  auto summary = manager_->Get(job.id())->summary();
  EXPECT_EQ(summary.last_step(), 2);
  EXPECT_DOUBLE_EQ(summary.first_loss(), 5.5);
  EXPECT_DOUBLE_EQ(summary.last_loss(), 4.5);
  EXPECT_DOUBLE_EQ(summary.last_val_loss(), 4.8);
  EXPECT_EQ(summary.checkpoints_written(), 1);
  EXPECT_EQ(manager_->StepMetrics(job.id(), 0)->size(), 2u);

  ASSERT_TRUE(Exit(w1, job.id(), 0, 0).ok());
  EXPECT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  ASSERT_TRUE(Exit(w2, job.id(), 1, 0).ok());
  EXPECT_EQ(StateOf(job.id()), loom::v1::SUCCEEDED);
  auto history = manager_->Get(job.id())->history();
  std::vector<JobState> seen;
  for (const auto& t : history) seen.push_back(t.to());
  EXPECT_THAT(seen, ::testing::ElementsAre(loom::v1::PENDING, loom::v1::SCHEDULED,
                                           loom::v1::RUNNING, loom::v1::SUCCEEDED));
}

TEST_F(JobManagerTest, LostStartIsSentAgainUntilTheRankShowsUp) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1));
  auto first = Beat(w1, 29501);  // this response is "lost"
  ASSERT_EQ(first.commands_size(), 1);
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_EQ(Beat(w1, 29502).commands_size(), 0);  // not yet
  clock_.Advance(absl::Milliseconds(1200));
  auto again = Beat(w1, 29503);
  ASSERT_EQ(again.commands_size(), 1);
  EXPECT_TRUE(again.commands(0).has_start());
  EXPECT_EQ(again.commands(0).start().job_id(), job.id());
  clock_.Advance(absl::Milliseconds(200));
  Beat(w1, 29504, {{job.id(), 0}});  // running now: confirmed
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(Beat(w1, 29505, {{job.id(), 0}}).commands_size(), 0);
}

TEST_F(JobManagerTest, RankFailureFailsJobAndStopsOtherRanks) {
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  Beat(w2, 29500);
  auto job = *manager_->Submit(Spec(2));
  Beat(w1, 29501, {});
  Beat(w2, 29501, {});
  ASSERT_TRUE(Exit(w2, job.id(), 1, 1, "out of memory").ok());
  // The other rank is told to stop at once ...
  auto cmds = Beat(w1, 29502, {{job.id(), 0}});
  ASSERT_EQ(cmds.commands_size(), 1);
  EXPECT_TRUE(cmds.commands(0).has_stop());
  EXPECT_EQ(cmds.commands(0).stop().job_id(), job.id());
  // ... and the job fails once the failure has settled, with the rank's reason.
  ASSERT_TRUE(Exit(w1, job.id(), 0, 1, "connection closed by peer").ok());
  clock_.Advance(absl::Milliseconds(500));
  Beat(w1, 29503);
  Beat(w2, 29503);
  manager_->Tick();
  EXPECT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  clock_.Advance(absl::Milliseconds(600));
  manager_->Tick();
  auto failed = *manager_->Get(job.id());
  EXPECT_EQ(failed.state(), loom::v1::FAILED);
  EXPECT_EQ(failed.reason(), "rank 1 on node-b exited with code 1: out of memory");
}

TEST_F(JobManagerTest, RankFailureBlamesAWorkerThatWentSilent) {
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  Beat(w2, 29500);
  auto job = *manager_->Submit(Spec(2));
  Beat(w1, 29501, {{job.id(), 0}});
  Beat(w2, 29501, {{job.id(), 1}});
  // node-b dies; rank 0 notices first, as a broken connection.
  clock_.Advance(absl::Milliseconds(300));
  ASSERT_TRUE(Exit(w1, job.id(), 0, 1, "Connection closed by peer").ok());
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Milliseconds(300));
    Beat(w1, 29502);
    manager_->Tick();
  }
  auto failed = *manager_->Get(job.id());
  EXPECT_EQ(failed.state(), loom::v1::FAILED);
  EXPECT_THAT(failed.reason(), StartsWith("worker " + w2 + " on node node-b stopped heartbeating"));
  EXPECT_THAT(failed.reason(), HasSubstr("then rank 0 on node-a exited with code 1"));
}

TEST_F(JobManagerTest, CancelStopsRanksAndIsFinal) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1));
  Beat(w1, 29501, {});  // delivers the start
  auto cancelled = manager_->Cancel(job.id(), "");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), loom::v1::CANCELLED);
  auto cmds = Beat(w1, 29502, {{job.id(), 0}});
  ASSERT_EQ(cmds.commands_size(), 1);
  EXPECT_TRUE(cmds.commands(0).has_stop());
  EXPECT_EQ(manager_->Cancel(job.id(), "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Cancel("nope-9", "").status().code(), absl::StatusCode::kNotFound);
  // The rank exits after the stop: the job stays CANCELLED and the slot frees.
  ASSERT_TRUE(Exit(w1, job.id(), 0, 143).ok());
  EXPECT_EQ(StateOf(job.id()), loom::v1::CANCELLED);
  EXPECT_EQ(manager_->ListWorkers()[0].slots_used(), 0);
}

TEST_F(JobManagerTest, SilentWorkerFailsItsJobWithReason) {
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  Beat(w2, 29500);
  auto job = *manager_->Submit(Spec(2));
  Beat(w1, 29501, {{job.id(), 0}});
  Beat(w2, 29501, {{job.id(), 1}});
  ASSERT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  clock_.Advance(absl::Seconds(3));
  Beat(w1, 29502, {{job.id(), 0}});
  clock_.Advance(absl::Seconds(3));
  manager_->Tick();  // w2 silent for 6 s > 5 s
  auto failed = *manager_->Get(job.id());
  EXPECT_EQ(failed.state(), loom::v1::FAILED);
  EXPECT_THAT(failed.reason(), HasSubstr("stopped heartbeating"));
  EXPECT_THAT(failed.reason(), HasSubstr("node-b"));
  EXPECT_EQ(manager_->AliveWorkers(), 1);
  loom::v1::HeartbeatRequest late;
  late.set_worker_id(w2);
  EXPECT_EQ(manager_->Heartbeat(late).status().code(), absl::StatusCode::kNotFound);
  auto cmds = Beat(w1, 29503, {{job.id(), 0}});
  ASSERT_EQ(cmds.commands_size(), 1);
  EXPECT_TRUE(cmds.commands(0).has_stop());
}

TEST_F(JobManagerTest, ReloadKeepsJobsAndFailsOrphanedRunningOnes) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto running = *manager_->Submit(Spec(1));
  Beat(w1, 29501, {{running.id(), 0}});
  auto pending = *manager_->Submit(Spec(1));
  ASSERT_EQ(StateOf(running.id()), loom::v1::RUNNING);
  ASSERT_EQ(StateOf(pending.id()), loom::v1::PENDING);
  manager_.reset();
  store_.reset();

  store_ = *Store::Open(dir_);
  manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_);
  ASSERT_TRUE(manager_->Recover().ok());
  EXPECT_EQ(manager_->List({}, 0).size(), 2u);
  auto r = *manager_->Get(running.id());
  EXPECT_EQ(r.state(), loom::v1::FAILED);
  EXPECT_THAT(r.reason(), HasSubstr("controller restarted"));
  EXPECT_EQ(StateOf(pending.id()), loom::v1::PENDING);
  auto next = *manager_->Submit(Spec(1));
  EXPECT_EQ(next.id(), "tiny-3");  // ids never repeat across restarts
}

TEST_F(JobManagerTest, ControllerRestartRequeuesRunningJobsWithRestartsLeft) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1, /*max_restarts=*/2));
  Beat(w1, 29501, {{job.id(), 0}});
  ASSERT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  manager_.reset();
  store_.reset();
  store_ = *Store::Open(dir_);
  manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_);
  ASSERT_TRUE(manager_->Recover().ok());
  auto j = *manager_->Get(job.id());
  EXPECT_EQ(j.state(), loom::v1::PENDING);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.generation(), 1);
  ASSERT_EQ(j.events_size(), 1);
  EXPECT_EQ(j.events(0).kind(), loom::v1::RecoveryEvent::RESTART);
  // A worker registers with the new controller and the job runs again.
  std::string w2 = Register("node-a");
  auto cmds = Beat(w2, 29600);
  ASSERT_EQ(cmds.commands_size(), 1);
  EXPECT_EQ(cmds.commands(0).start().generation(), 1);
  EXPECT_EQ(cmds.commands(0).start().resume_step(), -1);
}

TEST_F(JobManagerTest, RankFailureRestartsFromNewestCheckpointUntilRestartsRunOut) {
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  Beat(w2, 29500);
  auto job = *manager_->Submit(Spec(2, /*max_restarts=*/1));
  Beat(w1, 29501, {{job.id(), 0}});
  Beat(w2, 29501, {{job.id(), 1}});
  ASSERT_TRUE(Exit(w2, job.id(), 1, 1, "segfault").ok());
  clock_.Advance(absl::Milliseconds(1100));
  Beat(w1, 29502, {{job.id(), 0}});
  Beat(w2, 29502);
  manager_->Tick();
  auto j = *manager_->Get(job.id());
  ASSERT_EQ(j.state(), loom::v1::PENDING);
  EXPECT_THAT(j.history(j.history_size() - 1).reason(), HasSubstr("restart 1/1"));
  EXPECT_EQ(j.restarts(), 1);
  ASSERT_EQ(j.events_size(), 1);
  EXPECT_EQ(j.events(0).kind(), loom::v1::RecoveryEvent::RESTART);
  EXPECT_THAT(j.events(0).message(), HasSubstr("segfault"));
  // Rank 0 of the old attempt still runs: the job waits for it.
  manager_->Tick();
  EXPECT_THAT(manager_->Get(job.id())->reason(), HasSubstr("previous attempt to exit"));
  // Its exit is no failure of the new attempt, and frees the job to be placed.
  ASSERT_TRUE(Exit(w1, job.id(), 0, 143, "stopped on request").ok());
  EXPECT_EQ(manager_->Get(job.id())->restarts(), 1);
  auto r1 = Beat(w1, 29503);
  auto r2 = Beat(w2, 29503);
  int starts = 0;
  for (auto* r : {&r1, &r2}) {
    for (const auto& c : r->commands()) starts += c.has_start() ? 1 : 0;
  }
  ASSERT_EQ(starts, 2);
  EXPECT_EQ(StateOf(job.id()), loom::v1::SCHEDULED);
  // The second failure has no restart left.
  ASSERT_TRUE(Exit(w1, job.id(), 0, 1, "segfault again").ok());
  clock_.Advance(absl::Milliseconds(1100));
  Beat(w1, 29504);
  Beat(w2, 29504);
  manager_->Tick();
  j = *manager_->Get(job.id());
  EXPECT_EQ(j.state(), loom::v1::FAILED);
  EXPECT_THAT(j.reason(), HasSubstr("after 1 restart(s)"));
  EXPECT_EQ(j.events(j.events_size() - 1).kind(), loom::v1::RecoveryEvent::GAVE_UP);
}

TEST_F(JobManagerTest, LossSpikeRollsBackAndSkipsData) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  loom::v1::JobSpec spec = Spec(1);
  spec.mutable_recovery()->set_max_rollbacks(1);
  auto job = *manager_->Submit(spec);
  Beat(w1, 29501, {{job.id(), 0}});
  auto report = [&](int step, double loss) {
    loom::v1::ReportStepMetricsRequest req;
    req.set_worker_id(w1);
    req.set_job_id(job.id());
    req.set_generation(generation_[job.id()]);
    auto* m = req.add_events()->mutable_step();
    m->set_step(step);
    m->set_loss(loss);
    m->set_grad_norm(1.0);
    m->set_data_batch(step - 1 + 7);  // pretend 7 batches were skipped earlier
    return *manager_->ReportEvents(req);
  };
  for (int t = 1; t < 300; ++t) {
    ASSERT_FALSE(report(t, 3.0 + 0.01 * ((t * 37) % 11)).stop()) << t;
  }
  EXPECT_TRUE(report(300, 9.0).stop());  // 3x: spike
  auto j = *manager_->Get(job.id());
  EXPECT_EQ(j.state(), loom::v1::PENDING);
  EXPECT_EQ(j.rollbacks(), 1);
  EXPECT_EQ(j.resume_step(), 0) << "no checkpoint in the catalog: from scratch";
  ASSERT_EQ(j.skip_batches_size(), 1);
  // Resuming from scratch, nothing was trained "before" the resume point:
  // the range is the spike's batch 306 minus 100.
  EXPECT_EQ(j.skip_batches(0).begin(), 206);
  EXPECT_EQ(j.skip_batches(0).end(), 306 + 201);
  ASSERT_EQ(j.events_size(), 2);
  EXPECT_EQ(j.events(0).kind(), loom::v1::RecoveryEvent::SPIKE);
  EXPECT_EQ(j.events(0).step(), 300);
  EXPECT_DOUBLE_EQ(j.events(0).value(), 9.0);
  EXPECT_GT(j.events(0).score(), 6.0);
  EXPECT_EQ(j.events(1).kind(), loom::v1::RecoveryEvent::ROLLBACK);
  // Late reports of the stopped attempt change nothing.
  report(301, 3.0);
  EXPECT_EQ(manager_->Get(job.id())->summary().last_step(), 300);
  // Once the old rank is gone, the job restarts at the checkpoint with the skip list.
  auto stop = Beat(w1, 29502, {{job.id(), 0}});
  ASSERT_TRUE(Exit(w1, job.id(), 0, 143).ok());
  auto start = Beat(w1, 29503);
  ASSERT_EQ(start.commands_size(), 1);
  ASSERT_TRUE(start.commands(0).has_start());
  EXPECT_EQ(start.commands(0).start().resume_step(), 0);
  EXPECT_EQ(start.commands(0).start().generation(), 1);
  ASSERT_EQ(start.commands(0).start().skip_batches_size(), 1);
  // Replayed steps from 201 are normal; a second spike exceeds max_rollbacks.
  Beat(w1, 29504, {{job.id(), 0}});
  for (int t = 201; t < 260; ++t) ASSERT_FALSE(report(t, 3.0 + 0.01 * ((t * 37) % 11)).stop());
  EXPECT_TRUE(report(260, std::numeric_limits<double>::quiet_NaN()).stop());
  j = *manager_->Get(job.id());
  EXPECT_EQ(j.state(), loom::v1::FAILED);
  EXPECT_THAT(j.reason(), HasSubstr("not cured after 1 rollback"));
}

TEST_F(JobManagerTest, WatchDeliversTransitionsAndClosesAtTheEnd) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1));
  auto q = manager_->Watch(job.id(), /*include_history=*/true);
  ASSERT_TRUE(q.ok());
  auto first = (*q)->Pop(absl::Seconds(1));
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(first->has_transition());
  EXPECT_EQ(first->transition().to(), loom::v1::PENDING);
  Beat(w1, 29501, {});
  ASSERT_TRUE(manager_->Cancel(job.id(), "test").ok());
  std::vector<JobState> states;
  while (auto e = (*q)->Pop(absl::Milliseconds(100))) {
    if (e->has_transition()) states.push_back(e->transition().to());
  }
  EXPECT_THAT(states, ::testing::ElementsAre(loom::v1::SCHEDULED, loom::v1::CANCELLED));
  EXPECT_TRUE((*q)->closed_and_empty());
  EXPECT_EQ(manager_->Watch("missing-1", false).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, RegisterValidatesRequest) {
  loom::v1::RegisterWorkerRequest req;
  req.set_address("127.0.0.1");
  req.set_slots(1);
  auto r = manager_->RegisterWorker(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), StartsWith("node:"));
  req.set_node("n");
  req.set_slots(0);
  r = manager_->RegisterWorker(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), StartsWith("slots:"));
}

}  // namespace
}  // namespace loom::controller
