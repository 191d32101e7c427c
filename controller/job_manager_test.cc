#include "controller/job_manager.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/parallel_layout.h"
#include "common/rank_exit.h"
#include "controller/progress/goodput.h"
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
    registry_ = std::make_shared<metrics::Registry>();
    metrics_ = std::make_unique<RecoveryMetrics>(*registry_);
    manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_, metrics_.get());
  }
  // Whatever a test did, every job moved only as the state machine allows,
  // and the event log holds each job's transitions, recovery events and
  // committed checkpoints, each once, numbered 1, 2, 3, ... for the job.
  void TearDown() override {
    if (manager_ == nullptr) return;
    EXPECT_EQ(manager_->Gauges().illegal_transitions, 0);
    for (const loom::v1::Job& job : manager_->List({}, 0)) ExpectLogged(job);
  }
  void ExpectLogged(const loom::v1::Job& job) {
    SCOPED_TRACE(job.id());
    auto logged = store_->LoadEvents(job.id(), 0, 0);
    ASSERT_TRUE(logged.ok()) << logged.status();
    // An ended job keeps its transitions and its newest finished_events_kept
    // other entries (JobManagerOptions).
    const int64_t others = job.events_logged() - job.history_size();
    const bool pruned = IsTerminalJobState(job.state()) && opts_.finished_events_kept > 0 &&
                        others > opts_.finished_events_kept;
    ASSERT_EQ(static_cast<int64_t>(logged->size()),
              pruned ? job.history_size() + opts_.finished_events_kept : job.events_logged());
    std::vector<std::string> transitions, events, want_transitions, want_events;
    int checkpoints = 0;
    for (size_t i = 0; i < logged->size(); ++i) {
      if (!pruned) EXPECT_EQ((*logged)[i].idx, static_cast<int64_t>(i) + 1);
      loom::v1::JobEvent e;
      ASSERT_TRUE(e.ParseFromString((*logged)[i].payload));
      if (e.has_transition()) {
        transitions.push_back(e.transition().ShortDebugString());
      } else if (e.has_recovery()) {
        events.push_back(e.recovery().ShortDebugString());
      } else {
        checkpoints += e.has_checkpoint() ? 1 : 0;
      }
    }
    for (const auto& t : job.history()) want_transitions.push_back(t.ShortDebugString());
    for (const auto& e : job.events()) want_events.push_back(e.ShortDebugString());
    EXPECT_EQ(transitions, want_transitions);
    if (pruned) return;
    EXPECT_EQ(events, want_events);
    EXPECT_EQ(checkpoints, job.summary().checkpoints_written());
  }

  // The controller's /metrics text.
  std::string MetricsText() { return metrics::SerializeText(registry_->Collect()); }

  std::string Register(const std::string& node, int slots = 1, double memory_bytes = 0,
                       double gemm_flops_per_thread = 0, int gpus = 0) {
    loom::v1::RegisterWorkerRequest req;
    req.set_gpus(gpus);
    req.set_node(node);
    req.set_address("127.0.0.1");
    req.set_slots(slots);
    req.set_cpus(4);
    req.set_memory_bytes(static_cast<uint64_t>(memory_bytes));
    req.set_gemm_flops_per_second_per_thread(gemm_flops_per_thread);
    if (gemm_flops_per_thread > 0) req.set_memory_bandwidth_bytes_per_second(10e9);
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
  std::shared_ptr<metrics::Registry> registry_;
  std::unique_ptr<RecoveryMetrics> metrics_;
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

// Submit resolves scheduling.queue and scheduling.priority against the
// controller's queue configuration, naming the field when it cannot.
TEST_F(JobManagerTest, SubmitResolvesTheQueueAndPriorityItNames) {
  auto job = manager_->Submit(Spec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().scheduling().queue(), "default");

  loom::v1::JobSpec research = Spec(1);
  research.mutable_scheduling()->set_queue("research");
  auto unknown = manager_->Submit(research);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              StartsWith("scheduling.queue: unknown queue \"research\" (queues: default)"));

  absl::StatusOr<scheduling::QueueConfig> config = scheduling::ParseQueueConfig(
      "priority_classes: {high: 100}\n"
      "queues:\n  - name: research\n    cohort: lab\n    nominal_quota: {slots: 4}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  manager_->SetQueueConfig(*config);
  research.mutable_scheduling()->set_priority("high");
  auto accepted = manager_->Submit(research);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->spec().scheduling().queue(), "research");
  EXPECT_EQ(accepted->spec().scheduling().priority(), "high");

  research.mutable_scheduling()->set_priority("urgent");
  auto no_class = manager_->Submit(research);
  EXPECT_EQ(no_class.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_class.status().message()),
              StartsWith("scheduling.priority: \"urgent\" is neither an integer nor a priority "
                         "class (classes: high)"));
  EXPECT_EQ(manager_->List({}, 0).size(), 2u);  // the refused ones left nothing behind

  // A queue that takes only admins' jobs.
  config = scheduling::ParseQueueConfig("queues:\n  - name: prod\n    submit_roles: [admin]\n");
  ASSERT_TRUE(config.ok()) << config.status();
  manager_->SetQueueConfig(*config);
  loom::v1::JobSpec prod = Spec(1);
  prod.mutable_scheduling()->set_queue("prod");
  auto denied = manager_->Submit(prod, "alice", "user");
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(denied.status().message(),
            "scheduling.queue: queue \"prod\" takes jobs from admin roles only; 'alice' is a user");
  EXPECT_TRUE(manager_->Submit(prod, "root", "admin").ok());
  EXPECT_TRUE(manager_->Submit(Spec(1), "alice", "user").ok());  // default takes everyone
}

// Admission is the scheduling policy's (controller/scheduling/): a queue's
// quota holds its jobs back without holding back other queues', and a
// higher priority goes first in its queue.
TEST_F(JobManagerTest, QueuesQuotasAndPrioritiesDecideWhoStarts) {
  absl::StatusOr<scheduling::QueueConfig> config = scheduling::ParseQueueConfig(
      "priority_classes: {high: 100}\n"
      "queues:\n  - name: small\n    nominal_quota: {slots: 1}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  manager_->SetQueueConfig(*config);
  const std::string w = Register("node-a", /*slots=*/2);
  Beat(w, 29500);

  loom::v1::JobSpec two = Spec(1);
  two.mutable_resources()->set_ranks(2);
  two.mutable_scheduling()->set_queue("small");
  auto over = *manager_->Submit(two);
  Beat(w, 29501);
  EXPECT_EQ(StateOf(over.id()), loom::v1::PENDING);
  EXPECT_THAT(manager_->Get(over.id())->reason(), HasSubstr("over quota"));
  EXPECT_EQ(manager_->Get(over.id())->wait_reason(), "over quota");
  EXPECT_EQ(manager_->Get(over.id())->queue_position(), 1);

  // Queue default is not held back by small's quota (placed at once, with
  // the worker's fresh rendezvous port).
  auto other = *manager_->Submit(Spec(1));
  EXPECT_EQ(StateOf(other.id()), loom::v1::SCHEDULED);

  // One slot left: of two jobs waiting for it (and for a rendezvous port),
  // the higher priority takes it though it came second.
  auto low = *manager_->Submit(Spec(1));
  loom::v1::JobSpec urgent = Spec(1);
  urgent.mutable_scheduling()->set_priority("high");
  auto high = *manager_->Submit(urgent);
  Beat(w, 29503);
  EXPECT_EQ(StateOf(high.id()), loom::v1::SCHEDULED);
  EXPECT_EQ(manager_->Get(high.id())->queue_position(), 0);  // placed: no longer waiting
  EXPECT_EQ(StateOf(low.id()), loom::v1::PENDING);
  EXPECT_EQ(manager_->Get(low.id())->queue_position(), 1);
  EXPECT_EQ(manager_->Get(low.id())->wait_reason(), "gang does not fit");
  EXPECT_EQ(StateOf(over.id()), loom::v1::PENDING);
}

// Checkpoint-then-preempt, driven as the workers would drive it: a
// high-priority job preempts a running low-priority gang; the victim's ranks
// are asked to save (StopRank.checkpoint_first), save at the step they
// reached and exit with kRankExitSavedAndStopped; the victim becomes
// PREEMPTED with 0 steps lost and no restart counted, waits behind the
// preemptor at its old place, and resumes from that checkpoint once room
// frees.
class PreemptionTest : public JobManagerTest {
 protected:
  void SetUp() override {
    JobManagerTest::SetUp();
    absl::StatusOr<scheduling::QueueConfig> config = scheduling::ParseQueueConfig(
        "preemption: {grace_seconds: 3, min_run_time_seconds: 0}\n"
        "priority_classes: {high: 100}\n");
    ASSERT_TRUE(config.ok()) << config.status();
    manager_->SetQueueConfig(*config);
    w1_ = Register("node-a");
    w2_ = Register("node-b");
    Beat(w1_, 29500);
    Beat(w2_, 29500);
    low_ = manager_->Submit(Spec(2))->id();
    Beat(w1_, 29501, {{low_, 0}});
    Beat(w2_, 29501, {{low_, 1}});
    ASSERT_EQ(StateOf(low_), loom::v1::RUNNING);
    // Steps 1-6, a checkpoint at step 5.
    Report(low_, {1, 2, 3, 4, 5, 6}, {5});
  }

  void Report(const std::string& job, std::vector<int> steps, std::vector<int> checkpoints) {
    loom::v1::ReportStepMetricsRequest r;
    r.set_worker_id(w1_);
    r.set_job_id(job);
    r.set_generation(generation_[job]);
    const std::string dir = manager_->Get(job)->spec().checkpoint().dir();
    for (int t : steps) {
      auto* m = r.add_events()->mutable_step();
      m->set_step(t);
      m->set_loss(3);
    }
    for (int c : checkpoints) {
      std::filesystem::create_directories(absl::StrCat(dir, "/step-", c));
      auto* info = r.add_events()->mutable_checkpoint();
      info->set_step(c);
      info->set_path(absl::StrCat(dir, "/step-", c));
    }
    ASSERT_TRUE(manager_->ReportEvents(r).ok());
  }

  // The stop commands a heartbeat of `worker` carries for `job`.
  std::vector<loom::v1::StopRank> Stops(const loom::v1::HeartbeatResponse& r,
                                        const std::string& job) {
    std::vector<loom::v1::StopRank> out;
    for (const auto& c : r.commands()) {
      if (c.has_stop() && c.stop().job_id() == job) out.push_back(c.stop());
    }
    return out;
  }

  // Submits the high-priority job; returns the first heartbeats' commands.
  std::string SubmitHigh() {
    loom::v1::JobSpec urgent = Spec(2);
    urgent.set_name("urgent");
    urgent.mutable_scheduling()->set_priority("high");
    return manager_->Submit(urgent)->id();
  }

  std::string w1_, w2_, low_;
};

TEST_F(PreemptionTest, SavesStopsAndRequeuesWithZeroStepsLostAndNoRestart) {
  const std::string high = SubmitHigh();
  const auto b1 = Beat(w1_, 29502, {{low_, 0}});
  const auto b2 = Beat(w2_, 29502, {{low_, 1}});
  for (const auto* b : {&b1, &b2}) {
    const std::vector<loom::v1::StopRank> stops = Stops(*b, low_);
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_TRUE(stops[0].checkpoint_first());
    EXPECT_EQ(stops[0].generation(), generation_[low_]);
  }
  loom::v1::Job victim = *manager_->Get(low_);
  EXPECT_EQ(victim.state(), loom::v1::RUNNING) << "it runs until its ranks have saved";
  EXPECT_THAT(victim.reason(), HasSubstr("preempting for job " + high));
  ASSERT_GE(victim.events_size(), 1);
  EXPECT_EQ(victim.events(victim.events_size() - 1).kind(), loom::v1::RecoveryEvent::PREEMPTING);
  EXPECT_EQ(victim.events(victim.events_size() - 1).cause(), "priority");
  EXPECT_EQ(victim.events(victim.events_size() - 1).step(), 6);
  EXPECT_EQ(StateOf(high), loom::v1::PENDING);
  EXPECT_EQ(manager_->Get(high)->wait_reason(), "preempting");
  // Asked once: later cycles neither ask again nor choose more victims.
  manager_->Tick();
  EXPECT_TRUE(Stops(Beat(w1_, 29503, {{low_, 0}}), low_).empty());

  // Rank 0 saves at step 7 (it trained one more step before the boundary);
  // both ranks exit as having saved and stopped.
  Report(low_, {7}, {7});
  ASSERT_TRUE(Exit(w2_, low_, 1, kRankExitSavedAndStopped, "saved and stopped").ok());
  EXPECT_EQ(StateOf(low_), loom::v1::RUNNING) << "rank 0 has not exited yet";
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Exit(w1_, low_, 0, kRankExitSavedAndStopped, "saved and stopped").ok());
  victim = *manager_->Get(low_);
  ASSERT_EQ(victim.state(), loom::v1::PREEMPTED);
  EXPECT_EQ(victim.restarts(), 0);
  EXPECT_EQ(victim.preemptions(), 1);
  const loom::v1::RecoveryEvent& done = victim.events(victim.events_size() - 1);
  EXPECT_EQ(done.kind(), loom::v1::RecoveryEvent::PREEMPTED);
  EXPECT_EQ(done.checkpoint_step(), 7);
  EXPECT_EQ(done.steps_lost(), 0);
  EXPECT_THAT(done.message(), HasSubstr("0 steps lost"));
  EXPECT_THAT(MetricsText(), HasSubstr("loom_controller_preemptions_total{job_id=\"" + low_ +
                                       "\",queue=\"default\",reason=\"priority\"} 1"));

  // The preemptor starts on the freed slots; the victim waits, first in its
  // queue.
  const int64_t victim_attempt = victim.generation();
  Beat(w1_, 29504);
  Beat(w2_, 29504);
  EXPECT_EQ(StateOf(high), loom::v1::SCHEDULED);
  victim = *manager_->Get(low_);
  EXPECT_EQ(victim.state(), loom::v1::PREEMPTED);
  EXPECT_EQ(victim.queue_position(), 1);
  EXPECT_EQ(victim.wait_reason(), "gang does not fit");

  // Once the preemptor ends, the victim resumes from the newest checkpoint.
  clock_.Advance(absl::Seconds(5));
  Beat(w1_, 29505, {{high, 0}});
  Beat(w2_, 29505, {{high, 1}});
  ASSERT_TRUE(Exit(w1_, high, 0, 0).ok());
  ASSERT_TRUE(Exit(w2_, high, 1, 0).ok());
  EXPECT_EQ(StateOf(high), loom::v1::SUCCEEDED);
  const auto r1 = Beat(w1_, 29506);
  Beat(w2_, 29506);
  victim = *manager_->Get(low_);
  ASSERT_EQ(victim.state(), loom::v1::SCHEDULED);
  EXPECT_EQ(victim.generation(), victim_attempt);
  bool started = false;
  for (const auto& c : r1.commands()) {
    if (!c.has_start() || c.start().job_id() != low_) continue;
    started = true;
    EXPECT_EQ(c.start().resume_step(), -1) << "from the newest checkpoint (step 7)";
    EXPECT_EQ(c.start().generation(), victim_attempt);
  }
  EXPECT_TRUE(started);
  EXPECT_EQ(victim.restarts(), 0);
  const loom::v1::RecoveryEvent& resumed = victim.events(victim.events_size() - 1);
  EXPECT_EQ(resumed.kind(), loom::v1::RecoveryEvent::RESUMED);
  EXPECT_EQ(resumed.checkpoint_step(), 7);
  EXPECT_THAT(resumed.message(), HasSubstr("resume from the checkpoint at step 7"));
  // Its wall time shows the wait after the preemption apart from the queue.
  const GoodputBuckets b = ComputeGoodput(victim, {}, clock_.Now());
  EXPECT_NEAR(b.preempted_waiting, 5.0, 0.01);
}

TEST_F(PreemptionTest, ASaveThatDoesNotCommitWithinTheGraceIsStoppedAndLosesOnlyItsSteps) {
  const std::string high = SubmitHigh();
  Beat(w1_, 29502, {{low_, 0}});
  Beat(w2_, 29502, {{low_, 1}});
  // The ranks do not answer (a rank hangs in its save). Within the grace
  // nothing more happens; past it, a plain stop goes out.
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  EXPECT_TRUE(Stops(Beat(w1_, 29503, {{low_, 0}}), low_).empty());
  Beat(w2_, 29503, {{low_, 1}});
  clock_.Advance(absl::Seconds(1.5));
  manager_->Tick();
  const auto b1 = Beat(w1_, 29504, {{low_, 0}});
  const std::vector<loom::v1::StopRank> stops = Stops(b1, low_);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_FALSE(stops[0].checkpoint_first());
  EXPECT_THAT(stops[0].reason(), HasSubstr("within the grace"));
  Beat(w2_, 29504, {{low_, 1}});
  // One rank ends at the stop, the other is killed.
  ASSERT_TRUE(Exit(w1_, low_, 0, 143, "stopped on request").ok());
  loom::v1::ReportRankExitRequest killed;
  killed.set_generation(generation_[low_]);
  killed.set_worker_id(w2_);
  killed.set_job_id(low_);
  killed.set_rank(1);
  killed.set_signal(9);
  ASSERT_TRUE(manager_->ReportRankExit(killed).ok());
  const loom::v1::Job victim = *manager_->Get(low_);
  ASSERT_EQ(victim.state(), loom::v1::PREEMPTED);
  EXPECT_EQ(victim.restarts(), 0);
  const loom::v1::RecoveryEvent& done = victim.events(victim.events_size() - 1);
  EXPECT_EQ(done.kind(), loom::v1::RecoveryEvent::PREEMPTED);
  EXPECT_EQ(done.checkpoint_step(), 5);
  EXPECT_EQ(done.steps_lost(), 1);
  EXPECT_THAT(done.message(), HasSubstr("without a save (the grace ran out)"));
  EXPECT_THAT(done.message(), HasSubstr("1 step(s) after it are lost"));
  EXPECT_THAT(MetricsText(),
              HasSubstr("loom_controller_steps_lost_total{cause=\"preemption\",job_id=\"" + low_ +
                        "\"} 1"));
  Beat(w1_, 29505);
  Beat(w2_, 29505);
  EXPECT_EQ(StateOf(high), loom::v1::SCHEDULED);
}

TEST_F(PreemptionTest, NonPreemptibleJobsAndJobsWithinTheirMinimumRunTimeAreLeftRunning) {
  // A queue file whose minimum run time protects the running job.
  absl::StatusOr<scheduling::QueueConfig> config = scheduling::ParseQueueConfig(
      "preemption: {grace_seconds: 3, min_run_time_seconds: 600}\n"
      "priority_classes: {high: 100}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  manager_->SetQueueConfig(*config);
  const std::string high = SubmitHigh();
  // Preempted once within its minimum run time is allowed (it was never
  // preempted); the first preemption happens.
  Beat(w1_, 29502, {{low_, 0}});
  Beat(w2_, 29502, {{low_, 1}});
  ASSERT_TRUE(Exit(w1_, low_, 0, kRankExitSavedAndStopped).ok());
  ASSERT_TRUE(Exit(w2_, low_, 1, kRankExitSavedAndStopped).ok());
  ASSERT_EQ(StateOf(low_), loom::v1::PREEMPTED);
  Beat(w1_, 29503);
  Beat(w2_, 29503);
  ASSERT_EQ(StateOf(high), loom::v1::SCHEDULED);
  Beat(w1_, 29504, {{high, 0}});
  Beat(w2_, 29504, {{high, 1}});
  ASSERT_TRUE(Exit(w1_, high, 0, 0).ok());
  ASSERT_TRUE(Exit(w2_, high, 1, 0).ok());
  Beat(w1_, 29505);
  Beat(w2_, 29505);
  ASSERT_EQ(StateOf(low_), loom::v1::SCHEDULED);
  Beat(w1_, 29506, {{low_, 0}});
  Beat(w2_, 29506, {{low_, 1}});
  ASSERT_EQ(StateOf(low_), loom::v1::RUNNING);
  // Preempted again within 600 s of its last preemption: not allowed.
  const std::string second = SubmitHigh();
  const auto b = Beat(w1_, 29507, {{low_, 0}});
  EXPECT_TRUE(Stops(b, low_).empty());
  EXPECT_EQ(StateOf(second), loom::v1::PENDING);
  EXPECT_EQ(manager_->Get(low_)->preemptions(), 1);

  // A job that says it is not preemptible is never asked.
  ASSERT_TRUE(manager_->Cancel(second, "").ok());
  ASSERT_TRUE(manager_->Cancel(low_, "").ok());
  Beat(w1_, 29508);
  Beat(w2_, 29508);
  loom::v1::JobSpec pinned = Spec(2);
  pinned.set_name("pinned");
  pinned.mutable_scheduling()->set_preemptible(false);
  const std::string keep = manager_->Submit(pinned)->id();
  Beat(w1_, 29509);
  Beat(w2_, 29509);
  Beat(w1_, 29510, {{keep, 0}});
  Beat(w2_, 29510, {{keep, 1}});
  ASSERT_EQ(StateOf(keep), loom::v1::RUNNING);
  const std::string third = SubmitHigh();
  EXPECT_TRUE(Stops(Beat(w1_, 29511, {{keep, 0}}), keep).empty());
  EXPECT_EQ(StateOf(third), loom::v1::PENDING);
}

// An elastic job whose worker is lost is re-planned for the two
// workers left (the planner's layout for the same global batch), resumes
// from its newest checkpoint under it, and counts no restart.
TEST_F(PreemptionTest, APreemptionThatNeedsPartOfAnElasticJobsSlotsShrinksIt) {
  // An elastic 3-rank job on three workers; a high-priority 1-rank job
  // needs one slot.
  const std::string w3 = Register("node-c");
  Beat(w3, 29500);
  Beat(w3, 29501);
  ASSERT_TRUE(manager_->Cancel(low_, "").ok());
  for (const std::string& w : {w1_, w2_, w3}) Beat(w, 29502);
  ASSERT_TRUE(Exit(w1_, low_, 0, 143).ok());
  ASSERT_TRUE(Exit(w2_, low_, 1, 143).ok());
  loom::v1::JobSpec spec = Spec(3);
  spec.set_name("stretchy");
  spec.mutable_schedule()->set_total_steps(1000);
  spec.mutable_batch()->set_global_batch(12);
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_elastic()->set_min_ranks(1);
  spec.mutable_elastic()->set_max_ranks(3);
  const std::string job = manager_->Submit(spec)->id();
  Beat(w1_, 29503, {{job, 0}});
  Beat(w2_, 29503, {{job, 1}});
  Beat(w3, 29503, {{job, 2}});
  ASSERT_EQ(StateOf(job), loom::v1::RUNNING);
  Report(job, {1, 2, 3, 4}, {4});

  loom::v1::JobSpec urgent = Spec(1);
  urgent.set_name("urgent");
  urgent.mutable_scheduling()->set_priority("high");
  const std::string high = manager_->Submit(urgent)->id();
  Beat(w1_, 29504, {{job, 0}});
  Beat(w2_, 29504, {{job, 1}});
  Beat(w3, 29504, {{job, 2}});
  // It saves at step 5 and stops; the urgent job takes one slot, and the
  // elastic job comes back at once on the two others, re-planned for them.
  Report(job, {5}, {5});
  ASSERT_TRUE(Exit(w1_, job, 0, kRankExitSavedAndStopped).ok());
  ASSERT_TRUE(Exit(w2_, job, 1, kRankExitSavedAndStopped).ok());
  ASSERT_TRUE(Exit(w3, job, 2, kRankExitSavedAndStopped).ok());
  for (int i = 0; i < 3; ++i) {
    for (const std::string& w : {w1_, w2_, w3}) Beat(w, 29505 + i);
    manager_->Tick();
  }
  EXPECT_EQ(StateOf(high), loom::v1::SCHEDULED);
  const loom::v1::Job j = *manager_->Get(job);
  ASSERT_EQ(j.state(), loom::v1::SCHEDULED) << j.reason();
  EXPECT_EQ(j.spec().resources().ranks(), 2);
  EXPECT_EQ(j.ranks_size(), 2);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.preemptions(), 1);
  const loom::v1::Job placed_high = *manager_->Get(high);
  for (const auto& r : j.ranks()) EXPECT_NE(r.node(), placed_high.ranks(0).node());
  std::vector<loom::v1::RecoveryEvent> replans;
  for (const auto& e : j.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::REPLANNED) replans.push_back(e);
  }
  ASSERT_EQ(replans.size(), 1u);
  EXPECT_EQ(replans[0].cause(), "preemption");
  EXPECT_EQ(replans[0].checkpoint_step(), 5);
  EXPECT_EQ(replans[0].steps_lost(), 0);
  EXPECT_THAT(replans[0].message(), HasSubstr("re-planned from 3 to 2 rank(s)"));
}

TEST_F(JobManagerTest, ElasticJobThatLosesAWorkerIsReplannedForTheWorkersLeft) {
  const std::string w1 = Register("node-a"), w2 = Register("node-b"), w3 = Register("node-c");
  for (const std::string& w : {w1, w2, w3}) Beat(w, 29500);
  loom::v1::JobSpec spec = Spec(3);
  spec.mutable_batch()->set_global_batch(12);
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_elastic()->set_min_ranks(1);
  spec.mutable_elastic()->set_max_ranks(3);
  absl::StatusOr<loom::v1::Job> submitted = manager_->Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job = submitted->id();
  Beat(w1, 29501, {{job, 0}});
  Beat(w2, 29501, {{job, 1}});
  Beat(w3, 29501, {{job, 2}});
  ASSERT_EQ(StateOf(job), loom::v1::RUNNING);
  const std::string before = manager_->Get(job)->plan().layout().summary();
  // Steps 1-6, a checkpoint at step 4.
  loom::v1::ReportStepMetricsRequest r;
  r.set_worker_id(w1);
  r.set_job_id(job);
  r.set_generation(generation_[job]);
  for (int t = 1; t <= 6; ++t) r.add_events()->mutable_step()->set_step(t);
  const std::string dir = manager_->Get(job)->spec().checkpoint().dir();
  std::filesystem::create_directories(dir + "/step-4");
  auto* c = r.add_events()->mutable_checkpoint();
  c->set_step(4);
  c->set_path(dir + "/step-4");
  ASSERT_TRUE(manager_->ReportEvents(r).ok());

  // node-c goes silent past its lease.
  for (int i = 0; i < 30 && StateOf(job) == loom::v1::RUNNING; ++i) {
    clock_.Advance(absl::Milliseconds(500));
    Beat(w1, 29502, {{job, 0}});
    Beat(w2, 29502, {{job, 1}});
    manager_->Tick();
  }
  loom::v1::Job j = *manager_->Get(job);
  ASSERT_EQ(j.state(), loom::v1::PENDING) << j.reason();
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.layout_generation(), 1);
  EXPECT_EQ(j.spec().resources().ranks(), 2);
  EXPECT_EQ(j.spec().resources().workers(), 2);
  EXPECT_EQ(j.spec().batch().global_batch(), 12);
  EXPECT_TRUE(j.spec().parallelism().auto_());
  ASSERT_GE(j.events_size(), 1);
  const loom::v1::RecoveryEvent& e = j.events(j.events_size() - 1);
  EXPECT_EQ(e.kind(), loom::v1::RecoveryEvent::REPLANNED);
  EXPECT_EQ(e.cause(), "worker_lost");
  EXPECT_EQ(e.from_layout(), before);
  EXPECT_EQ(e.to_layout(), j.plan().layout().summary());
  EXPECT_THAT(e.to_layout(), HasSubstr("dp 2"));
  EXPECT_EQ(e.checkpoint_step(), 4);
  EXPECT_EQ(e.steps_lost(), 2);
  EXPECT_THAT(e.message(), HasSubstr("re-planned from 3 to 2 rank(s) on 2 worker(s)"));

  // Once node-c's lease has run out for its ranks too, the new gang starts
  // on the two workers left, from the newest checkpoint.
  int starts = 0;
  for (int i = 0; i < 40 && starts < 2; ++i) {
    clock_.Advance(absl::Milliseconds(250));
    manager_->Tick();
    for (const std::string& w : {w1, w2}) {
      const loom::v1::HeartbeatResponse beat = Beat(w, 29503 + i);
      for (const auto& cmd : beat.commands()) {
        if (!cmd.has_start() || cmd.start().job_id() != job) continue;
        ++starts;
        EXPECT_EQ(cmd.start().world_size(), 2);
        EXPECT_EQ(cmd.start().resume_step(), -1);
        EXPECT_EQ(cmd.start().spec().resources().ranks(), 2);
      }
    }
  }
  EXPECT_EQ(starts, 2) << manager_->Get(job)->reason();
  EXPECT_EQ(StateOf(job), loom::v1::SCHEDULED);
  Beat(w1, 29600, {{job, 0}});
  Beat(w2, 29600, {{job, 1}});
  ASSERT_EQ(StateOf(job), loom::v1::RUNNING);
  loom::v1::ReportStepMetricsRequest resumed;
  resumed.set_worker_id(w1);
  resumed.set_job_id(job);
  resumed.set_generation(generation_[job]);
  resumed.add_events()->mutable_step()->set_step(5);
  ASSERT_TRUE(manager_->ReportEvents(resumed).ok());

  // node-c comes back. With no job waiting and no minimum run time, the job
  // saves at its next step boundary and stops, then grows back to 3 ranks.
  absl::StatusOr<scheduling::QueueConfig> config =
      scheduling::ParseQueueConfig("preemption: {min_run_time_seconds: 0}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  manager_->SetQueueConfig(*config);
  const std::string w3_again = Register("node-c");
  Beat(w3_again, 29601);
  manager_->Tick();
  int asked = 0;
  for (const std::string& w : {w1, w2}) {
    const loom::v1::HeartbeatResponse beat = Beat(w, 29602, {{job, w == w1 ? 0 : 1}});
    for (const auto& cmd : beat.commands()) {
      asked += cmd.has_stop() && cmd.stop().job_id() == job && cmd.stop().checkpoint_first();
    }
  }
  ASSERT_EQ(asked, 2);
  EXPECT_THAT(manager_->Get(job)->reason(), HasSubstr("growing to 3 rank(s)"));
  ASSERT_TRUE(Exit(w1, job, 0, kRankExitSavedAndStopped).ok());
  ASSERT_TRUE(Exit(w2, job, 1, kRankExitSavedAndStopped).ok());
  j = *manager_->Get(job);
  EXPECT_EQ(j.preemptions(), 0) << "growing is not a preemption";
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.layout_generation(), 2);
  EXPECT_EQ(j.spec().resources().ranks(), 3);
  const loom::v1::RecoveryEvent& grew = j.events(j.events_size() - 1);
  EXPECT_EQ(grew.kind(), loom::v1::RecoveryEvent::REPLANNED);
  EXPECT_EQ(grew.cause(), "capacity_returned");
  EXPECT_THAT(grew.to_layout(), HasSubstr("dp 3"));
  EXPECT_NE(j.state(), loom::v1::RUNNING);
}

// The asynchronous report (the controller's ReportStepMetrics) answers as
// the synchronous one does: a refused report at once, before it returns; an
// applied one once its write is durable, from the store's thread, with the
// steps in the store; a retried one again without applying it twice.
// Slow ranks: step reports with per-rank compute times.
class SlowRankTest : public JobManagerTest {
 protected:
  // A two-rank job on node-a and node-b (node-c free when `third`), with
  // recovery.slow_rank.action `action`.
  void StartJob(const std::string& action, bool third) {
    a_ = Register("node-a");
    b_ = Register("node-b");
    if (third) c_ = Register("node-c");
    loom::v1::JobSpec spec = Spec(2);
    spec.mutable_schedule()->set_total_steps(1000);
    if (!action.empty()) spec.mutable_recovery()->mutable_slow_rank()->set_action(action);
    job_ = manager_->Submit(spec)->id();
    for (int port : {29500, 29501}) {
      Beat(a_, port, {{job_, 0}});
      Beat(b_, port, {{job_, 1}});
      if (third) Beat(c_, port);
    }
    ASSERT_EQ(StateOf(job_), loom::v1::RUNNING);
    const loom::v1::Job j = *manager_->Get(job_);
    for (const auto& r : j.ranks()) node_of_rank_[r.rank()] = r.node();
  }

  // Steps [from, to]; rank 1 computes `slow` times longer than rank 0.
  void Report(int from, int to, double slow, std::vector<int> checkpoints = {}) {
    loom::v1::ReportStepMetricsRequest r;
    r.set_worker_id(a_);
    r.set_job_id(job_);
    r.set_generation(generation_[job_]);
    for (int t = from; t <= to; ++t) {
      auto* m = r.add_events()->mutable_step();
      m->set_step(t);
      m->set_loss(3);
      m->set_time_unix_ms(1700000000000 + int64_t{t} * 1000);  // a step a second
      m->add_rank_compute_seconds(0.1 + 0.001 * (t % 3));
      m->add_rank_compute_seconds(0.1 * slow + 0.001 * (t % 2));
    }
    const std::string dir = manager_->Get(job_)->spec().checkpoint().dir();
    for (int c : checkpoints) {
      std::filesystem::create_directories(absl::StrCat(dir, "/step-", c));
      auto* info = r.add_events()->mutable_checkpoint();
      info->set_step(c);
      info->set_path(absl::StrCat(dir, "/step-", c));
    }
    ASSERT_TRUE(manager_->ReportEvents(r).ok());
  }

  std::vector<loom::v1::RecoveryEvent> Events(loom::v1::RecoveryEvent::Kind kind) {
    std::vector<loom::v1::RecoveryEvent> out;
    const loom::v1::Job j = *manager_->Get(job_);
    for (const auto& e : j.events()) {
      if (e.kind() == kind) out.push_back(e);
    }
    return out;
  }

  bool AskedToSave(const loom::v1::HeartbeatResponse& r) {
    for (const auto& c : r.commands()) {
      if (c.has_stop() && c.stop().job_id() == job_ && c.stop().checkpoint_first()) return true;
    }
    return false;
  }

  std::string a_, b_, c_, job_;
  std::map<int, std::string> node_of_rank_;
};

TEST_F(SlowRankTest, ReportOnlyNamesTheRankWithItsEvidenceAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartJob("", /*third=*/false));
  Report(1, 30, 1.0);
  EXPECT_TRUE(Events(loom::v1::RecoveryEvent::SLOW_RANK).empty());
  Report(31, 33, 3.0);
  EXPECT_TRUE(Events(loom::v1::RecoveryEvent::SLOW_RANK).empty()) << "3 reports, 4 confirm";
  Report(34, 34, 3.0);
  const std::vector<loom::v1::RecoveryEvent> named = Events(loom::v1::RecoveryEvent::SLOW_RANK);
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].rank(), 1);
  EXPECT_EQ(named[0].step(), 34);
  EXPECT_EQ(named[0].cause(), "slow_rank");
  EXPECT_EQ(named[0].signal(), "compute_seconds");
  EXPECT_EQ(named[0].worker_id(), node_of_rank_[1] == "node-a" ? a_ : b_);
  EXPECT_NEAR(named[0].baseline(), 0.101, 0.002);
  EXPECT_NEAR(named[0].value(), 0.3, 0.002);
  EXPECT_GT(named[0].slowdown(), 2.9);
  EXPECT_THAT(named[0].message(), HasSubstr("over 4 reports in 3.0 s from step 31 to 34"));
  EXPECT_THAT(named[0].message(), HasSubstr("\"report\": nothing else is done"));
  // Named once per attempt; nothing is stopped or cordoned.
  Report(35, 60, 3.0);
  EXPECT_EQ(Events(loom::v1::RecoveryEvent::SLOW_RANK).size(), 1u);
  EXPECT_FALSE(AskedToSave(Beat(a_, 29502, {{job_, 0}})));
  EXPECT_EQ(StateOf(job_), loom::v1::RUNNING);
  for (const auto& w : manager_->ListWorkers()) {
    EXPECT_EQ(w.cordoned_until_unix_ms(), 0) << w.node();
  }
  EXPECT_THAT(
      MetricsText(),
      HasSubstr("loom_controller_slow_ranks_total{action=\"report\",job_id=\"" + job_ + "\"} 1"));
}

TEST_F(SlowRankTest, CordonMovesTheJobOffTheNodeWithoutLosingAStepWhenItsGangFitsElsewhere) {
  ASSERT_NO_FATAL_FAILURE(StartJob("cordon", /*third=*/true));
  const std::string slow_node = node_of_rank_[1];
  const std::string slow_worker = slow_node == "node-a" ? a_ : b_;
  Report(1, 30, 1.0, {30});
  Report(31, 34, 4.0);
  ASSERT_EQ(Events(loom::v1::RecoveryEvent::SLOW_RANK).size(), 1u);
  EXPECT_THAT(Events(loom::v1::RecoveryEvent::SLOW_RANK)[0].message(),
              HasSubstr("node " + slow_node + " is cordoned for 600s, and the ranks save"));
  bool cordoned = false;
  for (const auto& w : manager_->ListWorkers()) {
    if (w.node() != slow_node) continue;
    cordoned = true;
    EXPECT_EQ(w.cordoned_until_unix_ms(), absl::ToUnixMillis(clock_.Now() + absl::Seconds(600)));
    EXPECT_THAT(w.cordon_reason(), HasSubstr("rank 1 of job " + job_));
  }
  EXPECT_TRUE(cordoned);
  EXPECT_TRUE(AskedToSave(Beat(a_, 29502, {{job_, 0}})));
  EXPECT_TRUE(AskedToSave(Beat(b_, 29502, {{job_, 1}})));
  // They save at step 35 and stop.
  Report(35, 35, 4.0, {35});
  ASSERT_TRUE(Exit(a_, job_, 0, kRankExitSavedAndStopped, "saved and stopped").ok());
  ASSERT_TRUE(Exit(b_, job_, 1, kRankExitSavedAndStopped, "saved and stopped").ok());
  // Placed again on the two other nodes, from the newest checkpoint.
  for (const std::string& w : {a_, b_, c_}) Beat(w, 29503);
  loom::v1::Job j = *manager_->Get(job_);
  ASSERT_EQ(j.state(), loom::v1::SCHEDULED) << j.reason();
  for (const auto& r : j.ranks()) EXPECT_NE(r.node(), slow_node);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.resume_step(), -1);
  // The cordon outlives a controller restart.
  manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_, metrics_.get());
  ASSERT_TRUE(manager_->Recover().ok());
  Register(slow_node);
  bool still = false;
  for (const auto& w : manager_->ListWorkers()) {
    if (w.node() == slow_node && w.alive()) still = w.cordoned_until_unix_ms() > 0;
  }
  EXPECT_TRUE(still);
  // A cordon lasts its time, then the node takes ranks again.
  clock_.Advance(absl::Seconds(601));
  for (const auto& w : manager_->ListWorkers()) {
    EXPECT_EQ(w.cordoned_until_unix_ms(), 0) << w.node();
  }
  (void)slow_worker;
}

TEST_F(SlowRankTest, ReplanGivesTheSlowRanksPipelineStageFewerBlocks) {
  a_ = Register("node-a");
  b_ = Register("node-b");
  loom::v1::JobSpec spec = Spec(2);
  spec.mutable_model()->mutable_gpt()->set_n_layer(8);
  spec.mutable_schedule()->set_total_steps(1000);
  spec.mutable_parallelism()->set_pipeline(2);
  spec.mutable_parallelism()->set_data(1);
  spec.mutable_resources()->set_ranks(2);
  spec.mutable_recovery()->mutable_slow_rank()->set_action("replan");
  absl::StatusOr<loom::v1::Job> submitted = manager_->Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  job_ = submitted->id();
  for (int port : {29500, 29501}) {
    Beat(a_, port, {{job_, 0}});
    Beat(b_, port, {{job_, 1}});
  }
  ASSERT_EQ(StateOf(job_), loom::v1::RUNNING);
  int slow_stage = -1;
  std::string slow_node;
  const loom::v1::Job placed = *manager_->Get(job_);
  for (const auto& r : placed.ranks()) {
    node_of_rank_[r.rank()] = r.node();
    if (r.rank() == 1) {
      slow_stage = r.pp();
      slow_node = r.node();
    }
  }
  ASSERT_GE(slow_stage, 0);
  Report(1, 30, 1.0, {30});
  Report(31, 34, 3.0);
  const std::vector<loom::v1::RecoveryEvent> named = Events(loom::v1::RecoveryEvent::SLOW_RANK);
  ASSERT_EQ(named.size(), 1u);
  EXPECT_THAT(named[0].message(), HasSubstr("re-split for node " + slow_node + "'s speed"));
  EXPECT_TRUE(AskedToSave(Beat(a_, 29502, {{job_, 0}})));
  EXPECT_TRUE(AskedToSave(Beat(b_, 29502, {{job_, 1}})));
  Report(35, 35, 3.0, {35});
  ASSERT_TRUE(Exit(a_, job_, 0, kRankExitSavedAndStopped).ok());
  ASSERT_TRUE(Exit(b_, job_, 1, kRankExitSavedAndStopped).ok());
  std::map<int, std::vector<int>> split_of_rank;
  for (int i = 0; i < 3; ++i) {
    for (const std::string& w : {a_, b_}) {
      const loom::v1::HeartbeatResponse beat = Beat(w, 29503 + i);
      for (const auto& c : beat.commands()) {
        if (!c.has_start() || c.start().job_id() != job_) continue;
        const auto& layers = c.start().spec().parallelism().stage_layers();
        split_of_rank[c.start().rank()] = {layers.begin(), layers.end()};
      }
    }
  }
  const loom::v1::Job j = *manager_->Get(job_);
  ASSERT_EQ(j.state(), loom::v1::SCHEDULED) << j.reason();
  ASSERT_EQ(split_of_rank.size(), 2u);
  EXPECT_EQ(split_of_rank[0], split_of_rank[1]);
  const std::vector<int>& split = split_of_rank[0];
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(split[0] + split[1], 8);
  // The stage now on the slow node has the fewer blocks.
  int stage_now = -1;
  for (const auto& r : j.ranks()) {
    if (r.node() == slow_node) stage_now = r.pp();
  }
  ASSERT_GE(stage_now, 0);
  EXPECT_LT(split[stage_now], split[1 - stage_now]) << split[0] << "+" << split[1];
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.layout_generation(), 1);
  const std::vector<loom::v1::RecoveryEvent> replans = Events(loom::v1::RecoveryEvent::REPLANNED);
  ASSERT_EQ(replans.size(), 1u);
  EXPECT_EQ(replans[0].cause(), "slow_rank");
  EXPECT_EQ(replans[0].steps_lost(), 0);
  EXPECT_THAT(replans[0].from_layout(), HasSubstr("stages 4+4 blocks"));
  EXPECT_THAT(replans[0].to_layout(),
              HasSubstr(absl::StrCat("stages ", split[0], "+", split[1], " blocks")));
}

TEST_F(SlowRankTest, CordonWithNowhereElseToGoKeepsTheJobRunning) {
  ASSERT_NO_FATAL_FAILURE(StartJob("cordon", /*third=*/false));
  Report(1, 30, 1.0);
  Report(31, 34, 4.0);
  const std::vector<loom::v1::RecoveryEvent> named = Events(loom::v1::RecoveryEvent::SLOW_RANK);
  ASSERT_EQ(named.size(), 1u);
  EXPECT_THAT(named[0].message(), HasSubstr("its gang does not fit elsewhere, so the job keeps "
                                            "running there"));
  EXPECT_FALSE(AskedToSave(Beat(a_, 29502, {{job_, 0}})));
  EXPECT_EQ(StateOf(job_), loom::v1::RUNNING);
}

TEST_F(JobManagerTest, ReportEventsAsyncAnswersAsReportEventsDoes) {
  std::string w = Register("node-a");
  Beat(w, 29500);
  auto job = *manager_->Submit(Spec(1));
  Beat(w, 29501);
  Beat(w, 29502, {{job.id(), 0}});
  ASSERT_EQ(StateOf(job.id()), loom::v1::RUNNING);

  using Answer = absl::StatusOr<loom::v1::ReportStepMetricsResponse>;
  auto report_async = [&](const loom::v1::ReportStepMetricsRequest& req, bool* inline_answer) {
    auto promise = std::make_shared<std::promise<Answer>>();
    std::future<Answer> answer = promise->get_future();
    manager_->ReportEventsAsync(req, [promise](Answer a) { promise->set_value(std::move(a)); });
    *inline_answer = answer.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    // Bounded: a lost answer fails here instead of hanging the test.
    EXPECT_EQ(answer.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    return answer.get();
  };

  loom::v1::ReportStepMetricsRequest unknown;
  unknown.set_worker_id(w);
  unknown.set_job_id("no-such-job");
  bool at_once = false;
  EXPECT_EQ(report_async(unknown, &at_once).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(at_once);

  loom::v1::ReportStepMetricsRequest report;
  report.set_worker_id(w);
  report.set_job_id(job.id());
  report.set_generation(generation_[job.id()]);
  for (int step = 1; step <= 3; ++step) {
    auto* m = report.add_events()->mutable_step();
    m->set_step(step);
    m->set_loss(6.0 - step);
  }
  Answer applied = report_async(report, &at_once);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(manager_->Get(job.id())->summary().last_step(), 3);
  auto stored = store_->LoadStepMetrics(job.id(), 0);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 3u);
  // The retry of a report whose answer was lost.
  ASSERT_TRUE(report_async(report, &at_once).ok());
  stored = store_->LoadStepMetrics(job.id(), 0);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 3u);
  EXPECT_DOUBLE_EQ(manager_->Get(job.id())->summary().last_loss(), 3.0);
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
  // Steps without a time split give no verdict.
  EXPECT_FALSE(manager_->Get(job.id())->has_diagnosis());

  // A failed save is an event, never a catalog entry.
  loom::v1::ReportStepMetricsRequest failed = report;
  failed.clear_events();
  auto* bad = failed.add_events()->mutable_checkpoint();
  bad->set_step(4);
  bad->set_status("failed");
  bad->set_error("No space left on device");
  ASSERT_TRUE(manager_->ReportEvents(failed).ok());
  EXPECT_EQ(manager_->Get(job.id())->summary().checkpoints_written(), 1);
  const loom::v1::Job with_event = *manager_->Get(job.id());
  ASSERT_GE(with_event.events_size(), 1);
  const auto& event = with_event.events(with_event.events_size() - 1);
  EXPECT_EQ(event.kind(), loom::v1::RecoveryEvent::CHECKPOINT_FAILED);
  EXPECT_EQ(event.cause(), "checkpoint_failed");
  EXPECT_THAT(event.message(), HasSubstr("No space left on device"));
  EXPECT_THAT(MetricsText(),
              HasSubstr("loom_controller_checkpoint_failures_total{job_id=\"" + job.id() +
                        "\"} 1"));

  // Steps with a split: the bottleneck verdict is kept with the job.
  loom::v1::ReportStepMetricsRequest split = report;
  split.clear_events();
  for (int i = 3; i <= 6; ++i) {
    auto* m = split.add_events()->mutable_step();
    m->set_step(i);
    m->set_loss(4.0);
    m->set_step_time_seconds(1.0);
    m->set_data_wait_seconds(0.5);
    m->set_compute_seconds(0.4);
    m->set_optimizer_seconds(0.1);
  }
  ASSERT_TRUE(manager_->ReportEvents(split).ok());
  const loom::v1::Job diagnosed = *manager_->Get(job.id());
  ASSERT_TRUE(diagnosed.has_diagnosis());
  EXPECT_EQ(diagnosed.diagnosis().verdict(), loom::v1::Diagnosis::DATA_BOUND);
  EXPECT_EQ(diagnosed.diagnosis().step(), 6);

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

// resources.gpus_per_rank 1: ranks go only to workers with a GPU free for
// each, every rank gets a GPU no other live rank on that worker holds, and a
// job waits (saying why) while the GPUs are taken.
TEST_F(JobManagerTest, GpuRanksGetFreeGpusOfTheirOwn) {
  std::string cpu_node = Register("cpu-node", /*slots=*/4);
  Beat(cpu_node, 29500);
  loom::v1::JobSpec spec = Spec(1);
  spec.mutable_resources()->set_ranks(2);
  spec.mutable_resources()->set_gpus_per_rank(1);
  auto submitted = manager_->Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto first = *submitted;
  EXPECT_EQ(StateOf(first.id()), loom::v1::PENDING);
  EXPECT_THAT(manager_->Get(first.id())->reason(), HasSubstr("with a free GPU each"));
  EXPECT_EQ(Beat(cpu_node, 29501).commands_size(), 0);

  std::string gpu_node = Register("gpu-node", /*slots=*/4, 0, 0, /*gpus=*/3);
  auto r = Beat(gpu_node, 29600);
  ASSERT_EQ(StateOf(first.id()), loom::v1::SCHEDULED);
  ASSERT_EQ(r.commands_size(), 2);
  std::set<int> first_gpus;
  for (const auto& c : r.commands()) {
    ASSERT_TRUE(c.has_start());
    first_gpus.insert(c.start().gpu());
  }
  EXPECT_EQ(first_gpus, (std::set<int>{0, 1}));
  EXPECT_THAT(manager_->Get(first.id())->reason(), HasSubstr("@gpu-node:gpu"));
  const loom::v1::Job placed = *manager_->Get(first.id());
  for (const auto& a : placed.ranks()) {
    EXPECT_EQ(a.worker_id(), gpu_node);
    EXPECT_TRUE(first_gpus.count(a.gpu()));
  }

  // One GPU left: a second two-rank job waits although slots are free.
  auto submitted_second = manager_->Submit(spec);
  ASSERT_TRUE(submitted_second.ok()) << submitted_second.status();
  auto second = *submitted_second;
  Beat(gpu_node, 29601, {{first.id(), 0}, {first.id(), 1}});
  EXPECT_EQ(StateOf(second.id()), loom::v1::PENDING);
  EXPECT_THAT(manager_->Get(second.id())->reason(), HasSubstr("1 such slot(s)"));

  // The first job's ranks exit: the second gets two distinct GPUs.
  ASSERT_TRUE(manager_->Cancel(first.id(), "").ok());
  ASSERT_TRUE(Exit(gpu_node, first.id(), 0, 143).ok());
  ASSERT_TRUE(Exit(gpu_node, first.id(), 1, 143).ok());
  auto r2 = Beat(gpu_node, 29602);
  ASSERT_EQ(StateOf(second.id()), loom::v1::SCHEDULED);
  std::set<int> second_gpus;
  for (const auto& c : r2.commands()) {
    if (c.has_start()) second_gpus.insert(c.start().gpu());
  }
  EXPECT_EQ(second_gpus.size(), 2u);
  for (int g : second_gpus) EXPECT_TRUE(g >= 0 && g < 3) << g;

  // CPU jobs ignore GPUs: one fits on the CPU node meanwhile.
  auto cpu_job = *manager_->Submit(Spec(1));
  Beat(cpu_node, 29503);
  EXPECT_EQ(StateOf(cpu_job.id()), loom::v1::SCHEDULED);
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

// A worker declared dead while alive registers again with its old
// attempt's rank still running, and the new attempt is placed on it. The
// worker refuses that start while the old rank runs (RankSupervisor::Start),
// so only a rank of the start's own attempt confirms it: the start goes out
// again once the old rank has been stopped. (Confirmed by the old rank, it
// was never sent again and the job sat in SCHEDULED for good.)
TEST_F(JobManagerTest, AStartIsSentAgainUntilARankOfItsOwnAttemptRunsThere) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1, /*max_restarts=*/1));
  Beat(w1, 29501, {{job.id(), 0}});
  ASSERT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  clock_.Advance(absl::Seconds(6));
  manager_->Tick();  // w1 silent 6 s > 5 s: attempt 1 follows
  ASSERT_EQ(manager_->Get(job.id())->generation(), 1);

  const std::string w2 = Register("node-a");  // the same daemon, a new id
  // Its heartbeat lists the old attempt's rank, still running there.
  auto beat = [&](bool old_rank_runs) {
    loom::v1::HeartbeatRequest req;
    req.set_worker_id(w2);
    req.set_rendezvous_port(29510);
    if (old_rank_runs) {
      auto* r = req.add_running();
      r->set_job_id(job.id());
      r->set_rank(0);
      r->set_generation(0);
    }
    auto resp = manager_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    int starts = 0;
    for (const auto& c : resp->commands()) {
      if (c.has_start() && c.start().generation() == 1) ++starts;
    }
    return starts;
  };
  // Past the dead worker's lease and margin, attempt 1 is placed on w2 and
  // its start goes out (the worker refuses it: the old rank runs).
  int starts = 0;
  for (int i = 0; i < 40 && starts == 0; ++i) {
    clock_.Advance(absl::Milliseconds(250));
    starts += beat(true);
    manager_->Tick();
  }
  ASSERT_EQ(starts, 1) << manager_->Get(job.id())->reason();
  ASSERT_EQ(StateOf(job.id()), loom::v1::SCHEDULED);
  EXPECT_EQ(beat(true), 0);  // not again at once
  clock_.Advance(absl::Seconds(2));  // past three heartbeat periods
  // The old rank was stopped; attempt 1's start comes again.
  EXPECT_EQ(beat(false), 1) << "the old attempt's rank confirmed the start";
}

// The controller frozen for 12 s (its VM, say) does not declare its
// workers dead on waking: only the silence it was there to see counts, and
// the reason says how much of the silence was its own pause.
TEST_F(JobManagerTest, TheControllersOwnPauseIsNotCountedAsItsWorkersSilence) {
  opts_.pause_threshold = absl::Seconds(1);
  manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_, metrics_.get());
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  Beat(w2, 29500);
  auto job = *manager_->Submit(Spec(1));
  const auto started = Beat(w1, 29501, {{job.id(), 0}});
  ASSERT_EQ(started.commands_size(), 1);  // its one rank went to w1
  manager_->Tick();
  ASSERT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  clock_.Advance(absl::Seconds(12));
  manager_->Tick();  // on waking: 1 s of the 12 counted
  EXPECT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  EXPECT_EQ(manager_->Gauges().alive_workers, 2);
  Beat(w2, 29502);  // w2 is heard again; w1 stays silent
  for (int i = 0; i < 8; ++i) {  // 4 s more, checks on time: 5 s, not past it
    clock_.Advance(absl::Milliseconds(500));
    manager_->Tick();
  }
  EXPECT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  clock_.Advance(absl::Milliseconds(500));
  manager_->Tick();
  auto failed = *manager_->Get(job.id());
  EXPECT_EQ(failed.state(), loom::v1::FAILED);
  EXPECT_THAT(failed.reason(),
              HasSubstr("stopped heartbeating (silent for 16.5s, timeout 5.0s, 11.0s of it while "
                        "the controller itself was paused)"));
  EXPECT_EQ(manager_->Gauges().alive_workers, 1);  // w2, heard after the pause
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
  EXPECT_EQ(manager_->Gauges().alive_workers, 1);
  loom::v1::HeartbeatRequest late;
  late.set_worker_id(w2);
  EXPECT_EQ(manager_->Heartbeat(late).status().code(), absl::StatusCode::kNotFound);
  auto cmds = Beat(w1, 29503, {{job.id(), 0}});
  ASSERT_EQ(cmds.commands_size(), 1);
  EXPECT_TRUE(cmds.commands(0).has_stop());
}

// A controller restart is invisible to training: the job stays RUNNING, its
// worker registers again with the rank still running, the rank is re-adopted
// (no restart, even with max_restarts 0), a retried step report is applied
// once, and the job finishes. PENDING jobs stay; ids never repeat.
TEST_F(JobManagerTest, ControllerRestartReadoptsRunningRanksWithoutARestart) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto running = *manager_->Submit(Spec(1, /*max_restarts=*/0));
  Beat(w1, 29501, {{running.id(), 0}});
  auto pending = *manager_->Submit(Spec(1));
  ASSERT_EQ(StateOf(running.id()), loom::v1::RUNNING);
  ASSERT_EQ(StateOf(pending.id()), loom::v1::PENDING);
  auto report = [&](const std::string& worker, int from, int to) {
    loom::v1::ReportStepMetricsRequest req;
    req.set_worker_id(worker);
    req.set_job_id(running.id());
    req.set_generation(0);
    for (int t = from; t <= to; ++t) {
      auto* m = req.add_events()->mutable_step();
      m->set_step(t);
      m->set_loss(3.0);
    }
    return manager_->ReportEvents(req);
  };
  ASSERT_TRUE(report(w1, 1, 5).ok());
  manager_.reset();
  store_.reset();

  store_ = *Store::Open(dir_);
  manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_);
  ASSERT_TRUE(manager_->Recover().ok());
  EXPECT_EQ(manager_->List({}, 0).size(), 2u);
  EXPECT_EQ(StateOf(running.id()), loom::v1::RUNNING);
  EXPECT_EQ(StateOf(pending.id()), loom::v1::PENDING);
  // A report sent while the worker is not yet known again: it retries.
  EXPECT_EQ(report(w1, 6, 6).status().code(), absl::StatusCode::kNotFound);

  loom::v1::RegisterWorkerRequest again;
  again.set_node("node-a");
  again.set_address("127.0.0.1");
  again.set_slots(1);
  auto* r = again.add_running();
  r->set_job_id(running.id());
  r->set_rank(0);
  r->set_generation(0);
  auto registered = manager_->RegisterWorker(again);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->lease_grace_ms(), 5000);
  const std::string w2 = registered->worker_id();
  auto j = *manager_->Get(running.id());
  EXPECT_EQ(j.state(), loom::v1::RUNNING);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.generation(), 0);
  ASSERT_EQ(j.ranks_size(), 1);
  EXPECT_EQ(j.ranks(0).worker_id(), w2);
  ASSERT_EQ(j.events_size(), 1);
  EXPECT_EQ(j.events(0).kind(), loom::v1::RecoveryEvent::READOPTED);
  EXPECT_EQ(j.events(0).cause(), "controller_restart");

  // Step 5 again (its answer was lost) and step 6: applied once each.
  ASSERT_TRUE(report(w2, 5, 6).ok());
  EXPECT_EQ(manager_->Get(running.id())->summary().last_step(), 6);
  auto steps = manager_->StepMetrics(running.id(), 0);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(steps->size(), 6u);
  // Past the re-adoption deadline nothing happens to an adopted job, and the
  // pending one is not placed on the adopted rank's slot.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(2));
    Beat(w2, 29600 + i, {{running.id(), 0}});
    manager_->Tick();
  }
  EXPECT_EQ(StateOf(running.id()), loom::v1::RUNNING);
  EXPECT_EQ(StateOf(pending.id()), loom::v1::PENDING);
  ASSERT_TRUE(Exit(w2, running.id(), 0, 0).ok());
  EXPECT_EQ(StateOf(running.id()), loom::v1::SUCCEEDED);
  EXPECT_EQ(manager_->Get(running.id())->restarts(), 0);
  auto next = *manager_->Submit(Spec(1));
  EXPECT_EQ(next.id(), "tiny-3");  // ids never repeat across restarts
}

// Past the grace, a job whose ranks were not re-adopted restarts exactly
// once, is placed again only after the lease margin, and a late rank of the
// old attempt is told to stop.
TEST_F(JobManagerTest, ControllerRestartPastTheGraceRestartsOnce) {
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
  clock_.Advance(absl::Seconds(6));
  manager_->Tick();
  // Still within the grace plus the margin (5 + 2 s).
  EXPECT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  manager_->Tick();
  auto j = *manager_->Get(job.id());
  EXPECT_EQ(j.state(), loom::v1::PENDING);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.generation(), 1);
  ASSERT_EQ(j.events_size(), 1);
  EXPECT_EQ(j.events(0).kind(), loom::v1::RecoveryEvent::RESTART);
  EXPECT_EQ(j.events(0).cause(), "controller_restart");
  EXPECT_THAT(j.events(0).message(), HasSubstr("only 0 of 1 rank(s) were re-adopted within 7.0s"));
  // A worker registers with the old attempt's rank still running: it is
  // not adopted, and the next heartbeat stops that attempt.
  loom::v1::RegisterWorkerRequest late;
  late.set_node("node-a");
  late.set_address("127.0.0.1");
  late.set_slots(1);
  auto* r = late.add_running();
  r->set_job_id(job.id());
  r->set_rank(0);
  r->set_generation(0);
  const std::string w2 = manager_->RegisterWorker(late)->worker_id();
  auto first = Beat(w2, 29600, {{job.id(), 0}});
  int stops = 0, starts = 0;
  for (const auto& c : first.commands()) {
    stops += c.has_stop() && c.stop().generation() == 0;
    starts += c.has_start();
  }
  EXPECT_EQ(stops, 1);
  EXPECT_EQ(starts, 0);  // the lease margin has not passed
  EXPECT_THAT(manager_->Get(job.id())->reason(), HasSubstr("fenced"));
  // Its queued reports arrive late: refused as stale, but the checkpoint it
  // committed while it was current enters the catalog (it is on disk, where
  // the next attempt resumes from).
  loom::v1::ReportStepMetricsRequest backlog;
  backlog.set_worker_id(w2);
  backlog.set_job_id(job.id());
  backlog.set_generation(0);
  backlog.add_events()->mutable_step()->set_step(21);
  auto* ckpt = backlog.add_events()->mutable_checkpoint();
  ckpt->set_step(20);
  ckpt->set_path(dir_ + "/ckpt/step-20");
  EXPECT_EQ(manager_->ReportEvents(backlog).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto catalog = manager_->Checkpoints(job.id());
  ASSERT_TRUE(catalog.ok());
  ASSERT_EQ(catalog->size(), 1u);
  EXPECT_EQ((*catalog)[0].step(), 20);
  EXPECT_EQ((*catalog)[0].generation(), 0);
  EXPECT_EQ(manager_->Get(job.id())->summary().last_step(), 0);  // the step is not applied
  generation_[job.id()] = 0;
  EXPECT_EQ(Exit(w2, job.id(), 0, 137).code(), absl::StatusCode::kFailedPrecondition);
  clock_.Advance(absl::Seconds(3));
  auto cmds = Beat(w2, 29601);
  ASSERT_EQ(cmds.commands_size(), 1);
  EXPECT_EQ(cmds.commands(0).start().generation(), 1);
  EXPECT_EQ(cmds.commands(0).start().resume_step(), -1);
  EXPECT_EQ(manager_->Get(job.id())->restarts(), 1);
}

// A worker declared dead may run its ranks until its lease runs out: its
// job is placed again only worker_timeout + lease_margin after the
// controller last heard it.
TEST_F(JobManagerTest, LostWorkersJobWaitsOutItsLeaseBeforeItIsPlacedAgain) {
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1, /*max_restarts=*/1));
  Beat(w1, 29501, {{job.id(), 0}});
  ASSERT_EQ(StateOf(job.id()), loom::v1::RUNNING);
  for (int i = 0; i < 6; ++i) {  // w1 falls silent; w2 beats
    clock_.Advance(absl::Seconds(1));
    Beat(w2, 29600 + i);
    manager_->Tick();
  }
  EXPECT_EQ(StateOf(job.id()), loom::v1::PENDING);  // 6 s > 5 s: dead, restart 1
  EXPECT_THAT(manager_->Get(job.id())->reason(), HasSubstr("fenced"));
  clock_.Advance(absl::Milliseconds(500));  // 6.5 s < 5 + 2 s since w1 was heard
  EXPECT_EQ(Beat(w2, 29610).commands_size(), 0);
  clock_.Advance(absl::Seconds(1));  // 7.5 s
  auto cmds = Beat(w2, 29611);
  ASSERT_EQ(cmds.commands_size(), 1);
  EXPECT_TRUE(cmds.commands(0).has_start());
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
  // Its exit is no failure of the new attempt (refused as stale), and frees
  // the job to be placed.
  EXPECT_EQ(Exit(w1, job.id(), 0, 143, "stopped on request").code(),
            absl::StatusCode::kFailedPrecondition);
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

// A rank that cannot join its job's process groups before any step lost no
// work: the attempt is placed again without counting a restart, up to
// max_rendezvous_retries times in a row; then the usual policy applies
// (here max_restarts 0: the job fails with the rank's reason).
// The workers' measured figures feed the planner's arithmetic: anything
// not finite and >= 0 is refused with the field's name.
TEST_F(JobManagerTest, RegisterRefusesMeasuredFiguresThatAreNotFiniteOrNegative) {
  using Setter = void (loom::v1::RegisterWorkerRequest::*)(double);
  const std::pair<const char*, Setter> fields[] = {
      {"block_fixed_seconds", &loom::v1::RegisterWorkerRequest::set_block_fixed_seconds},
      {"block_seconds_per_activation",
       &loom::v1::RegisterWorkerRequest::set_block_seconds_per_activation},
      {"allreduce_latency_seconds",
       &loom::v1::RegisterWorkerRequest::set_allreduce_latency_seconds},
      {"allreduce_bytes_per_second",
       &loom::v1::RegisterWorkerRequest::set_allreduce_bytes_per_second},
      {"tensor_collective_extra_seconds",
       &loom::v1::RegisterWorkerRequest::set_tensor_collective_extra_seconds},
      {"tensor_collective_idle_fraction",
       &loom::v1::RegisterWorkerRequest::set_tensor_collective_idle_fraction},
      {"concurrent_slowdown", &loom::v1::RegisterWorkerRequest::set_concurrent_slowdown},
  };
  for (const auto& [name, set] : fields) {
    for (double bad : {-1.0, std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
      loom::v1::RegisterWorkerRequest req;
      req.set_node("node-a");
      req.set_address("127.0.0.1");
      req.set_slots(1);
      (req.*set)(bad);
      auto r = manager_->RegisterWorker(req);
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << name << " " << bad;
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(name));
    }
  }
  // A fraction is at most 1.
  loom::v1::RegisterWorkerRequest over_one;
  over_one.set_node("node-a");
  over_one.set_address("127.0.0.1");
  over_one.set_slots(1);
  over_one.set_tensor_collective_idle_fraction(1.5);
  auto refused = manager_->RegisterWorker(over_one);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("tensor_collective_idle_fraction: a fraction, at most 1"));
  // A slowdown is at least 1 (0: not measured).
  loom::v1::RegisterWorkerRequest faster;
  faster.set_node("node-a");
  faster.set_address("127.0.0.1");
  faster.set_slots(1);
  faster.set_concurrent_slowdown(0.5);
  auto slowdown = manager_->RegisterWorker(faster);
  EXPECT_EQ(slowdown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(slowdown.status().message()), HasSubstr("concurrent_slowdown: at least 1"));
  loom::v1::RegisterWorkerRequest long_host;
  long_host.set_node("node-a");
  long_host.set_address("127.0.0.1");
  long_host.set_slots(1);
  long_host.set_host_id(std::string(1000, 'x'));
  EXPECT_EQ(manager_->RegisterWorker(long_host).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, RendezvousFailureBeforeAnyStepIsPlacedAgainWithoutARestart) {
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  Beat(w2, 29500);
  auto job = *manager_->Submit(Spec(2, /*max_restarts=*/0));
  int port = 29501;
  for (int retry = 1; retry <= opts_.max_rendezvous_retries + 1; ++retry) {
    auto r1 = Beat(w1, port);
    auto r2 = Beat(w2, port);
    ++port;
    int starts = 0;
    for (auto* r : {&r1, &r2}) {
      for (const auto& c : r->commands()) starts += c.has_start() ? 1 : 0;
    }
    ASSERT_EQ(starts, 2) << "retry " << retry;
    ASSERT_TRUE(Exit(w1, job.id(), 0, kRankExitRendezvousFailed,
                     "joining the process group at 127.0.0.1:29501 failed: Connection closed "
                     "by peer")
                    .ok());
    ASSERT_TRUE(Exit(w2, job.id(), 1, 143, "stopped on request").ok());
    clock_.Advance(absl::Milliseconds(1100));
    Beat(w1, port);
    Beat(w2, port);
    ++port;
    manager_->Tick();
    auto j = *manager_->Get(job.id());
    EXPECT_EQ(j.restarts(), 0);
    if (retry <= opts_.max_rendezvous_retries) {
      // Back to PENDING, and placed again at once (both workers are free).
      ASSERT_EQ(j.state(), loom::v1::SCHEDULED) << "retry " << retry;
      ASSERT_GE(j.history_size(), 2);
      const auto& requeued = j.history(j.history_size() - 2);
      EXPECT_EQ(requeued.to(), loom::v1::PENDING);
      EXPECT_THAT(requeued.reason(),
                  HasSubstr(absl::StrCat("rendezvous retry ", retry, "/",
                                         opts_.max_rendezvous_retries, ", no restart counted")));
      EXPECT_EQ(j.events_size(), 0);
    } else {
      EXPECT_EQ(j.state(), loom::v1::FAILED);
      EXPECT_THAT(j.reason(), HasSubstr("Connection closed by peer"));
    }
  }
}

// A rank that fails with the rendezvous code after the attempt has trained
// is an ordinary failure: it takes the restart-or-fail path at once.
TEST_F(JobManagerTest, RendezvousCodeAfterTrainingIsAnOrdinaryFailure) {
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  Beat(w2, 29500);
  auto job = *manager_->Submit(Spec(2, /*max_restarts=*/0));
  Beat(w1, 29501, {{job.id(), 0}});
  Beat(w2, 29501, {{job.id(), 1}});
  loom::v1::ReportStepMetricsRequest report;
  report.set_worker_id(w1);
  report.set_job_id(job.id());
  report.set_generation(generation_[job.id()]);
  report.add_events()->mutable_step()->set_step(1);
  ASSERT_TRUE(manager_->ReportEvents(report).ok());
  ASSERT_TRUE(Exit(w1, job.id(), 0, kRankExitRendezvousFailed, "lost the store").ok());
  clock_.Advance(absl::Milliseconds(1100));
  Beat(w1, 29502);
  Beat(w2, 29502);
  manager_->Tick();
  EXPECT_EQ(StateOf(job.id()), loom::v1::FAILED);
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
    return manager_->ReportEvents(req);
  };
  for (int t = 1; t < 300; ++t) {
    ASSERT_FALSE(report(t, 3.0 + 0.01 * ((t * 37) % 11))->stop()) << t;
  }
  EXPECT_TRUE(report(300, 9.0)->stop());  // 3x: spike
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
  // Late reports of the stopped attempt are refused as stale and change
  // nothing.
  EXPECT_EQ(report(301, 3.0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Get(job.id())->summary().last_step(), 300);
  // Once the old rank is gone, the job restarts at the checkpoint with the skip list.
  auto stop = Beat(w1, 29502, {{job.id(), 0}});
  // The old attempt's exit frees its slot, and is refused as stale.
  EXPECT_EQ(Exit(w1, job.id(), 0, 143).code(), absl::StatusCode::kFailedPrecondition);
  auto start = Beat(w1, 29503);
  ASSERT_EQ(start.commands_size(), 1);
  ASSERT_TRUE(start.commands(0).has_start());
  EXPECT_EQ(start.commands(0).start().resume_step(), 0);
  EXPECT_EQ(start.commands(0).start().generation(), 1);
  ASSERT_EQ(start.commands(0).start().skip_batches_size(), 1);
  // Replayed steps from 201 are normal; a second spike exceeds max_rollbacks.
  Beat(w1, 29504, {{job.id(), 0}});
  for (int t = 201; t < 260; ++t) ASSERT_FALSE(report(t, 3.0 + 0.01 * ((t * 37) % 11))->stop());
  EXPECT_TRUE(report(260, std::numeric_limits<double>::quiet_NaN())->stop());
  j = *manager_->Get(job.id());
  EXPECT_EQ(j.state(), loom::v1::FAILED);
  EXPECT_THAT(j.reason(), HasSubstr("not cured after 1 rollback"));
}

// ListJobs pages newest first by job sequence, and gives summaries without
// the history unless asked for whole jobs.
TEST_F(JobManagerTest, ListPagesNewestFirstWithSummaries) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(manager_->Submit(Spec(1)).ok());
  std::vector<std::string> seen;
  int64_t before = 0;
  int pages = 0;
  do {
    int64_t next = 0;
    auto page = manager_->ListPage({}, 3, before, /*full=*/false, &next);
    ++pages;
    for (const auto& j : page) {
      seen.push_back(j.id());
      EXPECT_EQ(j.history_size(), 0);
      EXPECT_EQ(j.spec().name(), "tiny");
      EXPECT_EQ(j.spec().schedule().total_steps(), 10);
      EXPECT_NE(j.state(), loom::v1::JOB_STATE_UNSPECIFIED);
    }
    before = next;
  } while (before > 0 && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_THAT(seen, ::testing::ElementsAre("tiny-7", "tiny-6", "tiny-5", "tiny-4", "tiny-3",
                                           "tiny-2", "tiny-1"));
  int64_t next = 0;
  auto full = manager_->ListPage({}, 100, 0, /*full=*/true, &next);
  ASSERT_EQ(full.size(), 7u);
  EXPECT_EQ(next, 0);
  EXPECT_GT(full[0].history_size(), 0);
  // A state filter pages over the matching jobs only: one SCHEDULED, six
  // PENDING behind it on the single slot.
  auto pending = manager_->ListPage({{loom::v1::PENDING}}, 100, 0, false, &next);
  EXPECT_EQ(pending.size(), 6u);
}

// Reads a watch until it ends (bounded): each event as "STATE seq",
// "step N" or "job only".
std::vector<std::string> ReadWatch(JobWatch& w, int rounds = 50) {
  std::vector<std::string> out;
  for (int i = 0; i < rounds && !w.ended(); ++i) {
    auto batch = w.Next(absl::Milliseconds(20));
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok()) break;
    for (const auto& e : *batch) {
      out.push_back(e.has_step()         ? absl::StrCat("step ", e.step().step())
                    : e.has_transition() ? absl::StrCat(loom::v1::JobState_Name(e.transition().to()),
                                                        " ", e.seq())
                    : e.has_recovery()   ? absl::StrCat("event ", e.seq())
                                         : "job only");
    }
  }
  return out;
}

// A watch gives the job's transitions from the event log as they commit,
// each with its seq, and ends after the last; one resumed after a seq on a
// controller started again over the same store gets exactly the rest.
TEST_F(JobManagerTest, WatchDeliversTransitionsAndClosesAtTheEnd) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1));
  auto watch = manager_->Watch(job.id(), /*include_history=*/true);
  ASSERT_TRUE(watch.ok()) << watch.status();
  EXPECT_THAT(ReadWatch(**watch, 3), ::testing::ElementsAre("PENDING 1", "SCHEDULED 2"));
  EXPECT_FALSE((*watch)->ended());
  Beat(w1, 29501, {});
  ASSERT_TRUE(manager_->Cancel(job.id(), "test").ok());
  EXPECT_THAT(ReadWatch(**watch), ::testing::ElementsAre("CANCELLED 3"));
  EXPECT_TRUE((*watch)->ended());
  EXPECT_EQ(manager_->Watch("missing-1", false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->Watch(job.id(), false, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Another controller over the same store (a restart, or a standby that
  // took over): a client that saw seq 1 gets 2 and 3, then the end.
  watch->reset();
  manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_, metrics_.get());
  ASSERT_TRUE(manager_->Recover().ok());
  auto resumed = manager_->Watch(job.id(), false, 1);
  ASSERT_TRUE(resumed.ok());
  EXPECT_THAT(ReadWatch(**resumed), ::testing::ElementsAre("SCHEDULED 2", "CANCELLED 3"));
  auto after_end = manager_->Watch(job.id(), false, 3);
  ASSERT_TRUE(after_end.ok());
  EXPECT_THAT(ReadWatch(**after_end), ::testing::ElementsAre("job only"));
  auto from_now = manager_->Watch(job.id(), false);
  ASSERT_TRUE(from_now.ok());
  EXPECT_THAT(ReadWatch(**from_now), ::testing::ElementsAre("CANCELLED 0"));
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
  {
    loom::v1::RegisterWorkerRequest bad;
    bad.set_node("n");
    bad.set_address("127.0.0.1");
    bad.set_slots(1);
    bad.set_gpus(-2);
    auto refused = manager_->RegisterWorker(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(refused.status().message()), StartsWith("gpus:"));
  }
}

}  // namespace
}  // namespace loom::controller

namespace loom::controller {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// A 7B-parameter GPT: ~112 GB of mixed-precision Adam state, far more than a
// test worker's memory.
loom::v1::JobSpec BigSpec(int workers) {
  loom::v1::JobSpec spec = Spec(workers);
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_n_layer(32);
  gpt->set_n_head(32);
  gpt->set_d_model(4096);
  gpt->set_seq_len(2048);
  gpt->set_vocab_size(32000);
  return spec;
}

TEST_F(JobManagerTest, SubmitWithAutoPlansOnTheLiveWorkersAndStoresThePlan) {
  Register("node-a", 1, 16e9, 50e9);
  Register("node-b", 1, 16e9, 40e9);
  loom::v1::JobSpec spec = Spec(2);
  spec.mutable_parallelism()->set_auto_(true);
  auto job = manager_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const auto& plan = job->plan();
  EXPECT_TRUE(plan.auto_());
  EXPECT_TRUE(plan.topology_measured());
  EXPECT_THAT(plan.topology(), HasSubstr("2 x 1 cpu"));
  EXPECT_THAT(plan.topology(), HasSubstr("40.0 GFLOP/s"));  // the slower worker
  EXPECT_TRUE(plan.layout().fits());
  EXPECT_EQ(plan.layout().data(), 2);
  EXPECT_GT(plan.layout().tokens_per_second(), 0);
  EXPECT_GT(plan.time_unix_ms(), 0);
  EXPECT_EQ(job->spec().parallelism().data(), 2);
  EXPECT_EQ(job->spec().parallelism().tensor(), 1);
  EXPECT_EQ(job->spec().parallelism().pipeline(), 1);
  // Stored: a restarted controller still has it.
  JobManager reloaded(store_.get(), &clock_, opts_);
  ASSERT_TRUE(reloaded.Recover().ok());
  EXPECT_EQ(reloaded.Get(job->id())->plan().layout().data(), 2);
  EXPECT_EQ(reloaded.Get(job->id())->plan().topology(), plan.topology());
}

TEST_F(JobManagerTest, SubmitEvaluatesAnExplicitLayoutAndRejectsOneThatDoesNotFit) {
  Register("node-a", 1, 8e9, 50e9);
  auto ok = manager_->Submit(Spec(1));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->plan().auto_());
  EXPECT_TRUE(ok->plan().layout().fits());
  auto big = manager_->Submit(BigSpec(1));
  ASSERT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  EXPECT_THAT(Msg(big.status()), StartsWith("parallelism.data: layout tp 1 | pp 1 | dp 1"));
  EXPECT_THAT(Msg(big.status()), HasSubstr("GB per device before activations, device has 8.0 GB"));
  EXPECT_THAT(Msg(big.status()), HasSubstr("training state alone does not fit"));
  EXPECT_EQ(manager_->List({}, 0).size(), 1u) << "nothing stored for the rejected job";
}

// Tensor-parallel specs execute; one that would not fit is
// refused with the layout's numbers.
TEST_F(JobManagerTest, TensorParallelSpecsRunWhenTheyFit) {
  Register("node-a", 2, 16e9, 50e9);
  loom::v1::JobSpec tiny = Spec(1);
  tiny.mutable_resources()->set_ranks(2);
  tiny.mutable_parallelism()->set_tensor(2);
  tiny.mutable_parallelism()->set_data(1);
  auto r = manager_->Submit(tiny);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->spec().parallelism().tensor(), 2);
  EXPECT_EQ(r->plan().layout().tensor(), 2);
  loom::v1::JobSpec big = BigSpec(1);
  big.mutable_resources()->set_ranks(2);
  big.mutable_parallelism()->set_tensor(2);
  big.mutable_parallelism()->set_data(1);
  r = manager_->Submit(big);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(Msg(r.status()), StartsWith("parallelism.tensor: layout tp 2 | pp 1 | dp 1"));
}

// One placement: the scheduler places a TP2 x PP2 job with the
// planner's placement over the workers in rack order (node-b's rack r1
// before node-a's r2), each TP group inside one worker; rank 0's worker
// hosts the rendezvous. A tensor group wider than a worker is refused at
// submit (by the planner, before the scheduler's own shape check).
TEST_F(JobManagerTest, TensorPipelineJobIsPlacedInRackOrder) {
  auto reg = [&](const std::string& node, const std::string& rack) {
    loom::v1::RegisterWorkerRequest req;
    req.set_node(node);
    req.set_address(node + ".local");
    req.set_slots(2);
    req.set_cpus(4);
    req.set_memory_bytes(16000000000ull);
    req.set_gemm_flops_per_second_per_thread(50e9);
    req.set_memory_bandwidth_bytes_per_second(10e9);
    req.set_zone("z1");
    req.set_rack(rack);
    auto resp = manager_->RegisterWorker(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->worker_id() : "";
  };
  const std::string a = reg("node-a", "r2");
  const std::string b = reg("node-b", "r1");
  loom::v1::JobSpec spec = Spec(2);
  spec.mutable_resources()->set_ranks(4);
  spec.mutable_parallelism()->set_data(1);
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_parallelism()->set_pipeline(2);
  auto job = manager_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Beat(a, 29500);
  EXPECT_EQ(StateOf(job->id()), loom::v1::PENDING);
  EXPECT_THAT(manager_->Get(job->id())->reason(),
              HasSubstr("rendezvous port from worker " + b));
  auto rb = Beat(b, 29600);
  ASSERT_EQ(StateOf(job->id()), loom::v1::SCHEDULED);
  const loom::v1::Job placed = *manager_->Get(job->id());
  EXPECT_EQ(placed.reason(),
            "placed 4 rank(s) as dp1 x pp2 x tp2 on racks [z1/r1: node-b] [z1/r2: node-a]: "
            "0@node-b(dp0,pp0,tp0) 1@node-b(dp0,pp0,tp1) 2@node-a(dp0,pp1,tp0) "
            "3@node-a(dp0,pp1,tp1)");
  const ParallelLayout layout{1, 2, 2};
  ASSERT_EQ(placed.ranks_size(), 4);
  for (const auto& r : placed.ranks()) {
    const RankCoordinates at = CoordinatesOf(layout, r.rank());
    EXPECT_EQ(r.dp(), at.dp);
    EXPECT_EQ(r.pp(), at.pp);
    EXPECT_EQ(r.tp(), at.tp);
    EXPECT_EQ(r.worker_id(), r.pp() == 0 ? b : a) << "rank " << r.rank();
    EXPECT_EQ(r.rack(), r.pp() == 0 ? "z1/r1" : "z1/r2") << "rank " << r.rank();
  }
  ASSERT_EQ(rb.commands_size(), 2);
  for (const auto& c : rb.commands()) {
    EXPECT_EQ(c.start().master_addr(), "node-b.local");
    EXPECT_EQ(c.start().master_port(), 29600);
    EXPECT_EQ(c.start().world_size(), 4);
  }

  // TP4 over 2 workers: one tensor group cannot sit in two workers.
  loom::v1::JobSpec wide = spec;
  wide.mutable_model()->mutable_gpt()->set_n_head(4);
  wide.mutable_parallelism()->set_tensor(4);
  wide.mutable_parallelism()->set_pipeline(1);
  auto refused = manager_->Submit(wide);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(Msg(refused.status()), StartsWith("parallelism.tensor: layout.tp: 4 spans 2 nodes"));
}

TEST_F(JobManagerTest, PlanUsesTheLiveWorkersOrAGivenTopology) {
  Register("node-a", 4, 32e9, 50e9);
  loom::v1::PlanRequest req;
  *req.mutable_spec() = Spec(1);
  req.mutable_spec()->mutable_resources()->set_ranks(4);
  req.mutable_spec()->mutable_parallelism()->set_auto_(true);
  req.set_top_k(3);
  auto live = manager_->Plan(req);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_THAT(live->topology(), HasSubstr("1 x 4 cpu"));
  EXPECT_TRUE(live->chosen().fits());
  EXPECT_LE(live->alternatives_size(), 3);
  EXPECT_THAT(live->report(), HasSubstr("Cluster: 1 x 4 cpu"));

  req.set_topology_yaml("name: dgx\ndevice: A100-80GB\nnodes: 1\ndevices_per_node: 8\n");
  req.mutable_spec()->mutable_resources()->set_ranks(8);
  req.mutable_spec()->mutable_batch()->set_global_batch(64);
  auto given = manager_->Plan(req);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_THAT(given->topology(), HasSubstr("dgx (1 x 8 A100-80GB)"));
  EXPECT_EQ(given->chosen().tensor() * given->chosen().pipeline() * given->chosen().data(), 8);

  req.set_topology_yaml("device: A100-80GB\nnodes: 1\ndevices_per_nod: 8\n");
  auto bad = manager_->Plan(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()), StartsWith("topology_yaml: "));
  req.clear_topology_yaml();
  req.set_top_k(51);
  EXPECT_EQ(manager_->Plan(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_top_k(0);
  req.mutable_spec()->mutable_model()->mutable_gpt()->set_n_head(5);
  auto invalid = manager_->Plan(req);
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(invalid.status()), StartsWith("model.gpt.n_head"));
}

TEST_F(JobManagerTest, OperatorRollbackResumesFromACheckpointAndSkipsData) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  loom::v1::JobSpec spec = Spec(1);
  spec.mutable_recovery()->set_disable_spike_detection(true);
  auto job = *manager_->Submit(spec);
  loom::v1::RollbackJobRequest req;
  req.set_job_id(job.id());
  req.set_to_step(0);
  auto early = manager_->Rollback(req);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_THAT(Msg(early.status()), HasSubstr("only a RUNNING job can be rolled back"));

  Beat(w1, 29501, {{job.id(), 0}});
  std::string ckpt_dir = dir_ + "/ckpt/" + job.id();
  auto report = [&](int step) {
    loom::v1::ReportStepMetricsRequest r;
    r.set_worker_id(w1);
    r.set_job_id(job.id());
    r.set_generation(generation_[job.id()]);
    auto* m = r.add_events()->mutable_step();
    m->set_step(step);
    m->set_loss(3.0);
    m->set_data_batch(step - 1);
    if (step % 10 == 0) {
      // A committed checkpoint that exists on disk.
      std::string path = absl::StrCat(dir_, "/step-", step);
      mkdir(path.c_str(), 0700);
      auto* c = r.add_events()->mutable_checkpoint();
      c->set_step(step);
      c->set_path(path);
      c->set_bytes(1000 * step);
      c->set_write_seconds(0.5);
      c->set_stall_seconds(0.002);
    }
    ASSERT_TRUE(manager_->ReportEvents(r).ok());
  };
  for (int t = 1; t <= 30; ++t) report(t);
  ASSERT_EQ(StateOf(job.id()), loom::v1::RUNNING);

  auto code = [&](int64_t to, std::vector<std::pair<int64_t, int64_t>> skips) {
    loom::v1::RollbackJobRequest r;
    r.set_job_id(job.id());
    r.set_to_step(to);
    for (auto [b, e] : skips) {
      auto* s = r.add_skip();
      s->set_begin(b);
      s->set_end(e);
    }
    return manager_->Rollback(r).status();
  };
  EXPECT_EQ(code(-1, {}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status beyond = code(31, {});
  EXPECT_EQ(beyond.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(beyond), StartsWith("to_step: 31 is beyond the job's last step 30"));
  absl::Status pruned = code(5, {});
  EXPECT_EQ(pruned.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(pruned), HasSubstr("the oldest kept is step 10"));
  absl::Status empty = code(25, {{7, 7}});
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(empty), StartsWith("skip[0]: [7, 7) is empty"));
  absl::Status trained = code(25, {{3, 12}});
  EXPECT_EQ(trained.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(trained), HasSubstr("were trained before the checkpoint at step 20"));
  loom::v1::RollbackJobRequest unknown;
  unknown.set_job_id("nope-9");
  EXPECT_EQ(manager_->Rollback(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(StateOf(job.id()), loom::v1::RUNNING) << "rejected requests change nothing";

  req.set_to_step(25);
  auto* skip = req.add_skip();
  skip->set_begin(15);  // before the checkpoint's batches: clipped to 20
  skip->set_end(40);
  req.set_reason("bad shard");
  auto rolled = manager_->Rollback(req);
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_EQ(rolled->state(), loom::v1::PENDING);
  EXPECT_EQ(rolled->resume_step(), 25);
  EXPECT_EQ(rolled->operator_rollbacks(), 1);
  EXPECT_EQ(rolled->rollbacks(), 0) << "operator rollbacks do not use up max_rollbacks";
  ASSERT_EQ(rolled->skip_batches_size(), 1);
  EXPECT_EQ(rolled->skip_batches(0).begin(), 20);  // step 21 trained batch 20
  EXPECT_EQ(rolled->skip_batches(0).end(), 40);
  ASSERT_EQ(rolled->events_size(), 1);
  const auto& ev = rolled->events(0);
  EXPECT_EQ(ev.kind(), loom::v1::RecoveryEvent::ROLLBACK);
  EXPECT_EQ(ev.cause(), "operator");
  EXPECT_EQ(ev.checkpoint_step(), 20);
  EXPECT_EQ(ev.steps_lost(), 10);
  EXPECT_EQ(ev.generation(), 1);
  EXPECT_THAT(ev.message(), HasSubstr("bad shard"));
  EXPECT_THAT(ev.message(), HasSubstr("skip data batches [20, 40)"));
  // Rolled back once, it is no longer RUNNING.
  EXPECT_EQ(code(10, {}).code(), absl::StatusCode::kFailedPrecondition);

  // The next attempt starts from the newest checkpoint <= 25 with the skip.
  Beat(w1, 29502, {{job.id(), 0}});
  EXPECT_EQ(Exit(w1, job.id(), 0, 143).code(), absl::StatusCode::kFailedPrecondition);  // stale
  auto start = Beat(w1, 29503);
  ASSERT_EQ(start.commands_size(), 1);
  ASSERT_TRUE(start.commands(0).has_start());
  EXPECT_EQ(start.commands(0).start().resume_step(), 25);
  EXPECT_EQ(start.commands(0).start().generation(), 1);
  ASSERT_EQ(start.commands(0).start().skip_batches_size(), 1);
  EXPECT_EQ(start.commands(0).start().skip_batches(0).begin(), 20);

  std::string text = MetricsText();
  std::string id = job.id();
  EXPECT_THAT(text, HasSubstr("loom_controller_recoveries_total{cause=\"operator\",job_id=\"" +
                              id + "\",kind=\"rollback\"} 1"));
  EXPECT_THAT(text, HasSubstr("loom_controller_steps_lost_total{cause=\"operator\",job_id=\"" +
                              id + "\"} 10"));
  EXPECT_THAT(text, HasSubstr("loom_controller_batches_skipped_total{job_id=\"" + id + "\"} 20"));
  EXPECT_THAT(text, HasSubstr("loom_controller_checkpoints_total{job_id=\"" + id + "\"} 3"));
  EXPECT_THAT(text, HasSubstr("loom_controller_checkpoint_bytes_total{job_id=\"" + id +
                              "\"} 60000"));
  EXPECT_THAT(text, HasSubstr("loom_controller_last_checkpoint_bytes{job_id=\"" + id +
                              "\"} 30000"));
  EXPECT_THAT(text, HasSubstr("loom_controller_last_checkpoint_step{job_id=\"" + id + "\"} 30"));
  EXPECT_THAT(text, HasSubstr("loom_controller_checkpoint_write_duration_seconds_count 3"));
  EXPECT_THAT(text, HasSubstr("loom_controller_checkpoint_stall_duration_seconds_count 3"));
}

TEST_F(JobManagerTest, RestartsCountStepsLostByCause) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1, /*max_restarts=*/2));
  Beat(w1, 29501, {{job.id(), 0}});
  loom::v1::ReportStepMetricsRequest r;
  r.set_worker_id(w1);
  r.set_job_id(job.id());
  r.set_generation(generation_[job.id()]);
  for (int t = 1; t <= 7; ++t) r.add_events()->mutable_step()->set_step(t);
  ASSERT_TRUE(manager_->ReportEvents(r).ok());
  ASSERT_TRUE(Exit(w1, job.id(), 0, 1, "segfault").ok());
  clock_.Advance(absl::Milliseconds(1100));
  Beat(w1, 29502);
  manager_->Tick();
  auto j = *manager_->Get(job.id());
  ASSERT_EQ(j.events_size(), 1);
  EXPECT_EQ(j.events(0).cause(), "rank_failure");
  EXPECT_EQ(j.events(0).steps_lost(), 7) << "no checkpoint: back to step 0";
  EXPECT_THAT(MetricsText(),
              HasSubstr("loom_controller_steps_lost_total{cause=\"rank_failure\",job_id=\"" +
                        job.id() + "\"} 7"));
}

}  // namespace
}  // namespace loom::controller

namespace loom::controller {
namespace {

// Honest checkpoints: a rank's report of a checkpoint that failed
// verification at load marks it corrupt in the catalog and is an event that
// names the file and the check; a restart then resumes from the newest
// checkpoint that is not corrupt; retention's deletions are "pruned".
TEST_F(JobManagerTest, CorruptCheckpointIsMarkedAndRestartsSkipIt) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1, /*max_restarts=*/2));
  Beat(w1, 29501, {{job.id(), 0}});
  const std::string dir = job.spec().checkpoint().dir();
  for (int step : {4, 6}) std::filesystem::create_directories(absl::StrCat(dir, "/step-", step));
  // step-2 is not there: retention deleted it, as the step-6 report says.
  loom::v1::ReportStepMetricsRequest report;
  report.set_worker_id(w1);
  report.set_job_id(job.id());
  report.set_generation(generation_[job.id()]);
  for (int step : {2, 4, 6}) {
    auto* c = report.add_events()->mutable_checkpoint();
    c->set_step(step);
    c->set_path(absl::StrCat(dir, "/step-", step));
    if (step == 6) {
      loom::v1::PrunedCheckpoint* p = c->add_pruned();
      p->set_path(absl::StrCat(dir, "/step-2"));
      p->set_step(2);
      p->set_tier("local");
      p->set_reason("not among the newest 2");
    }
  }
  auto* s = report.add_events()->mutable_step();
  s->set_step(7);
  s->set_loss(3);
  ASSERT_TRUE(manager_->ReportEvents(report).ok());

  // Rank 0 of a later load found step 6 corrupt.
  loom::v1::ReportStepMetricsRequest corrupt = report;
  corrupt.clear_events();
  auto* c = corrupt.add_events()->mutable_checkpoint();
  c->set_step(6);
  c->set_path(absl::StrCat(dir, "/step-6"));
  c->set_status("corrupt");
  c->set_corrupt_file(absl::StrCat(dir, "/step-6/shard-00000.bin"));
  c->set_failed_check("crc32c");
  c->set_error("crc32c 0badf00d does not match the manifest's 12345678");
  ASSERT_TRUE(manager_->ReportEvents(corrupt).ok());

  std::map<int64_t, std::string> status;
  auto catalog = manager_->Checkpoints(job.id());
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  for (const auto& info : *catalog) status[info.step()] = info.status();
  EXPECT_EQ(status, (std::map<int64_t, std::string>{
                        {2, "pruned"}, {4, "committed"}, {6, "corrupt"}}));
  loom::v1::Job j = *manager_->Get(job.id());
  ASSERT_GE(j.events_size(), 1);
  const auto& event = j.events(j.events_size() - 1);
  EXPECT_EQ(event.kind(), loom::v1::RecoveryEvent::CHECKPOINT_CORRUPT);
  EXPECT_EQ(event.step(), 6);
  EXPECT_THAT(event.message(), HasSubstr(absl::StrCat(dir, "/step-6/shard-00000.bin")));
  EXPECT_THAT(event.message(), HasSubstr("crc32c check"));

  // A report without the file's check is refused.
  c->clear_failed_check();
  EXPECT_EQ(manager_->ReportEvents(corrupt).status().code(), absl::StatusCode::kInvalidArgument);

  // The rank fails: the restart resumes from step 4, not the corrupt 6.
  ASSERT_TRUE(Exit(w1, job.id(), 0, 1, "segfault").ok());
  clock_.Advance(absl::Milliseconds(1100));
  Beat(w1, 29502);
  manager_->Tick();
  j = *manager_->Get(job.id());
  ASSERT_EQ(j.events(j.events_size() - 1).kind(), loom::v1::RecoveryEvent::RESTART);
  EXPECT_EQ(j.events(j.events_size() - 1).checkpoint_step(), 4);
  EXPECT_EQ(j.events(j.events_size() - 1).steps_lost(), 3);
  std::filesystem::remove_all(dir);

  // Without a verifier, --verify is refused rather than faked.
  EXPECT_EQ(manager_->Checkpoints(job.id(), /*verify=*/true).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Checkpoints("nope", false).status().code(), absl::StatusCode::kNotFound);
}

// When every checkpoint fails verification the rank exits with
// kRankExitNoGoodCheckpoint: the job fails with its reason at once, with
// restarts left unspent (each would fail the same way).
TEST_F(JobManagerTest, NoGoodCheckpointFailsTheJobWithoutSpendingRestarts) {
  std::string w1 = Register("node-a");
  std::string w2 = Register("node-b");
  Beat(w1, 29500);
  Beat(w2, 29500);
  auto job = *manager_->Submit(Spec(2, /*max_restarts=*/3));
  Beat(w1, 29501, {{job.id(), 0}});
  Beat(w2, 29501, {{job.id(), 1}});
  // Rank 1 often exits first, knowing only that rank 0 failed.
  ASSERT_TRUE(Exit(w2, job.id(), 1, 1, "rank 0 found no checkpoint to resume from").ok());
  ASSERT_TRUE(Exit(w1, job.id(), 0, kRankExitNoGoodCheckpoint,
                   "training failed: no checkpoint in /c verifies, so training cannot resume")
                  .ok());
  clock_.Advance(absl::Milliseconds(1100));
  Beat(w1, 29502);
  Beat(w2, 29502);
  manager_->Tick();
  loom::v1::Job j = *manager_->Get(job.id());
  EXPECT_EQ(j.state(), loom::v1::FAILED);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_THAT(j.reason(), HasSubstr("no checkpoint in /c verifies"));
  ASSERT_GE(j.events_size(), 1);
  EXPECT_EQ(j.events(j.events_size() - 1).kind(), loom::v1::RecoveryEvent::GAVE_UP);
  EXPECT_THAT(j.events(j.events_size() - 1).message(), HasSubstr("allow_start_from_scratch"));
}

// A save that found the checkpoint volume full (kRankExitCheckpointVolumeFull)
// would fail again at the restart's first save: the job fails at once with
// the reason, its restarts unspent, instead of burning them in seconds.
TEST_F(JobManagerTest, FullCheckpointVolumeFailsTheJobWithoutSpendingRestarts) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1, /*max_restarts=*/3));
  Beat(w1, 29501, {{job.id(), 0}});
  ASSERT_TRUE(Exit(w1, job.id(), 0, kRankExitCheckpointVolumeFull,
                   "training failed: the checkpoint volume is full: checkpoint at step 40: "
                   "write /c/step-000000040.tmp-7/shard-00000.bin: No space left on device")
                  .ok());
  clock_.Advance(absl::Milliseconds(1100));
  Beat(w1, 29502);
  manager_->Tick();
  loom::v1::Job j = *manager_->Get(job.id());
  EXPECT_EQ(j.state(), loom::v1::FAILED);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_THAT(j.reason(), HasSubstr("No space left on device"));
  ASSERT_GE(j.events_size(), 1);
  EXPECT_EQ(j.events(j.events_size() - 1).kind(), loom::v1::RecoveryEvent::GAVE_UP);
  EXPECT_THAT(j.events(j.events_size() - 1).message(), HasSubstr("on_save_failure: CONTINUE"));
  // Any other exit code still restarts (RankFailureRestartsFromNewestCheckpoint...).
}

// Confined paths: a spec's checkpoint directory must lie beneath
// a checkpoint root, its data under the data roots (after resolving ".."),
// and no two unfinished jobs may share a checkpoint directory (nor nest
// one in the other); a finished job's directory may be taken over.
TEST_F(JobManagerTest, SubmitConfinesPathsAndRefusesASharedCheckpointDirectory) {
  opts_.data_roots = {"/data"};
  manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_, metrics_.get());
  const std::string w = Register("node-a", 4);

  loom::v1::JobSpec etc = Spec(1);
  etc.mutable_checkpoint()->set_dir("/etc");
  auto refused = manager_->Submit(etc);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("checkpoint.dir: /etc is outside"));
  etc.mutable_checkpoint()->set_dir(dir_ + "/ckpt/../../../../etc");
  refused = manager_->Submit(etc);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("(/etc) is outside"));
  loom::v1::JobSpec shadow = Spec(1);
  shadow.mutable_data()->set_train(0, "/etc/shadow");
  refused = manager_->Submit(shadow);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("data.train[0]: /etc/shadow"));
  loom::v1::JobSpec climb = Spec(1);
  climb.mutable_data()->set_train(0, "/data/../etc/shadow");
  EXPECT_EQ(manager_->Submit(climb).status().code(), absl::StatusCode::kInvalidArgument);

  loom::v1::JobSpec first = Spec(1);
  first.mutable_checkpoint()->set_dir(dir_ + "/ckpt/shared");
  auto a = manager_->Submit(first);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec().checkpoint().dir(), dir_ + "/ckpt/shared");
  for (const std::string& clash : {dir_ + "/ckpt/shared", dir_ + "/ckpt/shared/sub",
                                   dir_ + "/ckpt/./shared/"}) {
    loom::v1::JobSpec second = Spec(1);
    second.mutable_checkpoint()->set_dir(clash);
    auto b = manager_->Submit(second);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << clash;
    EXPECT_THAT(std::string(b.status().message()),
                StartsWith("checkpoint.dir: " + dir_ + "/ckpt/shared"));
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("in use by job " + a->id()));
  }
  // A job without a directory of its own gets <root>/<id>: no clash.
  EXPECT_TRUE(manager_->Submit(Spec(1)).ok());
  // Once the first job has ended, its directory may be reused.
  ASSERT_TRUE(manager_->Cancel(a->id(), "done with it").ok());
  ASSERT_EQ(StateOf(a->id()), loom::v1::CANCELLED);
  loom::v1::JobSpec again = Spec(1);
  again.mutable_checkpoint()->set_dir(dir_ + "/ckpt/shared");
  EXPECT_TRUE(manager_->Submit(again).ok());
  (void)w;
}

// Load: watch streams are bounded; the counts /metrics reads are
// kept as jobs move, not counted over every job; a finished job's step
// series is thinned to the configured size.
TEST_F(JobManagerTest, WatchersAreBoundedAndCountsFollowTheJobs) {
  opts_.max_watchers = 2;
  opts_.finished_steps_kept = 5;
  opts_.finished_events_kept = 2;
  manager_ = std::make_unique<JobManager>(store_.get(), &clock_, opts_, metrics_.get());
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto a = *manager_->Submit(Spec(1));
  auto b = *manager_->Submit(Spec(1));
  auto counts = manager_->Gauges().jobs_by_state;
  EXPECT_EQ(counts[loom::v1::SCHEDULED], 1);
  EXPECT_EQ(counts[loom::v1::PENDING], 1);
  auto q1 = manager_->Watch(a.id(), false);
  auto q2 = manager_->Watch(b.id(), false);
  ASSERT_TRUE(q1.ok() && q2.ok());
  auto q3 = manager_->Watch(a.id(), false);
  ASSERT_EQ(q3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(q3.status().message()), HasSubstr("--max_watchers"));
  q2->reset();  // a stream that ended frees its place
  EXPECT_TRUE(manager_->Watch(a.id(), false).ok());

  // Job a runs 40 steps, with a checkpoint every 10, and succeeds; its
  // series is thinned to 5 steps and its log to its transitions and 2 more.
  Beat(w1, 29501, {});
  for (int step = 1; step <= 40; ++step) {
    loom::v1::ReportStepMetricsRequest req;
    req.set_worker_id(w1);
    req.set_job_id(a.id());
    req.set_generation(generation_[a.id()]);
    if (step % 10 == 0) {
      auto* c = req.add_events()->mutable_checkpoint();
      c->set_step(step);
      c->set_path(absl::StrCat(opts_.checkpoint_root, "/", a.id(), "/step-", step));
    }
    auto* m = req.add_events()->mutable_step();
    m->set_step(step);
    m->set_loss(3.0);
    ASSERT_TRUE(manager_->ReportEvents(req).ok());
  }
  EXPECT_EQ(manager_->StepMetrics(a.id(), 0)->size(), 40u);
  ASSERT_TRUE(Exit(w1, a.id(), 0, 0).ok());
  EXPECT_EQ(StateOf(a.id()), loom::v1::SUCCEEDED);
  manager_->Tick();
  std::vector<int64_t> kept;
  // (Held in a variable: a range-for over *StepMetrics(...) would read the
  // temporary StatusOr after its end, as ASan found.)
  auto thinned = manager_->StepMetrics(a.id(), 0);
  ASSERT_TRUE(thinned.ok()) << thinned.status();
  for (const auto& m : *thinned) kept.push_back(m.step());
  EXPECT_THAT(kept, ::testing::ElementsAre(1, 10, 20, 30, 40));
  auto logged = store_->LoadEvents(a.id(), 0, 0);
  ASSERT_TRUE(logged.ok());
  std::vector<std::string> left;
  for (const auto& e : *logged) {
    loom::v1::JobEvent parsed;
    ASSERT_TRUE(parsed.ParseFromString(e.payload));
    left.push_back(parsed.has_checkpoint() ? absl::StrCat("checkpoint ", parsed.checkpoint().step())
                                           : JobState_Name(parsed.transition().to()));
  }
  EXPECT_THAT(left, ::testing::ElementsAre("PENDING", "SCHEDULED", "RUNNING", "checkpoint 30",
                                           "checkpoint 40", "SUCCEEDED"));
  counts = manager_->Gauges().jobs_by_state;
  EXPECT_EQ(counts[loom::v1::SUCCEEDED], 1);
  EXPECT_EQ(counts[loom::v1::SCHEDULED] + counts[loom::v1::RUNNING], 1);
  EXPECT_EQ(counts[loom::v1::PENDING], 0);
}

// A durable write that fails (here: another connection holds the
// database's write lock past the store's busy timeout) is not ignored: the
// change stands in memory, is counted, and the next Tick writes it, so a
// restarted controller finds it.
TEST_F(JobManagerTest, FailedDurableWriteIsRetriedUntilItLands) {
  std::string w1 = Register("node-a");
  Beat(w1, 29500);
  auto job = *manager_->Submit(Spec(1));
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/loom.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE;", nullptr, nullptr, nullptr), SQLITE_OK);
  auto cancelled = manager_->Cancel(job.id(), "while the disk is busy");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), loom::v1::CANCELLED);
  EXPECT_EQ(manager_->Gauges().store_write_failures, 1);
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  manager_->Tick();
  EXPECT_EQ(manager_->Gauges().store_write_failures, 1);  // the retry landed
  // A new controller on the same store sees the cancel and its history.
  manager_.reset();
  JobManager again(store_.get(), &clock_, opts_, metrics_.get());
  ASSERT_TRUE(again.Recover().ok());
  auto reloaded = again.Get(job.id());
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(reloaded->state(), loom::v1::CANCELLED);
  auto history = store_->LoadTransitions(job.id());
  ASSERT_TRUE(history.ok());
  ASSERT_GE(history->size(), 2u);
  EXPECT_EQ(history->back().to(), loom::v1::CANCELLED);
}

}  // namespace
}  // namespace loom::controller
