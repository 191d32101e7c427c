// End-to-end tests: real loom-controller and loom-worker processes started by
// `loomctl local up` on loopback ports chosen by the OS, driven through the
// real loomctl binary and a raw gRPC client.
#include "tests/cluster_fixture.h"

namespace loom {
namespace {

TEST_F(ClusterTest, TrainsDataParallelJobToSuccess) {
  StartCluster(2);
  auto workers = Ctl("-o json workers");
  ASSERT_EQ(workers.exit_code, 0);
  loom::v1::ListWorkersResponse wl;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(workers.out, &wl).ok());
  ASSERT_EQ(wl.workers_size(), 2);

  auto r = Ctl("submit --follow " + WriteSpec("tiny", 60, 2));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(r.out, HasSubstr("validation loss"));

  loom::v1::Job job = Status("tiny-1");
  EXPECT_EQ(job.state(), loom::v1::SUCCEEDED);
  ASSERT_EQ(job.ranks_size(), 2);
  EXPECT_NE(job.ranks(0).node(), job.ranks(1).node()) << "ranks spread over both workers";
  // Where its wall time went (controller/progress/goodput.h), as `loomctl status` says.
  auto text = Ctl("status tiny-1");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  const size_t goodput = text.out.find("goodput  ");
  ASSERT_NE(goodput, std::string::npos) << text.out;
  const std::string line = text.out.substr(goodput, text.out.find('\n', goodput) - goodput);
  std::printf("%s\n", line.c_str());
  EXPECT_THAT(line, HasSubstr("s productive of"));
  EXPECT_THAT(line, HasSubstr("ETTR 0."));
  EXPECT_EQ(job.summary().last_step(), 60);
  EXPECT_LT(job.summary().last_loss(), job.summary().first_loss() - 0.5)
      << "training loss must fall";
  ASSERT_TRUE(job.summary().has_val_loss());
  EXPECT_LT(job.summary().last_val_loss(), std::log(256.0)) << "below a uniform guess";
  EXPECT_GE(job.summary().checkpoints_written(), 3);  // steps 20, 40, 60
  EXPECT_EQ(access(job.summary().last_checkpoint().c_str(), R_OK), 0)
      << job.summary().last_checkpoint();
  EXPECT_THAT(StatesWithoutRendezvousRetries(job),
              ::testing::ElementsAre(loom::v1::PENDING, loom::v1::SCHEDULED, loom::v1::RUNNING,
                                     loom::v1::SUCCEEDED))
      << job.DebugString();

  // Each rank re-executed itself with a short OpenMP spin (unless the
  // environment chose a policy) and says so in its log under the worker's
  // work directory.
  int rank_logs = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(home_)) {
    if (entry.path().filename() != "rank-0.log" && entry.path().filename() != "rank-1.log") {
      continue;
    }
    if (entry.path().parent_path().filename() != "tiny-1") continue;
    ++rank_logs;
    auto log = ReadFile(entry.path().string());
    ASSERT_TRUE(log.ok());
    const bool chosen = getenv("OMP_WAIT_POLICY") != nullptr || getenv("GOMP_SPINCOUNT") != nullptr;
    EXPECT_THAT(*log, HasSubstr(chosen ? "(from the environment)"
                                       : "OpenMP wait GOMP_SPINCOUNT=30000 (set by Loom)"))
        << entry.path();
  }
  EXPECT_EQ(rank_logs, 2);
  // The catalog lists steps 20, 40, 60. Retention keeps the newest 2 plus a
  // rollback target 100 steps back (spike detection is on), so all remain.
  auto ckpts = Ctl("-o json checkpoints tiny-1");
  ASSERT_EQ(ckpts.exit_code, 0) << ckpts.err;
  loom::v1::ListCheckpointsResponse catalog;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ckpts.out, &catalog).ok());
  ASSERT_EQ(catalog.checkpoints_size(), 3);
  EXPECT_EQ(catalog.checkpoints(0).step(), 20);
  EXPECT_EQ(catalog.checkpoints(0).status(), "committed");
  EXPECT_EQ(catalog.checkpoints(2).step(), 60);
  EXPECT_EQ(catalog.checkpoints(2).status(), "committed");
  EXPECT_EQ(catalog.checkpoints(2).sha256().size(), 64u);

  CheckMetrics(controller_metrics_,
               {"loom_controller_jobs{state=\"SUCCEEDED\"} 1", "loom_controller_workers_alive 2",
                "loom_controller_rpcs_total"});
  int with_loss = 0;
  for (const auto& d : Daemons()) {
    if (!absl::StartsWith(d.name, "worker")) continue;  // (and postgres)
    CheckMetrics(d.metrics_address, {"loom_worker_blas_info", "loom_worker_rank_exits_total"});
    auto metrics_body = loom::testing::HttpGet(d.metrics_address, "/metrics").body;
    if (metrics_body.find("loom_worker_mfu_ratio{job_id=\"tiny-1\"") != std::string::npos) {
      EXPECT_THAT(metrics_body, HasSubstr("loom_worker_memory_bytes{job_id=\"tiny-1\",kind=\"optimizer\""));
      EXPECT_THAT(metrics_body, HasSubstr("loom_worker_energy_joules_total{job_id=\"tiny-1\""));
      for (const char* phase : {"data_wait", "host_to_device", "forward", "backward", "comm",
                                "optimizer", "checkpoint_stall"}) {
        EXPECT_THAT(metrics_body,
                    HasSubstr(absl::StrCat("loom_worker_step_phase_seconds{job_id=\"tiny-1\","
                                           "phase=\"", phase, "\",rank=\"0\"}")));
      }
      EXPECT_THAT(metrics_body, HasSubstr("loom_worker_memory_bytes{job_id=\"tiny-1\",kind=\"limit\""));
    }
    auto body = loom::testing::HttpGet(d.metrics_address, "/metrics").body;
    if (body.find("loom_worker_loss{job_id=\"tiny-1\",rank=\"0\"}") != std::string::npos) ++with_loss;
  }
  std::string all_bodies;
  for (const auto& d : Daemons()) {
    all_bodies += loom::testing::HttpGet(d.metrics_address, "/metrics").body;
  }
  EXPECT_EQ(with_loss, 1) << "rank 0's worker exports the job's loss\n" << all_bodies;

  // Every metric the dashboard and the Prometheus rules use is exported.
  // (The controller refreshes the goodput series every 5 s: scrape until
  // they are there, 15 s at most.)
  std::map<std::string, std::set<std::string>> used;  // file -> metrics
  for (const char* file : {"/dashboards/grafana/loom-training.json",
                           "/dashboards/prometheus/loom-rules.yml"}) {
    auto text = ReadFile(std::string(LOOM_SOURCE_DIR) + file);
    ASSERT_TRUE(text.ok()) << file;
    std::regex metric(R"(\bloom_(controller|worker)_[a-z0-9_]+)");
    for (std::sregex_iterator it(text->begin(), text->end(), metric), end; it != end; ++it) {
      used[file].insert(it->str());
    }
    EXPECT_GE(used[file].size(), 5u) << file;
  }
  std::string scraped;
  auto exported = [&scraped](const std::string& name) {
    return scraped.find("\n" + name + "{") != std::string::npos ||
           scraped.find("\n" + name + " ") != std::string::npos;
  };
  WaitFor(
      [&] {
        scraped.clear();
        for (const auto& d : Daemons()) {
          scraped += loom::testing::HttpGet(d.metrics_address, "/metrics").body;
        }
        for (const auto& [file, names] : used) {
          for (const auto& name : names) {
            if (!exported(name)) return false;
          }
        }
        return true;
      },
      15);
  for (const auto& [file, names] : used) {
    for (const auto& name : names) {
      EXPECT_TRUE(exported(name)) << file << " uses " << name << ", which no daemon exports";
    }
  }
  EXPECT_GT(job.summary().mfu(), 0.0);
  EXPECT_LE(job.summary().mfu(), 1.0);
  // And it says what it is measured against (a CPU rank's calibration).
  EXPECT_TRUE(absl::StrContains(job.summary().peak_flops_source(), "calibrated fp32 GEMM peak"))
      << job.summary().peak_flops_source();

  // The bottleneck verdict is stored with the job and printed with its evidence.
  ASSERT_TRUE(job.has_diagnosis());
  EXPECT_NE(job.diagnosis().verdict(), loom::v1::Diagnosis::VERDICT_UNSPECIFIED)
      << job.diagnosis().summary();
  EXPECT_EQ(job.diagnosis().step(), 60);
  EXPECT_GE(job.diagnosis().evidence_size(), 3);
  auto diagnose = Ctl("diagnose tiny-1");
  ASSERT_EQ(diagnose.exit_code, 0) << diagnose.err;
  EXPECT_THAT(diagnose.out, HasSubstr("verdict"));
  EXPECT_THAT(diagnose.out, HasSubstr("split: data wait"));
  EXPECT_THAT(diagnose.out, HasSubstr("as of step 60"));

  // init_from: a new job starts from tiny-1's step-40 checkpoint, under
  // another layout (ZeRO-1), at its own step 0: its initial validation loss
  // is tiny-1's at step 40, the same weights on the same validation data.
  {
    SCOPED_TRACE("init_from");
    auto none = Ctl("submit " + WriteSpec("tiny-from", 20, 2,
                                          "init_from: {job: tiny-1, step: 30}\n"));
    EXPECT_EQ(none.exit_code, 1);
    EXPECT_THAT(none.err, HasSubstr("init_from.step: tiny-1 has no committed checkpoint at step "
                                    "30 (committed: 20, 40, 60)"));
    const std::string wider = WriteSpec("tiny-wide", 20, 2, "init_from: {job: tiny-1}\n");
    auto wide_spec = ReadFile(wider);
    ASSERT_TRUE(wide_spec.ok());
    std::ofstream(wider) << absl::StrReplaceAll(*wide_spec, {{"d_model: 32", "d_model: 64"}});
    auto mismatch = Ctl("submit " + wider);
    EXPECT_EQ(mismatch.exit_code, 1);
    EXPECT_THAT(mismatch.err, HasSubstr("init_from.job: tiny-1 trains"));
    EXPECT_THAT(mismatch.err, HasSubstr("a checkpoint initializes only the same model"));

    auto from = Ctl("submit --follow " +
                    WriteSpec("tiny-from", 20, 2,
                              "init_from: {job: tiny-1, step: 40}\nparallelism: {zero_stage: 1}\n"));
    ASSERT_EQ(from.exit_code, 0) << from.out << from.err;
    std::smatch id;
    ASSERT_TRUE(std::regex_search(from.out, id, std::regex(R"(submitted (tiny-from-[0-9]+))")))
        << from.out;
    const std::string new_job = id[1];
    const loom::v1::Job started = Status(new_job);
    EXPECT_EQ(started.state(), loom::v1::SUCCEEDED) << started.DebugString();
    EXPECT_TRUE(absl::EndsWith(started.spec().init_from().path(), "/tiny-1/step-000000040"))
        << started.spec().init_from().DebugString();
    EXPECT_EQ(started.summary().last_step(), 20) << "its own schedule, from step 0";
    loom::v1::GetStepMetricsResponse source_steps, new_steps;
    ASSERT_NO_FATAL_FAILURE(GetStepMetrics("tiny-1", &source_steps));
    ASSERT_NO_FATAL_FAILURE(GetStepMetrics(new_job, &new_steps));
    double source_val = -1, initial_val = -1;
    for (const auto& m : source_steps.steps()) {
      if (m.step() == 40 && m.has_val_loss()) source_val = m.val_loss();
    }
    for (const auto& m : new_steps.steps()) {
      if (m.step() == 0 && m.has_val_loss()) initial_val = m.val_loss();
    }
    ASSERT_GT(source_val, 0);
    EXPECT_NEAR(initial_val, source_val, 1e-5 * source_val);
  }

  // The controller restarts and still knows the job.
  auto down = Ctl("local down");
  ASSERT_EQ(down.exit_code, 0);
  auto up = Ctl(absl::StrCat("local up --workers 1", kStoreFlag));
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_EQ(Status("tiny-1").state(), loom::v1::SUCCEEDED);
}

// Identities and roles end to end, with loomctl: an admin adds users, a
// user's job records its submitter, another user may neither cancel nor
// roll it back, a reader may not submit, a removed user's token stops
// working without a restart, and the admin (by certificate) may cancel
// anyone's job.
TEST_F(ClusterTest, UsersChangeOnlyTheirOwnJobsAndRemovedUsersAreLockedOut) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  for (const auto& [name, role] : std::vector<std::pair<std::string, std::string>>{
           {"bob", "user"}, {"dave", "user"}, {"carol", "reader"}}) {
    auto added = Ctl(absl::StrCat("users add ", name, " --role ", role, " --token-out ", home_,
                                  "/", name, ".token"));
    ASSERT_EQ(added.exit_code, 0) << added.err;
  }
  auto as = [&](const std::string& user, const std::string& args) {
    return Ctl(absl::StrCat("--token-file ", home_, "/", user, ".token ", args));
  };
  // The controller re-reads the users file within a tick.
  ASSERT_TRUE(WaitFor([&] { return as("carol", "list").exit_code == 0; }, 10));
  const std::string spec = WriteSpec("owned", 2000, 1);
  auto submitted = as("bob", "submit " + spec);
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string job = "owned-1";
  EXPECT_EQ(Status(job).submitted_by(), "bob");
  EXPECT_THAT(as("carol", "status " + job).out, HasSubstr("by       bob"));

  auto refused = as("dave", "cancel " + job);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("PERMISSION_DENIED: user 'dave' may not cancel job 'owned-1'"
                                     ": it was submitted by 'bob'"));
  auto rollback = as("dave", "rollback " + job + " --to-step 0");
  EXPECT_EQ(rollback.exit_code, 1);
  EXPECT_THAT(rollback.err, HasSubstr("may not roll back job 'owned-1'"));
  auto reader = as("carol", "submit " + spec);
  EXPECT_EQ(reader.exit_code, 1);
  EXPECT_THAT(reader.err, HasSubstr("role reader and may not call JobService.SubmitJob"));
  EXPECT_NE(Status(job).state(), loom::v1::CANCELLED);

  auto removed = Ctl("users remove bob");
  ASSERT_EQ(removed.exit_code, 0) << removed.err;
  ASSERT_TRUE(WaitFor([&] { return as("bob", "list").exit_code != 0; }, 10));
  EXPECT_THAT(as("bob", "cancel " + job).err, HasSubstr("UNAUTHENTICATED: unknown token"));
  // The local user is an admin, here proving it with its certificate from
  // the cluster CA instead of its token.
  auto cancelled = Ctl(absl::StrCat("--tls-cert ", home_, "/tls/user-local.pem --tls-key ", home_,
                                    "/tls/user-local.key cancel ", job));
  EXPECT_EQ(cancelled.exit_code, 0) << cancelled.err;
  EXPECT_EQ(Status(job).state(), loom::v1::CANCELLED);
}

// The controller's queue file (--queues, through `local up --queues`):
// refused at start naming the field; read again on SIGHUP, where a bad file
// leaves the running configuration in place; and submit names a queue or
// priority class it does not define.
TEST_F(ClusterTest, QueueFileIsCheckedAtStartReloadedOnSighupAndNamedAtSubmit) {
  const std::string dir = loom::testing::MakeTempDir("loom_queue_files");
  const std::string bad = dir + "/bad.yaml", good = dir + "/good.yaml";
  std::ofstream(bad) << "queues:\n  - name: research\n    nominal_quota: {slots: -1}\n";
  std::ofstream(good) << "priority_classes: {high: 100}\n"
                         "queues:\n  - name: research\n    nominal_quota: {slots: 4}\n"
                         "  - name: closed\n    nominal_quota: {slots: 0}\n";
  {
    home_ = loom::testing::MakeTempDir("loom_cluster_test");
    auto refused = Ctl("local up --workers 1 --queues " + bad);
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_THAT(refused.out + refused.err,
                HasSubstr("--queues: " + bad + ": queues[0].nominal_quota.slots: must be >= 0, "
                          "got -1"));
    Ctl("local down");
  }
  StartCluster(1, 10, "--queues " + good);
  auto submit = [&](const std::string& name, const std::string& scheduling) {
    return Ctl("submit " + WriteSpec(name, 20, 1, "scheduling: " + scheduling + "\n"));
  };
  auto unknown = submit("lost", "{queue: reserch}");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("scheduling.queue: unknown queue \"reserch\""));
  auto no_class = submit("lowly", "{queue: research, priority: urgent}");
  EXPECT_EQ(no_class.exit_code, 1);
  EXPECT_THAT(no_class.err, HasSubstr("scheduling.priority: \"urgent\" is neither an integer"));
  auto accepted = submit("keen", "{queue: research, priority: high}");
  ASSERT_EQ(accepted.exit_code, 0) << accepted.err;
  std::string job(absl::StripAsciiWhitespace(accepted.out));
  ASSERT_EQ(job.rfind("submitted ", 0), 0u) << accepted.out;
  job = job.substr(std::string("submitted ").size());
  EXPECT_EQ(Status(job).spec().scheduling().queue(), "research");
  EXPECT_EQ(Status(job).spec().scheduling().priority(), "high");
  // A queue without quota holds its job back and says so.
  auto held = submit("held", "{queue: closed}");
  ASSERT_EQ(held.exit_code, 0) << held.err;
  const std::string held_id(
      absl::StripAsciiWhitespace(held.out).substr(std::string("submitted ").size()));
  const loom::v1::Job waiting = Status(held_id);
  EXPECT_EQ(waiting.state(), loom::v1::PENDING);
  EXPECT_THAT(waiting.reason(), HasSubstr("over quota")) << waiting.reason();
  auto pending = Ctl("list --pending");
  ASSERT_EQ(pending.exit_code, 0) << pending.err;
  EXPECT_THAT(pending.out, HasSubstr("WAITS FOR"));
  EXPECT_THAT(pending.out, HasSubstr("over quota"));
  EXPECT_THAT(pending.out, HasSubstr(held_id));
  // `loomctl queues` shows the configuration and each queue's jobs.
  auto table = Ctl("queues");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("research"));
  EXPECT_THAT(table.out, HasSubstr("priority classes: high=100"));
  // Who the cluster's token is, and where its console serves.
  auto me = Ctl("whoami");
  ASSERT_EQ(me.exit_code, 0) << me.err;
  EXPECT_THAT(me.out, HasSubstr("(admin, by token)"));
  auto daemons = Ctl("local status");
  EXPECT_THAT(daemons.out, HasSubstr("CONSOLE"));
  EXPECT_THAT(daemons.out, HasSubstr("https://127.0.0.1:"));
  auto listed = Ctl("-o json queues");
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  loom::v1::ListQueuesResponse queues_now;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &queues_now).ok())
      << listed.out;
  std::map<std::string, loom::v1::QueueInfo> by_name;
  for (const auto& q : queues_now.queues()) by_name[q.name()] = q;
  ASSERT_EQ(by_name.count("closed"), 1u) << listed.out;
  EXPECT_EQ(by_name["closed"].nominal_quota().slots(), 0);
  EXPECT_EQ(by_name["closed"].pending_jobs(), 1);
  EXPECT_EQ(by_name["research"].nominal_quota().slots(), 4);
  EXPECT_EQ(by_name["research"].borrowing_limit().slots(), -1);  // unlimited
  EXPECT_EQ(by_name.count("default"), 1u);
  EXPECT_EQ(queues_now.priority_classes().at("high"), 100);

  // SIGHUP with a broken file: reported, the running queues kept.
  auto ctl = cli::ReadReadyFile(home_ + "/run/controller.json");
  ASSERT_TRUE(ctl.ok());
  const int pid = ctl->pid;
  ASSERT_GT(pid, 0);
  std::ofstream(good, std::ios::trunc) << "queues: [oops\n";
  ASSERT_EQ(kill(pid, SIGHUP), 0);
  const std::string log = home_ + "/logs/controller.log";
  auto log_text = [&log]() {
    absl::StatusOr<std::string> text = ReadFile(log);
    return text.ok() ? *text : std::string();
  };
  bool reported = false;
  for (int i = 0; i < 100 && !reported; ++i) {  // bounded: 10 s
    reported = log_text().find("SIGHUP: --queues not reloaded") != std::string::npos;
    if (!reported) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(reported) << log_text();
  EXPECT_EQ(submit("still", "{queue: research}").exit_code, 0);
  // SIGHUP with a good file without `research`: new submits to it are refused.
  std::ofstream(good, std::ios::trunc) << "queues:\n  - name: batch\n";
  ASSERT_EQ(kill(pid, SIGHUP), 0);
  bool reloaded = false;
  for (int i = 0; i < 100 && !reloaded; ++i) {
    reloaded = log_text().find("SIGHUP: reloaded 2 queue(s)") != std::string::npos;
    if (!reloaded) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(reloaded) << log_text();
  auto gone = submit("late", "{queue: research}");
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_THAT(gone.err, HasSubstr("scheduling.queue: unknown queue \"research\" (queues: batch, "
                                  "default)"));
}

// Checkpoint-then-preempt on a real local cluster: a 2-rank
// low-priority job is preempted by a high-priority one mid-interval. Its
// ranks save the step they reached and stop; it waits PREEMPTED, resumes
// from that checkpoint once the preemptor is done, loses 0 steps (no step is
// trained twice), counts no restart, and ends with parameters bitwise equal
// to its uninterrupted run's (SHA-256 of the final checkpoint, loom-ckpt).
// The preemption tests' spec tail: checkpoints every 100 steps, all kept.
constexpr char kPreemptionSpecTail[] =
    "recovery: {disable_spike_detection: true}\n"
    "checkpoint: {interval_steps: 100, keep: 100}\n";

TEST_F(ClusterTest, PreemptedJobSavesResumesAndMatchesItsUninterruptedRunBitwise) {
  ASSERT_NO_FATAL_FAILURE(StartPreemptionCluster(/*grace_s=*/60));
  constexpr int kSteps = 1500;
  const std::string extra = kPreemptionSpecTail;
  const std::string reference = Submit(WriteSpec("uncut", kSteps, 2, extra));
  ASSERT_TRUE(WaitFor([&] { return Status(reference).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(reference).DebugString();
  const std::string want = Digest(CheckpointPathAt(reference, kSteps));
  ASSERT_FALSE(want.empty());

  const std::string job = Submit(WriteSpec("low", kSteps, 2, extra));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 230; }, 120))
      << Status(job).DebugString();
  ASSERT_LT(Status(job).summary().last_step(), kSteps / 2) << "the preemption must land mid-run";
  const std::string urgent =
      Submit(WriteSpec("urgent", 40, 2, "scheduling: {priority: high}\n" + extra));
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::PREEMPTED; }, 60))
      << Status(job).DebugString();
  // (That its ranks stopped is the PREEMPTED event's to say, checked below:
  // a process scan would also see the ranks of the same test on the other
  // store, which ctest runs beside it, under the same job id.)
  ASSERT_TRUE(WaitFor([&] { return Status(urgent).state() == loom::v1::SUCCEEDED; }, 120))
      << Status(urgent).DebugString();
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();

  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 0);
  EXPECT_EQ(done.summary().last_step(), kSteps);
  // One preemption, unless the urgent job's own first attempt could not
  // join its process groups (a rendezvous retry, placed again without a
  // restart): the low job may then be placed in between and preempted once
  // more before it trains a step, which loses nothing.
  const int64_t preemptions = done.preemptions();
  int urgent_placements = 0;
  const loom::v1::Job urgent_done = Status(urgent);
  for (const auto& t : urgent_done.history()) {
    if (t.to() == loom::v1::SCHEDULED) ++urgent_placements;
  }
  EXPECT_TRUE(preemptions == 1 || (preemptions == 2 && urgent_placements > 1))
      << "preemptions " << preemptions << ", urgent placed " << urgent_placements << " time(s)";
  ASSERT_NO_FATAL_FAILURE(ExpectPreemptedStates(done, preemptions));
  // The preemption that saved mid-run: the first of each kind.
  const loom::v1::RecoveryEvent* asked = nullptr;
  const loom::v1::RecoveryEvent* stopped = nullptr;
  const loom::v1::RecoveryEvent* resumed = nullptr;
  for (const auto& e : done.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::PREEMPTING && asked == nullptr) asked = &e;
    if (e.kind() == loom::v1::RecoveryEvent::PREEMPTED) {
      if (stopped == nullptr) {
        stopped = &e;
      } else {
        EXPECT_EQ(e.steps_lost(), 0) << e.message();
        EXPECT_THAT(e.message(), HasSubstr("before its ranks trained a step"));
      }
    }
    if (e.kind() == loom::v1::RecoveryEvent::RESUMED && resumed == nullptr) resumed = &e;
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::RESTART) << e.DebugString();
  }
  ASSERT_NE(asked, nullptr) << done.DebugString();
  ASSERT_NE(stopped, nullptr) << done.DebugString();
  ASSERT_NE(resumed, nullptr) << done.DebugString();
  EXPECT_EQ(resumed->checkpoint_step(), stopped->checkpoint_step());
  EXPECT_EQ(asked->cause(), "priority");
  EXPECT_THAT(asked->message(), HasSubstr(urgent));
  EXPECT_EQ(stopped->steps_lost(), 0) << stopped->message();
  // Saved at the step boundary it reached, past the step reported when
  // asked, and not at an interval's checkpoint (it came mid-interval).
  const int64_t saved = stopped->checkpoint_step();
  EXPECT_GE(saved, asked->step());
  EXPECT_THAT(stopped->message(), HasSubstr("0 steps lost"));
  EXPECT_FALSE(CheckpointPathAt(job, saved).empty()) << "the save at step " << saved;
  // Every step trained once: the second attempt starts right after the save.
  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &steps));
  std::map<int64_t, int> trained;
  for (const auto& m : steps.steps()) {
    if (m.step() > 0) trained[m.step()] += 1;  // (step 0: the initial validation)
  }
  for (const auto& [step, times] : trained) EXPECT_EQ(times, 1) << "step " << step;
  EXPECT_EQ(trained.size(), static_cast<size_t>(kSteps));
  // Bitwise the uninterrupted run's parameters.
  EXPECT_EQ(Digest(CheckpointPathAt(job, kSteps)), want);

  auto events = Ctl("events " + job);
  EXPECT_EQ(events.exit_code, 0) << events.err;
  EXPECT_THAT(events.out, HasSubstr("PREEMPTED"));
  EXPECT_THAT(events.out, HasSubstr("RESUMED"));
  EXPECT_THAT(events.out, HasSubstr(absl::StrCat("preemptions ", preemptions)));
  std::cout << "preemption, loomctl events " << job << ":\n" << events.out << std::endl;
  auto status = Ctl("status " + job);
  std::cout << status.out.substr(status.out.find("goodput")) << std::endl;
  EXPECT_THAT(status.out, ::testing::ContainsRegex("preempted waiting [1-9]"));
  CheckMetrics(controller_metrics_,
               {absl::StrCat("loom_controller_preemptions_total{job_id=\"", job,
                             "\",queue=\"default\",reason=\"priority\"} ", preemptions),
                "loom_controller_jobs{state=\"PREEMPTED\"}"});
}

// A preemption whose save cannot commit within the grace: one rank of the
// victim is frozen (SIGSTOP, as a hung host), so no step boundary is
// reached. After the grace the controller stops the ranks without a save;
// the job loses only the steps after its last checkpoint, says how many,
// counts no restart, and still finishes.
TEST_F(ClusterTest, PreemptionWhoseSaveMissesTheGraceStopsAnywayAndSaysWhatWasLost) {
  ASSERT_NO_FATAL_FAILURE(StartPreemptionCluster(/*grace_s=*/2));
  constexpr int kSteps = 1500;
  const std::string extra = kPreemptionSpecTail;
  const std::string job = Submit(WriteSpec("stuck", kSteps, 2, extra));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 150; }, 120))
      << Status(job).DebugString();
  const std::set<int> ranks = RankPids(job, home_);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(kill(*ranks.begin(), SIGSTOP), 0);
  const int64_t frozen_at = Status(job).summary().last_step();
  const std::string urgent =
      Submit(WriteSpec("urgent", 40, 2, "scheduling: {priority: high}\n" + extra));
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::PREEMPTED; }, 60))
      << Status(job).DebugString();
  for (int pid : ranks) EXPECT_FALSE(loom::testing::ProcessAlive(pid));
  ASSERT_TRUE(WaitFor([&] { return Status(urgent).state() == loom::v1::SUCCEEDED; }, 120))
      << Status(urgent).DebugString();
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 0);
  EXPECT_EQ(done.summary().last_step(), kSteps);
  // One preemption past the grace. (Once, under ctest -j2, the job was
  // placed again before the urgent job started and was preempted a second
  // time before training a step, losing nothing; such extra preemptions
  // are allowed, the one that stopped training is checked.)
  const loom::v1::RecoveryEvent* stopped = nullptr;
  for (const auto& e : done.events()) {
    if (e.kind() != loom::v1::RecoveryEvent::PREEMPTED) continue;
    if (stopped == nullptr) {
      stopped = &e;
    } else {
      EXPECT_THAT(e.message(), HasSubstr("before its ranks trained a step; nothing lost"));
    }
  }
  EXPECT_GE(done.preemptions(), 1);
  if (done.preemptions() > 1) std::cout << Ctl("events " + job).out;
  ASSERT_NE(stopped, nullptr) << done.DebugString();
  EXPECT_THAT(stopped->message(), HasSubstr("without a save (the grace ran out)"));
  // The last step reported before the freeze, less the newest checkpoint
  // the stopped attempt had committed (or a newer in-memory snapshot on its
  // live nodes): the checkpoint is the one at the last multiple of 100 it
  // reached, or the one before if that asynchronous save had not finished
  // when the rank froze (under load it once had not at step 207). The
  // freeze lands at step 150 or later: a loaded machine once trained to
  // step 312 between the status read and the SIGSTOP.
  EXPECT_GE(stopped->step(), frozen_at);
  int64_t committed = 0;
  {
    auto listed = Ctl("-o json checkpoints " + job);
    ASSERT_EQ(listed.exit_code, 0) << listed.err;
    loom::v1::ListCheckpointsResponse catalog;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &catalog).ok());
    for (const auto& c : catalog.checkpoints()) {
      // (The event's generation is the attempt it starts, the next one.)
      if (c.generation() < stopped->generation() && c.step() <= stopped->step()) {
        committed = std::max(committed, c.step());
      }
    }
  }
  const int64_t reached = stopped->step() / 100 * 100;
  EXPECT_TRUE(committed >= 100 && committed % 100 == 0 &&
              (committed == reached || committed == reached - 100))
      << committed << " at step " << stopped->step();
  EXPECT_GE(stopped->checkpoint_step(), committed) << stopped->message();
  EXPECT_LE(stopped->checkpoint_step(), stopped->step()) << stopped->message();
  EXPECT_EQ(stopped->steps_lost(), stopped->step() - stopped->checkpoint_step());
  EXPECT_THAT(stopped->message(),
              HasSubstr(absl::StrCat(stopped->steps_lost(), " step(s) after it are lost")));
  std::cout << "preemption past the grace: " << stopped->message() << std::endl;
}

// An operator drains the node a job trains on: the job saves at its next
// step boundary, stops, waits for room (the other worker is busy with the
// reference run) and resumes on the other node, with no step lost and no
// restart, bitwise equal to its uninterrupted run. The drained node stays
// cordoned across a controller restart until it is uncordoned.
TEST_F(ClusterTest, DrainedJobMovesOffItsNodeLosingNothingAndMatchesItsUninterruptedRun) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2));
  // A step of this model takes about 3 ms: enough of them that the drain,
  // a loomctl call or two away, lands long before the end, even under load.
  constexpr int kSteps = 3000;
  const std::string extra = kPreemptionSpecTail;
  const std::string reference = Submit(WriteSpec("uncut", kSteps, 1, extra));
  const std::string job = Submit(WriteSpec("drained", kSteps, 1, extra));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 120; }, 120))
      << Status(job).DebugString();
  const loom::v1::Job before = Status(job);
  ASSERT_LT(before.summary().last_step(), kSteps / 2) << "the drain must land mid-run";
  ASSERT_EQ(before.ranks_size(), 1);
  const std::string node = before.ranks(0).node();

  auto drained = Ctl("drain " + node + " --deadline 60s --reason 'kernel upgrade'");
  ASSERT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  EXPECT_THAT(drained.out, HasSubstr("saving and moving: " + job));
  auto workers = Ctl("workers");
  EXPECT_THAT(workers.out, HasSubstr("cordoned: " + node +
                                     " takes no new ranks until uncordoned "
                                     "(drained by user 'local': kernel upgrade)"));
  ASSERT_TRUE(WaitFor([&] { return Status(reference).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(reference).DebugString();
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();

  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 0);
  EXPECT_EQ(done.preemptions(), 0);
  const loom::v1::RecoveryEvent* asked = nullptr;
  const loom::v1::RecoveryEvent* moved = nullptr;
  for (const auto& e : done.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::DRAINING) asked = &e;
    if (e.kind() == loom::v1::RecoveryEvent::DRAINED) moved = &e;
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::RESTART) << e.DebugString();
  }
  ASSERT_NE(asked, nullptr) << done.DebugString();
  ASSERT_NE(moved, nullptr) << done.DebugString();
  EXPECT_EQ(asked->cause(), "drain");
  EXPECT_THAT(asked->message(), HasSubstr("by user 'local': kernel upgrade"));
  EXPECT_EQ(moved->steps_lost(), 0) << moved->message();
  EXPECT_GE(moved->checkpoint_step(), asked->step());
  EXPECT_LT(asked->step(), kSteps - 100) << "drained mid-run";
  EXPECT_THAT(moved->message(), HasSubstr("0 steps lost"));
  // Placed again on the other node only.
  int placements_after = 0;
  bool after_drain = false;
  for (const auto& t : done.history()) {
    if (t.reason().find("was drained") != std::string::npos) after_drain = true;
    if (after_drain && t.to() == loom::v1::SCHEDULED) {
      ++placements_after;
      EXPECT_THAT(t.reason(), ::testing::Not(HasSubstr("@" + node))) << t.reason();
    }
  }
  EXPECT_GE(placements_after, 1);
  // Every step trained once, and the parameters are the uninterrupted run's.
  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &steps));
  std::map<int64_t, int> trained;
  for (const auto& m : steps.steps()) {
    if (m.step() > 0) trained[m.step()] += 1;
  }
  for (const auto& [step, times] : trained) EXPECT_EQ(times, 1) << "step " << step;
  EXPECT_EQ(trained.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(Digest(CheckpointPathAt(job, kSteps)), Digest(CheckpointPathAt(reference, kSteps)));
  auto events = Ctl("events " + job);
  std::cout << "drain, loomctl events " << job << ":\n" << events.out << std::endl;

  // The cordon is stored: a restarted controller keeps it, until uncordoned.
  auto restarted = Ctl("local restart controller");
  ASSERT_EQ(restarted.exit_code, 0) << restarted.err;
  ASSERT_TRUE(WaitFor(
      [&] { return Ctl("workers").out.find("cordoned: " + node) != std::string::npos; }, 30))
      << Ctl("workers").out;
  auto back = Ctl("uncordon " + node);
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_THAT(back.out, HasSubstr("takes ranks"));
  EXPECT_THAT(Ctl("workers").out, ::testing::Not(HasSubstr("cordoned: ")));
  auto unknown = Ctl("drain no-such-node");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_THAT(unknown.err, HasSubstr("no worker has registered from node"));
}

TEST_F(ClusterTest, RejectsBadTokensAndBadSpecs) {
  StartCluster(1);
  auto channel = *cli::LocalControllerChannel(home_, controller_);
  auto stub = loom::v1::JobService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    loom::v1::ListJobsResponse resp;
    auto s = stub->ListJobs(&ctx, {}, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer not-the-token");
    loom::v1::ListJobsResponse resp;
    auto s = stub->ListJobs(&ctx, {}, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(), HasSubstr("unknown token"));
  }
  {
    auto wstub = loom::v1::WorkerService::NewStub(channel);
    grpc::ClientContext ctx;
    loom::v1::RegisterWorkerRequest req;
    req.set_node("intruder");
    req.set_address("127.0.0.1");
    req.set_slots(1);
    loom::v1::RegisterWorkerResponse resp;
    EXPECT_EQ(wstub->RegisterWorker(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  for (const auto& [page_size, token, field] :
       std::vector<std::tuple<int, std::string, std::string>>{
           {1001, "", "page_size"}, {-1, "", "page_size"}, {0, "abc", "page_token"},
           {0, "-5", "page_token"}}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    loom::v1::ListJobsRequest req;
    req.set_page_size(page_size);
    req.set_page_token(token);
    loom::v1::ListJobsResponse resp;
    auto s = stub->ListJobs(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(s.error_message(), HasSubstr(field + ":"));
  }
  {
    // The right token works, and a spec that fails validation names the field.
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    loom::v1::SubmitJobRequest req;
    req.mutable_spec()->set_name("bad");
    loom::v1::SubmitJobResponse resp;
    auto s = stub->SubmitJob(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("model"));
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    loom::v1::GetJobRequest req;
    req.set_job_id("nope-1");
    loom::v1::Job job;
    EXPECT_EQ(stub->GetJob(&ctx, req, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    // Health checking needs no token.
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    auto health = grpc::health::v1::Health::NewStub(channel);
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  // loomctl with a wrong token: exit 1 and a one-line reason.
  std::string bad_token = home_ + "/bad-token";
  ASSERT_TRUE(WritePrivateFile(bad_token, "wrong\n").ok());
  auto r = Ctl("--token-file " + bad_token + " list");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
  // loomctl with a mistyped field: exit 1, the field path, nothing submitted.
  std::string spec = WriteSpec("typo", 10, 1);
  std::ofstream(spec, std::ios::app) << "batch_size: 3\n";
  r = Ctl("submit " + spec);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("batch_size"));
  // What a reviewer tried. Paths outside the controller's roots
  // and out-of-range numbers are refused at submit, naming the field.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"checkpoint: {dir: /etc}\n", "checkpoint.dir: /etc is outside"},
      // loomctl resolves it against the spec file's directory first.
      {"checkpoint: {dir: ../../../../../../../../etc}\n", "checkpoint.dir: /etc is outside"},
      {"recovery: {window: 2147483647}\n", "recovery.window: must be 0 (the default) or in"},
      {"recovery: {rollback_distance: 9223372036854775807}\n", "recovery.rollback_distance: "},
      {"skip_batches: [{begin: 200, end: 100}]\n", "skip_batches[0]: [200, 100) is empty or reversed"},
  };
  for (const auto& [extra, want] : refused) {
    std::string bad = WriteSpec("stranger", 10, 1, extra);
    r = Ctl("submit " + bad);
    EXPECT_EQ(r.exit_code, 1) << extra;
    EXPECT_THAT(r.err, HasSubstr(want)) << extra;
  }
  {
    std::string shadow = WriteSpec("shadow", 10, 1);
    std::string text = *ReadFile(shadow);
    text.replace(text.find("[\"data/train_*.bin\"]"), std::string("[\"data/train_*.bin\"]").size(),
                 "[\"/etc/shadow\"]");
    ASSERT_TRUE(WriteFileAtomically(shadow, text).ok());
    r = Ctl("submit " + shadow);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: data.train[0]: /etc/shadow is outside"));
  }
  auto list = Ctl("-o json list");
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_THAT(list.out, ::testing::Not(HasSubstr("typo")));
  EXPECT_THAT(list.out, ::testing::Not(HasSubstr("stranger")));
  EXPECT_THAT(list.out, ::testing::Not(HasSubstr("shadow")));
}

TEST_F(ClusterTest, CancelledJobEndsCancelledAndItsRanksExit) {
  StartCluster(2);
  std::string job = Submit(WriteSpec("long", 1000000, 2));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 2; }, 60))
      << Status(job).DebugString();
  EXPECT_EQ(Status(job).state(), loom::v1::RUNNING);
  EXPECT_EQ(CountRankProcesses("/" + job + "/", home_), 2);
  auto r = Ctl("cancel " + job + " --reason test");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("CANCELLED"));
  EXPECT_EQ(Status(job).state(), loom::v1::CANCELLED);
  EXPECT_TRUE(WaitFor([&] { return CountRankProcesses("/" + job + "/", home_) == 0; }, 20));
  // The slots come back.
  EXPECT_TRUE(WaitFor(
      [&] {
        auto w = Ctl("-o json workers");
        loom::v1::ListWorkersResponse wl;
        if (!google::protobuf::util::JsonStringToMessage(w.out, &wl).ok()) return false;
        for (const auto& x : wl.workers()) {
          if (x.slots_used() != 0) return false;
        }
        return true;
      },
      10));
  auto again = Ctl("cancel " + job);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("FAILED_PRECONDITION"));
}

// A job that asks for a GPU per rank is placed on a worker that reports one
// (--gpus 1), the rank is told its GPU, and on this CPU-only LibTorch it
// fails at once saying why, instead of training on the CPU unasked.
TEST_F(ClusterTest, GpuJobGetsItsGpuAndFailsClearlyWithoutCuda) {
  StartCluster(1, 10, "--gpus 1");
  auto workers = Ctl("-o json workers");
  ASSERT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_THAT(workers.out, HasSubstr("\"gpus\": 1"));
  std::string path = WriteSpec("gpu", 10, 1, "recovery: {max_restarts: 0}\n");
  std::string text = *ReadFile(path);
  const std::string cpu_resources = "resources: {workers: 1, ranks: 1}";
  ASSERT_NE(text.find(cpu_resources), std::string::npos);
  text.replace(text.find(cpu_resources), cpu_resources.size(),
               "resources: {workers: 1, ranks: 1, gpus_per_rank: 1}");
  ASSERT_TRUE(WriteFileAtomically(path, text).ok());
  std::string job = Submit(path);
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::FAILED; }, 60))
      << Status(job).DebugString();
  loom::v1::Job failed = Status(job);
  ASSERT_EQ(failed.ranks_size(), 1);
  EXPECT_EQ(failed.ranks(0).gpu(), 0);
  EXPECT_THAT(failed.reason(), HasSubstr("device: \"cuda:0\""));
  EXPECT_THAT(failed.reason(), HasSubstr("needs CUDA"));
}

TEST_F(ClusterTest, KilledWorkerFailsItsJobWithAReason) {
  StartCluster(2, /*worker_timeout_s=*/2);
  std::string job = Submit(WriteSpec("victim", 1000000, 2, "recovery: {max_restarts: 0}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 2; }, 60));
  int victim = 0;
  for (const auto& d : Daemons()) {
    if (d.name == "worker-1") victim = d.pid;
  }
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::FAILED; }, 30))
      << Status(job).DebugString();
  loom::v1::Job failed = Status(job);
  EXPECT_THAT(failed.reason(), HasSubstr("stopped heartbeating"));
  EXPECT_THAT(failed.reason(), HasSubstr("local-1"));
  EXPECT_TRUE(WaitFor([&] { return CountRankProcesses("/" + job + "/", home_) == 0; }, 20));
}

TEST_F(ClusterTest, KilledWorkerJobRestartsFromCheckpointAndSucceeds) {
  StartCluster(3, /*worker_timeout_s=*/2);
  // Spike detection off: this test is about restarts, and a tiny model's
  // noisy loss must not add a rollback to the history it checks.
  // Long enough that the kill lands mid-run even when the machine is busy:
  // with 120 steps a loaded run once finished before the worker's death
  // mattered (no restart).
  constexpr int kSteps = 400;
  std::string job = Submit(
      WriteSpec("phoenix", kSteps, 2, "recovery: {disable_spike_detection: true}\n"));
  // Past the first checkpoint (step 20).
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().checkpoints_written() >= 1; }, 90))
      << Status(job).DebugString();
  loom::v1::Job running = Status(job);
  ASSERT_EQ(running.ranks_size(), 2);
  std::string victim_node = running.ranks(1).node();  // "local-<i>"
  // `loomctl logs -f` follows rank 0 from before the kill to the end, into
  // the next attempt, and stops by itself when the job is done (bounded by
  // timeout if it did not).
  const std::string follow_out = home_ + "/follow.out";
  auto follower = RunCommand(absl::StrCat("timeout 240 ", kBin, "/loomctl --home ",
                                          ShellQuote(home_), " logs ", job, " -f > ",
                                          ShellQuote(follow_out), " 2>&1 & echo $!"));
  const int follower_pid = std::atoi(follower.out.c_str());
  ASSERT_GT(follower_pid, 0) << follower.err;
  // Rank 1's log reached the controller before its worker dies with it.
  ASSERT_TRUE(WaitFor([&] { return Ctl("logs " + job + " --rank 1").out.find("loom-rank 1/2") !=
                                    std::string::npos; },
                      30));
  ASSERT_NO_FATAL_FAILURE(KillWorkerOnNode(victim_node));

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 180))
      << Status(job).DebugString();
  loom::v1::Job done = Status(job);
  {
    SCOPED_TRACE("loomctl logs");
    ASSERT_TRUE(WaitFor([&] { return !loom::testing::ProcessAlive(follower_pid); }, 30))
        << "logs -f did not end with the job";
    std::ifstream in(follow_out);
    const std::string followed((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    EXPECT_THAT(followed, HasSubstr("loom-rank 0/2"));
    EXPECT_THAT(followed, HasSubstr(absl::StrCat("--- loomctl: rank 0, attempt ",
                                                 done.generation(), " ---")));
    // What the controller holds of the last attempt of rank 0 is what the
    // rank wrote: the end of its log file on its worker.
    auto last = Ctl(absl::StrCat("logs ", job));
    ASSERT_EQ(last.exit_code, 0) << last.err;
    EXPECT_THAT(followed, HasSubstr(last.out));
    // (Worker i, node "local-<i>", works in <home>/workers/<i>.)
    std::string node;
    for (const auto& r : done.ranks()) {
      if (r.rank() == 0) node = r.node();
    }
    ASSERT_FALSE(node.empty()) << done.DebugString();
    std::ifstream f(absl::StrCat(home_, "/workers/", node.substr(node.rfind('-') + 1), "/", job,
                                 "/rank-0.log"));
    const std::string worker_file((std::istreambuf_iterator<char>(f)),
                                  std::istreambuf_iterator<char>());
    ASSERT_FALSE(worker_file.empty()) << "rank 0's log on " << node;
    ASSERT_GE(worker_file.size(), last.out.size());
    EXPECT_EQ(worker_file.substr(worker_file.size() - last.out.size()), last.out);
    // The victim's rank: its first attempt's log, as far as it was shipped.
    auto lost = Ctl(absl::StrCat("logs ", job, " --rank 1 --attempt ", running.generation(),
                                 " --tail 3"));
    ASSERT_EQ(lost.exit_code, 0) << lost.err;
    EXPECT_LE(std::count(lost.out.begin(), lost.out.end(), '\n'), 3) << lost.out;
    EXPECT_FALSE(lost.out.empty());
    // The catalog of logs, and a clear error for a rank without one.
    auto listing = Ctl(absl::StrCat("-o json logs ", job));
    ASSERT_EQ(listing.exit_code, 0) << listing.err;
    loom::v1::GetRankLogResponse catalog;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listing.out, &catalog).ok())
        << listing.out;
    int complete = 0;
    for (const auto& l : catalog.logs()) complete += l.complete() ? 1 : 0;
    EXPECT_GE(catalog.logs_size(), 4) << listing.out;  // 2 ranks x 2 attempts at least
    EXPECT_GE(complete, 2) << listing.out;             // the last attempt's ranks, at least
    auto none = Ctl(absl::StrCat("logs ", job, " --rank 7"));
    EXPECT_EQ(none.exit_code, 1);
    EXPECT_THAT(none.err, HasSubstr("NOT_FOUND: no log of rank 7 of job " + job));
    EXPECT_THAT(none.err, HasSubstr("ranks with logs: 0, 1"));
  }
  int rendezvous_retries = 0;
  const std::vector<loom::v1::JobState> states =
      StatesWithoutRendezvousRetries(done, &rendezvous_retries);
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_EQ(done.generation(), 1 + rendezvous_retries) << done.DebugString();
  EXPECT_EQ(done.summary().last_step(), kSteps);
  const std::vector<loom::v1::RecoveryEvent> recovery = RecoveryEvents(done);
  ASSERT_GE(recovery.size(), 1u);
  EXPECT_EQ(recovery[0].kind(), loom::v1::RecoveryEvent::RESTART);
  EXPECT_THAT(recovery[0].message(), HasSubstr(victim_node));
  for (const auto& r : done.ranks()) EXPECT_NE(r.node(), victim_node);
  EXPECT_THAT(states, ::testing::ElementsAre(loom::v1::PENDING, loom::v1::SCHEDULED,
                                             loom::v1::RUNNING, loom::v1::PENDING,
                                             loom::v1::SCHEDULED, loom::v1::RUNNING,
                                             loom::v1::SUCCEEDED))
      << done.DebugString();
  // The second attempt resumed from a checkpoint instead of step 0: step 1
  // was trained once, and the attempts overlap only after the checkpoint.
  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &steps));
  int step1 = 0, replayed_from = 0;
  int64_t prev = 0;
  for (const auto& m : steps.steps()) {
    step1 += m.step() == 1 ? 1 : 0;
    if (m.step() > 0 && m.step() <= prev && replayed_from == 0) replayed_from = m.step();
    if (m.step() > 0) prev = m.step();
  }
  // Step 1 trained once: the second attempt did not start from scratch. If
  // the first attempt got past its newest checkpoint before the kill, the
  // second replays from there, which must be after the step-20 checkpoint
  // (when the kill came right at a checkpoint, nothing is replayed).
  EXPECT_EQ(step1, 1);
  if (replayed_from != 0) {
    EXPECT_GE(replayed_from, 21) << "the restart resumed from the step-20 checkpoint or later";
  }
  auto events = Ctl("events " + job);
  EXPECT_EQ(events.exit_code, 0) << events.err;
  EXPECT_THAT(events.out, HasSubstr("RESTART"));
}

// Honest checkpoints, through the real binaries: the catalog
// tells pruned from committed; `loomctl checkpoints --verify` finds a flipped
// byte (which file, which check); a job resuming from that directory reports
// the corrupt checkpoint, falls back to the next good one and succeeds; and
// a job whose every checkpoint is corrupt fails with that reason, its
// restarts unspent.
TEST_F(ClusterTest, CorruptCheckpointIsReportedVerifiedAndSkipped) {
  StartCluster(1);
  const std::string dir = home_ + "/checkpoints/shared-ckpt";
  auto extra = [](const std::string& checkpoint_dir) {
    return absl::StrCat("recovery: {disable_spike_detection: true, max_restarts: 3}\n",
                        "checkpoint: {dir: \"", checkpoint_dir, "\", interval_steps: 20, keep: 2}\n");
  };
  std::string spec = WriteSpec("honest", 60, 1, extra(dir));
  auto r = Ctl("submit --follow " + spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_THAT(r.out, HasSubstr("SUCCEEDED"));

  auto listed = Ctl("-o json checkpoints honest-1");
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  loom::v1::ListCheckpointsResponse catalog;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &catalog).ok()) << listed.out;
  std::map<int64_t, std::string> status;
  for (const auto& c : catalog.checkpoints()) status[c.step()] = c.status();
  EXPECT_EQ(status, (std::map<int64_t, std::string>{
                        {20, "pruned"}, {40, "committed"}, {60, "committed"}}));

  // One byte of the newest shard flipped: --verify says which file failed
  // which check, and exits 1.
  const std::string shard = dir + "/step-000000060/shard-00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(5000);
    char c;
    f.get(c);
    f.seekp(5000);
    f.put(static_cast<char>(c ^ 0x08));
  }
  auto verified = Ctl("checkpoints honest-1 --verify");
  EXPECT_EQ(verified.exit_code, 1) << verified.out << verified.err;
  EXPECT_THAT(verified.out, HasSubstr("step 60: " + shard + " failed its crc32c check"));
  EXPECT_THAT(verified.out, HasSubstr("verified: 1 of 3 catalogued checkpoint(s) corrupt"));
  EXPECT_EQ(Ctl("checkpoints honest-1 --bogus").exit_code, 2);

  // A longer job over the same directory resumes: it reports step 60
  // corrupt, resumes from step 40, and finishes.
  std::string longer = WriteSpec("longer", 80, 1, extra(dir));
  r = Ctl("submit --follow " + longer);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
  loom::v1::Job job = Status("longer-2");
  const std::vector<loom::v1::RecoveryEvent> recovery = RecoveryEvents(job);
  ASSERT_GE(recovery.size(), 1u) << job.DebugString();
  EXPECT_EQ(recovery[0].kind(), loom::v1::RecoveryEvent::CHECKPOINT_CORRUPT);
  EXPECT_THAT(recovery[0].message(), HasSubstr(shard));
  EXPECT_THAT(recovery[0].message(), HasSubstr("crc32c"));
  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics("longer-2", &steps));
  ASSERT_GT(steps.steps_size(), 0);
  int64_t first = 0;
  for (const auto& m : steps.steps()) {
    if (m.step() > 0) {
      first = m.step();
      break;
    }
  }
  EXPECT_EQ(first, 41) << "resumed from the step-40 checkpoint";

  // Only corrupt checkpoints: the job fails at once with the reason, and
  // no restart is spent on it.
  const std::string bad_dir = home_ + "/checkpoints/bad-ckpt";
  std::filesystem::create_directories(bad_dir);
  std::filesystem::copy(dir + "/step-000000080", bad_dir + "/step-000000080",
                        std::filesystem::copy_options::recursive);
  std::filesystem::resize_file(bad_dir + "/step-000000080/MANIFEST.json", 100);
  std::string doomed = WriteSpec("doomed", 100, 1, extra(bad_dir));
  r = Ctl("submit --follow " + doomed);
  EXPECT_NE(r.exit_code, 0) << r.out;
  job = Status("doomed-3");
  EXPECT_EQ(job.state(), loom::v1::FAILED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.reason(), HasSubstr("verifies"));
  EXPECT_THAT(job.reason(), HasSubstr("manifest_crc32c"));
  auto doomed_catalog = Ctl("checkpoints doomed-3");
  EXPECT_EQ(doomed_catalog.exit_code, 0);
  EXPECT_THAT(doomed_catalog.out, HasSubstr("MANIFEST.json failed its manifest_crc32c check"));
}

// Kill -9 of the controller mid-job, restarted within the
// workers' lease (`loomctl local restart controller`, same address): the
// ranks keep training, the workers register again with them, the controller
// re-adopts them, and the job finishes with no restart (max_restarts 0:
// any restart would fail it), every step reported once and every checkpoint
// in the catalog, including those made while the controller was down.
TEST_F(ClusterTest, ControllerKilledMidJobAndRestartedWithinTheGraceLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, /*worker_timeout_s=*/10));
  constexpr int kSteps = 1200;  // ~10 s here: still running when the controller is back
  std::string job = Submit(WriteSpec(
      "steady", kSteps, 2,
      "recovery: {disable_spike_detection: true, max_restarts: 0}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 10; }, 90))
      << Status(job).DebugString();
  ASSERT_LT(Status(job).summary().last_step(), kSteps) << "the kill must land mid-run";
  int controller_pid = 0;
  for (const auto& d : Daemons()) {
    if (d.name == "controller") controller_pid = d.pid;
  }
  ASSERT_GT(controller_pid, 0);
  ASSERT_EQ(kill(controller_pid, SIGKILL), 0);
  // Down for 3 s of the 10 s lease: steps (and maybe a checkpoint) are made
  // and their reports wait in the workers.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(CountRankProcesses(job, home_), 2) << "the ranks train on without the controller";
  auto restarted = Ctl("local restart controller");
  ASSERT_EQ(restarted.exit_code, 0) << restarted.out << restarted.err;
  EXPECT_THAT(restarted.out, HasSubstr("grpc " + controller_));  // the same address

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 180))
      << Status(job).DebugString();
  loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 0);
  // No new attempt but those placed again after a rendezvous failure at the
  // start (no step lost, no restart counted; a loaded machine may see one,
  // likely what a fresh-Debian run saw once: generation 1 with 0 restarts
  // and no RESTART event).
  int rendezvous_retries = 0;
  StatesWithoutRendezvousRetries(done, &rendezvous_retries);
  EXPECT_EQ(done.generation(), rendezvous_retries) << done.DebugString();
  EXPECT_EQ(done.summary().last_step(), kSteps);
  bool readopted = false;
  for (const auto& e : done.events()) {
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::RESTART) << e.DebugString();
    readopted |= e.kind() == loom::v1::RecoveryEvent::READOPTED;
  }
  EXPECT_TRUE(readopted) << done.DebugString();
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStepOnceAndEveryCheckpoint(job, kSteps));
}

// Past the grace: the controller stays down longer than the workers' lease,
// so they kill their ranks; once it is back the job restarts exactly once,
// from its newest checkpoint, and succeeds.
TEST_F(ClusterTest, ControllerDownPastTheGraceRestartsTheJobOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, /*worker_timeout_s=*/3));
  // Enough steps that the ranks cannot finish within the lease after the
  // kill: with 400, a fresh Debian chroot (faster BLAS kernels than this
  // VM's) trained the rest inside the 3 s and the job succeeded with no
  // restart.
  constexpr int kSteps = 2500;
  std::string job = Submit(WriteSpec(
      "patient", kSteps, 2, "recovery: {disable_spike_detection: true, max_restarts: 1}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().checkpoints_written() >= 1; }, 90))
      << Status(job).DebugString();
  int controller_pid = 0;
  for (const auto& d : Daemons()) {
    if (d.name == "controller") controller_pid = d.pid;
  }
  ASSERT_GT(controller_pid, 0);
  ASSERT_EQ(kill(controller_pid, SIGKILL), 0);
  // The workers' lease (3 s) runs out: their ranks are killed.
  EXPECT_TRUE(WaitFor([&] { return CountRankProcesses(job, home_) == 0; }, 30));
  auto restarted = Ctl("local restart controller");
  ASSERT_EQ(restarted.exit_code, 0) << restarted.out << restarted.err;

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 180))
      << Status(job).DebugString();
  loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 1);
  // One more attempt per rendezvous retry, which counts no restart.
  EXPECT_GE(done.generation(), 1);
  EXPECT_EQ(done.summary().last_step(), kSteps);
  int restarts = 0;
  for (const auto& e : done.events()) {
    if (e.kind() != loom::v1::RecoveryEvent::RESTART) continue;
    ++restarts;
    EXPECT_EQ(e.cause(), "controller_restart");
  }
  EXPECT_EQ(restarts, 1);
  // The second attempt resumed from a checkpoint, not from scratch: step 1
  // was trained once.
  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &steps));
  int step1 = 0;
  for (const auto& m : steps.steps()) step1 += m.step() == 1 ? 1 : 0;
  EXPECT_EQ(step1, 1);
  // At least one worker killed its rank when its lease ran out (the other
  // rank may have failed first, on its lost peer).
  std::string logs;
  for (const char* w : {"worker-0", "worker-1"}) {
    auto log = ReadFile(absl::StrCat(home_, "/logs/", w, ".log"));
    ASSERT_TRUE(log.ok());
    logs += *log;
  }
  EXPECT_THAT(logs, HasSubstr("lease expired"));
}

// A whole host frozen past the lease, as a paused VM is: the controller,
// the worker and its rank stop for longer than the lease (5 s) and the
// worker's RPC deadline (5 s), with one of the worker's heartbeats in
// flight to the stopped controller, and resume together. The controller
// does not count its own pause as the worker's silence, and the worker,
// finding its lease run out, sends one last heartbeat before killing
// anything: the controller answers it, so the rank trains on and the job
// ends with no restart. (Before, the worker killed its rank on waking and
// the job restarted for nothing.)
TEST_F(ClusterTest, HostFrozenPastTheLeaseResumesWithoutARestart) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1, /*worker_timeout_s=*/5));
  constexpr int kSteps = 2500;
  const std::string job = Submit(WriteSpec(
      "paused-vm", kSteps, 1, "recovery: {disable_spike_detection: true, max_restarts: 1}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 10; }, 90))
      << Status(job).DebugString();
  ASSERT_LT(Status(job).summary().last_step(), kSteps / 2) << "the freeze must land mid-run";
  int controller_pid = 0;
  int worker_pid = 0;
  for (const auto& d : Daemons()) {
    if (d.name == "controller") controller_pid = d.pid;
    if (d.name == "worker-0") worker_pid = d.pid;
  }
  ASSERT_GT(controller_pid, 0);
  ASSERT_GT(worker_pid, 0);
  const std::set<int> ranks = RankPids(job, home_);
  ASSERT_EQ(ranks.size(), 1u);
  // Whatever fails below, nothing stays stopped.
  struct Thaw {
    std::vector<int> pids;
    ~Thaw() {
      for (int pid : pids) kill(pid, SIGCONT);
    }
  } thaw{{controller_pid, worker_pid, *ranks.begin()}};
  ASSERT_EQ(kill(controller_pid, SIGSTOP), 0);
  // The worker heartbeats every 0.5 s: one is now waiting on the stopped
  // controller (its deadline passes during the freeze).
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ASSERT_EQ(kill(worker_pid, SIGSTOP), 0);
  ASSERT_EQ(kill(*ranks.begin(), SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::seconds(7));
  // The host resumes (the controller first: a VM's processes resume at
  // once, and the worker must find it serving).
  ASSERT_EQ(kill(controller_pid, SIGCONT), 0);
  ASSERT_EQ(kill(worker_pid, SIGCONT), 0);
  ASSERT_EQ(kill(*ranks.begin(), SIGCONT), 0);

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 0) << done.DebugString();
  for (const auto& e : done.events()) {
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::RESTART) << e.DebugString();
  }
  int rendezvous_retries = 0;
  StatesWithoutRendezvousRetries(done, &rendezvous_retries);
  EXPECT_EQ(done.generation(), rendezvous_retries) << done.DebugString();
  EXPECT_EQ(done.summary().last_step(), kSteps);
  auto log = ReadFile(absl::StrCat(home_, "/logs/worker-0.log"));
  ASSERT_TRUE(log.ok());
  EXPECT_THAT(*log, HasSubstr("lease renewed by a last heartbeat"));
  EXPECT_THAT(*log, ::testing::Not(HasSubstr("lease expired")));
}

// Partition: the controller and two workers each in a network
// namespace of their own; the worker running a job is cut off from the
// controller with iptables (both directions dropped, as a dead switch port
// would). Its ranks train on for the lease (3 s) and then its worker kills
// them; the controller waits out lease + margin since it last heard from
// that worker and restarts the job, once, on the other worker from the
// newest checkpoint. Healing the partition does not revive the old attempt:
// its buffered reports are refused as stale. No committed checkpoint is
// lost or overwritten (every one in the catalog verifies), and the final
// parameters are bitwise those of an uninterrupted run of the same spec.
TEST_F(ClusterTest, PartitionedWorkerStopsItsRanksAndTheJobResumesElsewhereBitExactly) {
  ASSERT_NO_FATAL_FAILURE(StartNetnsCluster(2, /*worker_timeout_s=*/3, /*slots=*/2));
  constexpr int kSteps = 1500;
  const std::string extra =
      "resources: {workers: 1, ranks: 2}\n"
      "recovery: {disable_spike_detection: true, max_restarts: 2}\n"
      "checkpoint: {interval_steps: 50, keep: 100}\n";
  auto spec = [&](const std::string& name) {
    std::string path = WriteSpec(name, kSteps, 1, extra);
    // WriteSpec's resources line is replaced by extra's.
    std::string text = *ReadFile(path);
    text.erase(text.find("resources: {workers: 1, ranks: 1}\n"),
               std::string("resources: {workers: 1, ranks: 1}\n").size());
    EXPECT_TRUE(WriteFileAtomically(path, text).ok());
    return path;
  };
  // The uninterrupted run.
  const std::string reference = Submit(spec("uncut"));
  ASSERT_TRUE(WaitFor([&] { return Status(reference).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(reference).DebugString();
  const std::string reference_path = CheckpointPathAt(reference, kSteps);
  ASSERT_FALSE(reference_path.empty());
  const std::string want = Digest(reference_path);

  const std::string job = Submit(spec("cut"));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().checkpoints_written() >= 2; }, 120))
      << Status(job).DebugString();
  loom::v1::Job running = Status(job);
  ASSERT_EQ(running.ranks_size(), 2);
  ASSERT_LT(running.summary().last_step(), kSteps / 2) << "the cut must land mid-run";
  const std::string node = running.ranks(0).node();  // "local-<i>"
  const int victim = std::stoi(node.substr(node.rfind('-') + 1));
  const std::set<int> old_ranks = RankPids(job, home_);
  ASSERT_EQ(old_ranks.size(), 2u);
  ASSERT_TRUE(lab_->Cut(victim + 1, 0).ok());
  std::cout << "partition: cut worker-" << victim << " (" << lab_->address(victim + 1)
            << ") from the controller at step " << running.summary().last_step() << std::endl;

  // The lease runs out: the cut-off worker kills its ranks itself.
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int pid : old_ranks) {
          if (loom::testing::ProcessAlive(pid)) return false;
        }
        return true;
      },
      60));
  // The job restarts on the other worker: a later attempt than the cut one.
  // (Not "generation >= 1": a rendezvous retry before the first step also
  // counts an attempt, and one CI run had it, so the cut attempt itself,
  // still RUNNING on the cut worker until its lease ran out at the
  // controller, passed for the restarted one.)
  ASSERT_TRUE(WaitFor(
      [&] {
        loom::v1::Job j = Status(job);
        return j.generation() > running.generation() && j.state() == loom::v1::RUNNING &&
               j.summary().last_step() > 0 && j.ranks_size() == 2;
      },
      60))
      << Status(job).DebugString();
  const loom::v1::Job moved = Status(job);
  for (const auto& r : moved.ranks()) EXPECT_NE(r.node(), node);
  // Heal while the new attempt runs: the old worker comes back (registers
  // again) with its buffered, stale reports, and nothing of the old attempt
  // revives.
  ASSERT_TRUE(lab_->Heal(victim + 1, 0).ok());
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_EQ(done.summary().last_step(), kSteps);
  int restarts = 0;
  for (const auto& e : done.events()) restarts += e.kind() == loom::v1::RecoveryEvent::RESTART;
  EXPECT_EQ(restarts, 1) << done.DebugString();
  // It finished where it moved to, unless a later attempt was placed again
  // without a restart (a rendezvous retry, which a ctest -j2 run once
  // placed on the healed worker).
  if (done.generation() == moved.generation()) {
    for (const auto& r : done.ranks()) EXPECT_NE(r.node(), node);
  } else {
    for (const auto& t : done.history()) std::cout << "  " << t.ShortDebugString() << "\n";
  }
  for (int pid : old_ranks) EXPECT_FALSE(loom::testing::ProcessAlive(pid));
  EXPECT_TRUE(RankPids(job, home_).empty());

  // Bitwise the uninterrupted run's parameters.
  const std::string final_path = CheckpointPathAt(job, kSteps);
  ASSERT_FALSE(final_path.empty());
  EXPECT_EQ(Digest(final_path), want);
  // Every checkpoint either attempt committed is in the catalog, committed
  // (keep: 100 prunes none), and verifies.
  auto verified = Ctl("checkpoints --verify " + job);
  EXPECT_EQ(verified.exit_code, 0) << verified.out << verified.err;
  auto listed = Ctl("-o json checkpoints " + job);
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  loom::v1::ListCheckpointsResponse catalog;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &catalog).ok());
  std::set<int64_t> at;
  for (const auto& c : catalog.checkpoints()) {
    at.insert(c.step());
    EXPECT_EQ(c.status(), "committed") << c.DebugString();
    EXPECT_TRUE(std::filesystem::exists(c.path())) << c.path();
  }
  for (int step = 50; step <= kSteps; step += 50) EXPECT_TRUE(at.count(step)) << step;
  // The healed worker is back, serving.
  auto workers = Ctl("workers");
  EXPECT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_THAT(workers.out, HasSubstr(node));
  auto worker_log = ReadFile(absl::StrCat(home_, "/logs/worker-", victim, ".log"));
  ASSERT_TRUE(worker_log.ok());
  EXPECT_THAT(*worker_log, HasSubstr("lease expired"));
  auto events = Ctl("events " + job);
  EXPECT_EQ(events.exit_code, 0) << events.err;
  std::cout << "partition trial, loomctl events " << job << ":\n" << events.out << std::endl;
}

// The split brain, with the lease out of the way: a worker and its
// ranks freeze (SIGSTOP, as a long GC pause or a hung host would), so the
// worker cannot kill them when its lease runs out. The controller restarts
// the job on the other worker; once that attempt has claimed the checkpoint
// directory, the old ranks thaw (the worker stays frozen) and train on
// toward their next checkpoint. The directory's fence refuses that commit:
// the old rank 0 stops with exit 77, having committed, pruned and removed
// nothing, and the job finishes with one restart and a catalog whose every
// checkpoint verifies.
TEST_F(ClusterTest, FrozenAttemptThawedAfterARestartIsFencedOffTheCheckpointDirectory) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, /*worker_timeout_s=*/2, "--slots 2"));
  // Long enough that the job is far from done when it is frozen: on a
  // loaded machine the asynchronous checkpoints trail the steps (one full
  // ctest run reached step 418 before two checkpoints were recorded).
  constexpr int kSteps = 1200;
  std::string path = WriteSpec("frozen", kSteps, 1,
                               "recovery: {disable_spike_detection: true, max_restarts: 2}\n"
                               "checkpoint: {interval_steps: 10, keep: 100}\n");
  std::string text = *ReadFile(path);
  const std::string one = "resources: {workers: 1, ranks: 1}\n";
  text.replace(text.find(one), one.size(), "resources: {workers: 1, ranks: 2}\n");
  ASSERT_TRUE(WriteFileAtomically(path, text).ok());
  const std::string job = Submit(path);
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().checkpoints_written() >= 2; }, 120))
      << Status(job).DebugString();
  const loom::v1::Job running = Status(job);
  ASSERT_EQ(running.ranks_size(), 2);
  ASSERT_LT(running.summary().last_step(), kSteps / 2);
  const std::string node = running.ranks(0).node();
  const std::string worker = "worker-" + node.substr(node.rfind('-') + 1);
  int worker_pid = 0;
  for (const auto& d : Daemons()) {
    if (d.name == worker) worker_pid = d.pid;
  }
  ASSERT_GT(worker_pid, 0);
  const std::set<int> old_ranks = RankPids(job, home_);
  ASSERT_EQ(old_ranks.size(), 2u);
  // Freeze them outside the directory's fence lock. A rank frozen while it
  // holds the lock (every commit runs under it, and with checkpoints every
  // 10 steps that is often) keeps the next attempt from ever claiming the
  // directory: flock on one machine's file system has no lease. That is
  // not what this test is about, and it failed so once (the new attempt
  // RUNNING, its claim never written). Holding the lock here, no rank is
  // inside it; one waiting for it stays waiting, frozen.
  const std::string lock_path = running.spec().checkpoint().dir() + "/FENCE.lock";
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(lock_fd, 0) << lock_path;
  ASSERT_EQ(flock(lock_fd, LOCK_EX), 0);
  ASSERT_EQ(kill(worker_pid, SIGSTOP), 0);
  for (int pid : old_ranks) ASSERT_EQ(kill(pid, SIGSTOP), 0);
  flock(lock_fd, LOCK_UN);
  close(lock_fd);
  // Thaw the workers in every case, so that local down can stop them.
  struct Thaw {
    std::vector<int> pids;
    ~Thaw() {
      for (int pid : pids) kill(pid, SIGCONT);
    }
  } thaw{{worker_pid}};

  // The new attempt runs elsewhere and has claimed the directory.
  ASSERT_TRUE(WaitFor(
      [&] {
        loom::v1::Job j = Status(job);
        // A later attempt than the frozen one (which may itself be attempt
        // 1 after a rendezvous retry).
        if (j.generation() <= running.generation() || j.state() != loom::v1::RUNNING) {
          return false;
        }
        auto fence = ReadFile(running.spec().checkpoint().dir() + "/FENCE");
        return fence.ok() && absl::EndsWith(*fence, absl::StrCat("\n", j.generation(), "\n"));
      },
      // Lease expiry, a new placement, a rendezvous and the claim: ~20 s
      // alone, past 60 s once on a loaded 2-core machine.
      150))
      << Status(job).DebugString();
  for (int pid : old_ranks) ASSERT_EQ(kill(pid, SIGCONT), 0);
  // The old rank 0 reaches its next save and is refused (it exits; a
  // zombie until its frozen worker reaps it).
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int pid : old_ranks) {
          if (loom::testing::ProcessAlive(pid)) return false;
        }
        return true;
      },
      60));
  ASSERT_EQ(kill(worker_pid, SIGCONT), 0);
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.summary().last_step(), kSteps);
  EXPECT_GE(done.restarts(), 1);
  auto rank_log = ReadFile(absl::StrCat(home_, "/workers/", node.substr(node.rfind('-') + 1),
                                        "/", job, "/rank-0.log"));
  ASSERT_TRUE(rank_log.ok());
  EXPECT_THAT(*rank_log, HasSubstr(absl::StrCat("is fenced: attempt ", running.generation(), " of job '", job, "'")));
  ASSERT_TRUE(WaitFor(
      [&] {
        auto log = ReadFile(absl::StrCat(home_, "/logs/", worker, ".log"));
        return log.ok() && absl::StrContains(*log, "(code 77");
      },
      30));
  // Every checkpoint in the catalog is there and verifies; none of the new
  // attempt's was replaced by the old one's.
  auto verified = Ctl("checkpoints --verify " + job);
  EXPECT_EQ(verified.exit_code, 0) << verified.out << verified.err;
  auto listed = Ctl("-o json checkpoints " + job);
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  loom::v1::ListCheckpointsResponse catalog;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &catalog).ok());
  for (const auto& c : catalog.checkpoints()) {
    EXPECT_TRUE(c.status() == "committed" || c.status() == "pruned") << c.DebugString();
  }
}

// A TP2 x PP2 job survives kill -9 of a worker holding one of
// its stages: it restarts from its newest checkpoint on the remaining
// workers and replays the lost steps bit for bit (every step reported by
// both attempts has the same loss).
// Elastic jobs on a real local cluster: a 3-rank elastic job
// loses a worker (kill -9 of its daemon, and the rank with it). The
// controller re-plans it for the two workers left (the same global batch,
// now over 2 data-parallel ranks) and it resumes from its newest checkpoint
// under that layout, no restart counted. The worker comes back: the job
// saves at its next step boundary, stops, and grows back to 3 ranks. Its
// losses after each re-plan follow the uninterrupted 3-rank run's: only the
// reduction order differs (1e-5 relative for the first 20 steps after a
// re-plan, 1% later).
TEST_F(ClusterTest, ElasticJobShrinksWhenAWorkerIsLostAndGrowsBackWhenItReturns) {
  const std::string queues = loom::testing::MakeTempDir("loom_elastic") + "/queues.yaml";
  std::ofstream(queues) << "preemption: {min_run_time_seconds: 0}\n";
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, /*worker_timeout_s=*/2, "--queues " + queues));
  // Long enough that the job still trains when the worker is back and it
  // grows (about 9 s after the kill here; it ends some 15 s after that).
  constexpr int kSteps = 4500;
  auto spec = [&](const std::string& name, bool elastic) {
    const std::string path = absl::StrCat(home_, "/", name, ".yaml");
    std::ofstream(path) << "name: " << name << R"(
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data:
  train: ["data/train_*.bin"]
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )"
                        << kSteps << R"(, warmup_steps: 5}
batch: {global_batch: 12, micro_batch: 2}
resources: {workers: 3, ranks: 3}
checkpoint: {interval_steps: 50, keep: 100}
recovery: {disable_spike_detection: true}
seed: 9
)" << (elastic ? "elastic: {min_ranks: 1, max_ranks: 3}\n" : "");
    return path;
  };
  const std::string reference = Submit(spec("whole", false));
  ASSERT_TRUE(WaitFor([&] { return Status(reference).state() == loom::v1::SUCCEEDED; }, 300))
      << Status(reference).DebugString();
  const std::string job = Submit(spec("elastic", true));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 120; }, 120))
      << Status(job).DebugString();
  loom::v1::Job running = Status(job);
  ASSERT_EQ(running.ranks_size(), 3);
  ASSERT_LT(running.summary().last_step(), kSteps / 4) << "the kill must land early";
  const std::string victim_node = running.ranks(2).node();
  const auto killed_at = std::chrono::steady_clock::now();
  const int64_t killed_ms = absl::ToUnixMillis(absl::Now());
  ASSERT_NO_FATAL_FAILURE(KillWorkerOnNode(victim_node));
  // Shrunk: running on the two workers left.
  ASSERT_TRUE(WaitFor(
      [&] {
        const loom::v1::Job j = Status(job);
        return j.layout_generation() == 1 && j.state() == loom::v1::RUNNING && j.ranks_size() == 2;
      },
      60))
      << Status(job).DebugString();
  const double shrink_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_LT(Status(job).summary().last_step(), kSteps * 3 / 4) << "room left to grow";
  // The worker comes back (as a rebooted node would): the job grows back.
  const std::string daemon = "worker-" + victim_node.substr(victim_node.rfind('-') + 1);
  auto restarted = Ctl("local restart " + daemon);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.out << restarted.err;
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 300))
      << Status(job).DebugString();

  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 0);
  EXPECT_EQ(done.preemptions(), 0);
  EXPECT_EQ(done.layout_generation(), 2) << done.DebugString();
  EXPECT_EQ(done.summary().last_step(), kSteps);
  EXPECT_EQ(done.ranks_size(), 3);
  std::vector<const loom::v1::RecoveryEvent*> replans;
  for (const auto& e : done.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::REPLANNED) replans.push_back(&e);
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::RESTART) << e.DebugString();
  }
  ASSERT_EQ(replans.size(), 2u) << done.DebugString();
  EXPECT_EQ(replans[0]->cause(), "worker_lost");
  EXPECT_THAT(replans[0]->from_layout(), HasSubstr("dp 3"));
  EXPECT_THAT(replans[0]->to_layout(), HasSubstr("dp 2"));
  EXPECT_GT(replans[0]->predicted_step_seconds(), 0);
  EXPECT_EQ(replans[1]->cause(), "capacity_returned");
  EXPECT_THAT(replans[1]->to_layout(), HasSubstr("dp 3"));
  EXPECT_EQ(replans[1]->steps_lost(), 0) << replans[1]->message();

  // The losses after each re-plan (the last report of each step) against
  // the uninterrupted run's.
  auto losses = [&](const std::string& id) {
    loom::v1::GetStepMetricsResponse steps;
    GetStepMetrics(id, &steps);
    std::map<int64_t, double> out;
    for (const auto& m : steps.steps()) {
      if (m.step() > 0) out[m.step()] = m.loss();
    }
    return out;
  };
  const std::map<int64_t, double> want = losses(reference);
  const std::map<int64_t, double> got = losses(job);
  EXPECT_EQ(got.size(), static_cast<size_t>(kSteps));
  double first20 = 0, later = 0;
  for (const auto& [step, loss] : got) {
    if (step <= replans[0]->checkpoint_step()) continue;
    ASSERT_EQ(want.count(step), 1u) << step;
    const double rel = std::abs(loss - want.at(step)) / std::abs(want.at(step));
    bool near_a_replan = false;
    for (const auto* r : replans) {
      near_a_replan |= step > r->checkpoint_step() && step <= r->checkpoint_step() + 20;
    }
    double& worst = near_a_replan ? first20 : later;
    worst = std::max(worst, rel);
  }
  std::printf(
      "elastic: shrank 3 -> 2 ranks %.1f s after the kill (resumed from step %lld), grew "
      "back to 3 (resumed from step %lld); loss max rel diff %.3g within 20 steps of a "
      "re-plan, %.3g elsewhere\n",
      shrink_s, static_cast<long long>(replans[0]->checkpoint_step()),
      static_cast<long long>(replans[1]->checkpoint_step()), first20, later);
  EXPECT_LE(first20, 1e-5);
  EXPECT_LE(later, 1e-2);
  // `loomctl steps` names each record's attempt and layout generation.
  auto listed = Ctl("-o json steps " + job);
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  loom::v1::GetStepMetricsResponse records;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &records).ok());
  std::set<int> layouts;
  std::set<std::pair<int64_t, int64_t>> step_attempts;
  for (const auto& m : records.steps()) {
    layouts.insert(m.layout_generation());
    EXPECT_TRUE(step_attempts.insert({m.step(), m.generation()}).second)
        << "step " << m.step() << " recorded twice by attempt " << m.generation();
  }
  EXPECT_EQ(layouts, (std::set<int>{0, 1, 2}));
  // Time to recover from the loss, in parts: from the re-plan (the
  // controller declaring the worker lost) to the new gang's placement, its
  // ranks running, the checkpoint loaded and its first step started.
  {
    const int64_t replanned_ms = replans[0]->time_unix_ms();
    int64_t placed_ms = 0, running_ms = 0;
    for (const auto& t : done.history()) {
      if (t.time_unix_ms() < replanned_ms) continue;
      if (t.to() == loom::v1::SCHEDULED && placed_ms == 0) placed_ms = t.time_unix_ms();
      if (t.to() == loom::v1::RUNNING && running_ms == 0) running_ms = t.time_unix_ms();
    }
    const loom::v1::StepMetrics* first = nullptr;
    for (const auto& m : records.steps()) {
      if (m.layout_generation() == 1 && (first == nullptr || m.step() < first->step())) first = &m;
    }
    ASSERT_NE(first, nullptr);
    const double first_step_start_s =
        (first->time_unix_ms() - replanned_ms) / 1000.0 - first->step_time_seconds();
    std::printf(
        "elastic recovery: the kill to the re-plan %.1f s (lease and failure settling); "
        "then placed %.2f s, ranks running %.2f s, checkpoint loaded in %.3f s, first "
        "step started %.2f s after the re-plan\n",
        (replanned_ms - killed_ms) / 1000.0, (placed_ms - replanned_ms) / 1000.0,
        (running_ms - replanned_ms) / 1000.0, first->checkpoint_restore_seconds(),
        first_step_start_s);
  }
  // Every data batch of the committed trajectory trained exactly once,
  // across both layout changes.
  auto ledger = Ctl("steps " + job + " --ledger");
  EXPECT_EQ(ledger.exit_code, 0) << ledger.out << ledger.err;
  EXPECT_THAT(ledger.out, HasSubstr(absl::StrCat(
                              kSteps, " committed step(s) trained data batches 0..", kSteps - 1,
                              " under 3 layout(s): 0 skipped, 0 "
                              "duplicated")));
  std::cout << ledger.out;
  auto table = Ctl("steps " + job + " --last 3");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("LAYOUT"));
  EXPECT_THAT(table.out, HasSubstr(absl::StrCat(kSteps)));
  auto events = Ctl("events " + job);
  EXPECT_EQ(events.exit_code, 0) << events.err;
  EXPECT_THAT(events.out, HasSubstr("REPLANNED"));
  std::cout << "elastic, loomctl events " << job << ":\n" << events.out << std::endl;
}

// A rank slowed by a CPU quota on a cgroup the test makes (its worker and
// the worker's rank processes moved in) is named by the controller within a
// few step reports and shown by `loomctl diagnose`; with
// recovery.slow_rank.action "cordon" its node is cordoned and the elastic
// job saves, re-plans without it and goes on: nothing lost, no restart.
TEST_F(ClusterTest, SlowRankIsNamedItsNodeCordonedAndTheElasticJobShrinksAwayFromIt) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, /*worker_timeout_s=*/10));
  const std::string path = home_ + "/slow.yaml";
  std::ofstream(path) << R"(name: slow
model:
  gpt: {n_layer: 4, n_head: 4, d_model: 128, seq_len: 64, vocab_size: 256}
data:
  train: ["data/train_*.bin"]
optimizer:
  adamw: {lr: 0.001, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 100000, warmup_steps: 5}
batch: {global_batch: 12, micro_batch: 2}
resources: {workers: 3, ranks: 3}
checkpoint: {interval_steps: 50, keep: 3}
recovery:
  disable_spike_detection: true
  slow_rank: {action: cordon, cordon_seconds: 600}
elastic: {min_ranks: 1, max_ranks: 3}
seed: 5
)";
  const std::string job = Submit(path);
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 60; }, 120))
      << Status(job).DebugString();
  // Tokens per second reported by an attempt, median of its last `n` steps.
  auto throughput = [&](int layout_generation, int n) {
    loom::v1::GetStepMetricsResponse steps;
    GetStepMetrics(job, &steps);
    std::vector<double> tps;
    for (const auto& m : steps.steps()) {
      if (m.step() > 0 && m.layout_generation() == layout_generation) {
        tps.push_back(m.tokens_per_second());
      }
    }
    if (tps.size() > static_cast<size_t>(n)) tps.erase(tps.begin(), tps.end() - n);
    std::sort(tps.begin(), tps.end());
    return tps.empty() ? 0.0 : tps[tps.size() / 2];
  };
  const double healthy = throughput(0, 40);
  loom::v1::Job before = Status(job);
  ASSERT_EQ(before.ranks_size(), 3);
  for (const auto& e : before.events()) {
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::SLOW_RANK)
        << "a healthy rank named slow: " << e.message();
  }
  // Rank 1's worker (and its rank) get 15% of one CPU.
  std::string victim_node;
  for (const auto& a : before.ranks()) {
    if (a.rank() == 1) victim_node = a.node();
  }
  const std::string daemon = "worker-" + victim_node.substr(victim_node.rfind('-') + 1);
  int worker_pid = 0;
  for (const auto& d : Daemons()) {
    if (d.name == daemon) worker_pid = d.pid;
  }
  ASSERT_GT(worker_pid, 0) << daemon;
  auto slow = loom::testing::CpuQuotaGroup::Create("loom-slow-rank", 0.15);
  ASSERT_TRUE(slow.ok()) << slow.status();
  ASSERT_TRUE((*slow)->Add(worker_pid).ok());
  for (int child : loom::testing::ChildPids(worker_pid)) {
    ASSERT_TRUE((*slow)->Add(child).ok()) << child;
  }
  const int64_t slowed_step = Status(job).summary().last_step();
  const int64_t slowed_ms = absl::ToUnixMillis(absl::Now());

  std::optional<loom::v1::RecoveryEvent> named;
  loom::v1::Job j;
  ASSERT_TRUE(WaitFor(
      [&] {
        j = Status(job);
        for (const auto& e : j.events()) {
          if (e.kind() == loom::v1::RecoveryEvent::SLOW_RANK) named = e;
        }
        return named.has_value();
      },
      60))
      << j.DebugString();
  EXPECT_EQ(named->rank(), 1) << named->message();
  EXPECT_EQ(named->cause(), "slow_rank");
  EXPECT_GE(named->slowdown(), 1.5);
  EXPECT_GT(named->value(), named->baseline());
  EXPECT_THAT(named->message(), HasSubstr("node " + victim_node + " is cordoned"));
  const int64_t detect_steps = named->step() - slowed_step;
  const double detect_s = (named->time_unix_ms() - slowed_ms) / 1000.0;
  // Shrunk away from it: two ranks, none on the cordoned node.
  ASSERT_TRUE(WaitFor(
      [&] {
        j = Status(job);
        return j.layout_generation() == 1 && j.state() == loom::v1::RUNNING && j.ranks_size() == 2;
      },
      90))
      << j.DebugString();
  for (const auto& a : j.ranks()) EXPECT_NE(a.node(), victim_node);
  const int64_t resumed_at = j.summary().last_step();
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= resumed_at + 60; }, 120));
  const double after = throughput(1, 40);
  j = Status(job);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.preemptions(), 0);
  const loom::v1::RecoveryEvent* replan = nullptr;
  for (const auto& e : j.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::REPLANNED) replan = &e;
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::RESTART) << e.DebugString();
  }
  ASSERT_NE(replan, nullptr);
  EXPECT_EQ(replan->cause(), "slow_rank");
  EXPECT_EQ(replan->steps_lost(), 0) << replan->message();
  EXPECT_THAT(replan->to_layout(), HasSubstr("dp 2"));
  std::printf(
      "slow rank: named %lld step(s) and %.1f s after the quota (%.2fx its peers, z %.1f); "
      "throughput healthy %.0f tok/s, after shrinking away %.0f tok/s (%.2f)\n",
      static_cast<long long>(detect_steps), detect_s, named->slowdown(), named->score(), healthy,
      after, healthy > 0 ? after / healthy : 0.0);
  EXPECT_GT(after, 0);

  auto diagnose = Ctl("diagnose " + job);
  EXPECT_EQ(diagnose.exit_code, 0) << diagnose.err;
  EXPECT_THAT(diagnose.out, HasSubstr("slow ranks (1)"));
  EXPECT_THAT(diagnose.out, HasSubstr("rank 1 computes"));
  std::cout << diagnose.out;
  auto workers = Ctl("workers");
  EXPECT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_THAT(workers.out, HasSubstr("cordoned: " + victim_node));
  auto events = Ctl("events " + job);
  std::cout << events.out;
  auto cancel = Ctl("cancel " + job);
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
}

// recovery.slow_rank.action "replan": a pipeline stage whose worker gets 25%
// of a CPU is named slow; the job saves, stops and resumes on the same
// workers with that stage given fewer blocks, losing no step, and its losses
// stay with an uninterrupted run's (the same model, split otherwise).
TEST_F(ClusterTest, SlowPipelineStageIsReplannedWithFewerBlocks) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, /*worker_timeout_s=*/10));
  constexpr int kSteps = 700;
  auto spec = [&](const std::string& name, bool replan) {
    const std::string path = absl::StrCat(home_, "/", name, ".yaml");
    std::ofstream(path) << "name: " << name << R"(
model:
  gpt: {n_layer: 4, n_head: 4, d_model: 128, seq_len: 64, vocab_size: 256}
data:
  train: ["data/train_*.bin"]
optimizer:
  adamw: {lr: 0.001, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )"
                        << kSteps << R"(, warmup_steps: 5}
batch: {global_batch: 12, micro_batch: 2}
resources: {workers: 2, ranks: 2}
parallelism: {data: 1, tensor: 1, pipeline: 2}
checkpoint: {interval_steps: 50, keep: 3}
seed: 5
recovery:
  disable_spike_detection: true
)" << (replan ? "  slow_rank: {action: replan}\n" : "  slow_rank: {disabled: true}\n");
    return path;
  };
  const std::string reference = Submit(spec("even", false));
  ASSERT_TRUE(WaitFor([&] { return Status(reference).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(reference).DebugString();
  const std::string job = Submit(spec("resplit", true));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 60; }, 120))
      << Status(job).DebugString();
  loom::v1::Job before = Status(job);
  std::string slow_node;
  int slow_stage = -1;
  for (const auto& a : before.ranks()) {
    if (a.rank() == 1) {
      slow_node = a.node();
      slow_stage = a.pp();
    }
  }
  ASSERT_EQ(slow_stage, 1);
  const std::string daemon = "worker-" + slow_node.substr(slow_node.rfind('-') + 1);
  int worker_pid = 0;
  for (const auto& d : Daemons()) {
    if (d.name == daemon) worker_pid = d.pid;
  }
  ASSERT_GT(worker_pid, 0);
  // The worker and the ranks it starts stay slow for the rest of the run:
  // a quarter of a CPU, so that the stage is slow even when other tests
  // load the machine (a ctest -j2 run with 40% named it only 600 steps on).
  auto slow = loom::testing::CpuQuotaGroup::Create("loom-slow-stage", 0.25);
  ASSERT_TRUE(slow.ok()) << slow.status();
  ASSERT_TRUE((*slow)->Add(worker_pid).ok());
  for (int child : loom::testing::ChildPids(worker_pid)) ASSERT_TRUE((*slow)->Add(child).ok());
  const int64_t slowed_step = Status(job).summary().last_step();

  loom::v1::Job j;
  ASSERT_TRUE(WaitFor(
      [&] {
        j = Status(job);
        return j.layout_generation() == 1 && j.state() == loom::v1::RUNNING;
      },
      180))
      << j.DebugString();
  std::optional<loom::v1::RecoveryEvent> named, replan;
  for (const auto& e : j.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::SLOW_RANK) named = e;
    if (e.kind() == loom::v1::RecoveryEvent::REPLANNED) replan = e;
  }
  ASSERT_TRUE(named.has_value() && replan.has_value()) << j.DebugString();
  EXPECT_EQ(named->rank(), 1);
  EXPECT_EQ(replan->cause(), "slow_rank");
  EXPECT_EQ(replan->steps_lost(), 0);
  EXPECT_THAT(replan->from_layout(), HasSubstr("stages 2+2 blocks"));
  EXPECT_THAT(replan->to_layout(), HasSubstr("stages 3+1 blocks"));
  int replans = 0;
  for (const auto& a : j.ranks()) {
    if (a.node() == slow_node) EXPECT_EQ(a.pp(), 1) << "placed as before";
  }
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  j = Status(job);
  EXPECT_EQ(j.restarts(), 0);
  // Once re-split, the stages' unequal work is not taken for a slow rank.
  for (const auto& e : j.events()) replans += e.kind() == loom::v1::RecoveryEvent::REPLANNED;
  EXPECT_EQ(replans, 1) << Ctl("events " + job).out;
  EXPECT_EQ(j.layout_generation(), 1);
  // Throughput: healthy, slowed, and re-split (medians of each stretch).
  loom::v1::GetStepMetricsResponse steps;
  GetStepMetrics(job, &steps);
  std::vector<double> healthy, slowed, resplit;
  for (const auto& m : steps.steps()) {
    if (m.step() <= 10) continue;
    if (m.layout_generation() == 1) {
      resplit.push_back(m.tokens_per_second());
    } else if (m.step() < slowed_step) {
      healthy.push_back(m.tokens_per_second());
    } else if (m.step() > slowed_step + 2) {
      slowed.push_back(m.tokens_per_second());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  // Losses against the even split's, step by step.
  std::map<int64_t, double> want, got;
  loom::v1::GetStepMetricsResponse ref_steps;
  GetStepMetrics(reference, &ref_steps);
  for (const auto& m : ref_steps.steps()) want[m.step()] = m.loss();
  for (const auto& m : steps.steps()) got[m.step()] = m.loss();
  double worst = 0;
  for (const auto& [step, loss] : got) {
    if (step <= 0) continue;
    ASSERT_EQ(want.count(step), 1u) << step;
    worst = std::max(worst, std::abs(loss - want.at(step)) / std::abs(want.at(step)));
  }
  std::printf(
      "slow stage: quota at step %lld, named at step %lld (%.2fx); re-split %s -> %s; "
      "throughput healthy %.0f, slowed %.0f, re-split %.0f tok/s; loss max rel diff %.3g "
      "against the even split\n",
      static_cast<long long>(slowed_step), static_cast<long long>(named->step()), named->slowdown(),
      replan->from_layout().c_str(), replan->to_layout().c_str(), median(healthy), median(slowed),
      median(resplit), worst);
  EXPECT_LE(worst, 1e-2);
  std::cout << Ctl("events " + job).out;
}

TEST_F(ClusterTest, KilledWorkerTensorPipelineJobResumesBitExactly) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, /*worker_timeout_s=*/2, "--slots 2"));
  const std::string path = absl::StrCat(home_, "/tp-pp.yaml");
  std::ofstream(path) << R"(name: tp-pp
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data:
  train: ["data/train_*.bin"]
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 100, warmup_steps: 5}
batch: {global_batch: 8, micro_batch: 2}
resources: {workers: 2, ranks: 4}
parallelism: {data: 1, tensor: 2, pipeline: 2}
checkpoint: {interval_steps: 20, keep: 2}
recovery: {disable_spike_detection: true}
seed: 5
)";
  const std::string job = Submit(path);
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().checkpoints_written() >= 1; }, 120))
      << Status(job).DebugString();
  loom::v1::Job running = Status(job);
  ASSERT_EQ(running.ranks_size(), 4);
  // The worker of the second pipeline stage (ranks 2 and 3).
  std::string victim_node;
  for (const auto& r : running.ranks()) {
    if (r.pp() == 1) victim_node = r.node();
  }
  ASSERT_NO_FATAL_FAILURE(KillWorkerOnNode(victim_node));

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_EQ(done.summary().last_step(), 100);
  for (const auto& r : done.ranks()) EXPECT_NE(r.node(), victim_node);

  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &steps));
  std::map<int64_t, std::vector<double>> losses;
  for (const auto& m : steps.steps()) {
    if (m.step() > 0) losses[m.step()].push_back(m.loss());
  }
  EXPECT_EQ(losses[1].size(), 1u) << "the restart resumed from a checkpoint, not from scratch";
  int replayed = 0;
  for (const auto& [step, seen] : losses) {
    for (double loss : seen) EXPECT_EQ(loss, seen[0]) << "step " << step << " differs on replay";
    replayed += seen.size() > 1 ? 1 : 0;
  }
  std::printf("TP2xPP2 restart: %d step(s) replayed, each with the first attempt's loss\n",
              replayed);
}

// A Llama-family model (grouped-query attention, SwiGLU,
// RMSNorm, rotary positions, untied embeddings) trains data-parallel on two
// workers, its stored spec shows the Llama defaults, MFU is reported, and
// after a worker is killed it resumes from a checkpoint replaying every
// step with the first attempt's loss.
TEST_F(ClusterTest, LlamaJobTrainsDataParallelAndResumesBitExactly) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, /*worker_timeout_s=*/2));
  // BPE tokens (a SentencePiece model trained on the text).
  auto prepared = Ctl(absl::StrCat(
      "data prepare --input /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/literature"
      " --out ", home_, "/bpe --tokenizer bpe --vocab-size 512"));
  ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
  const std::string path = absl::StrCat(home_, "/llama.yaml");
  std::ofstream(path) << R"(name: llama
model:
  llama: {n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 32, seq_len: 32, vocab_size: 512}
data:
  train: ["bpe/train_*.bin"]
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 400, warmup_steps: 5}
batch: {global_batch: 8, micro_batch: 4}
resources: {workers: 2, ranks: 2}
checkpoint: {interval_steps: 20, keep: 2}
recovery: {disable_spike_detection: true}
seed: 9
)";
  const std::string job = Submit(path);
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().checkpoints_written() >= 1; }, 120))
      << Status(job).DebugString();
  loom::v1::Job running = Status(job);
  ASSERT_EQ(running.ranks_size(), 2);
  const loom::v1::GptModel& model = running.spec().model().llama();
  EXPECT_TRUE(model.mlp().gated());
  EXPECT_EQ(model.mlp().hidden(), 128);  // 8/3 x 32 rounded up to 64
  EXPECT_EQ(model.positions(), loom::v1::GptModel::ROTARY);
  EXPECT_EQ(model.norm(), loom::v1::GptModel::RMSNORM);
  const std::string victim_node = running.ranks(1).node();
  ASSERT_NO_FATAL_FAILURE(KillWorkerOnNode(victim_node));

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_EQ(done.summary().last_step(), 400);

  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &steps));
  std::map<int64_t, std::vector<double>> losses;
  double mfu = 0;
  for (const auto& m : steps.steps()) {
    if (m.step() > 0) losses[m.step()].push_back(m.loss());
    mfu = std::max(mfu, m.mfu());
  }
  EXPECT_GT(mfu, 0) << "the Llama model's FLOPs come from the shared model description";
  EXPECT_LE(mfu, 1.0) << "a step faster than the calibration raises the peak, not the MFU";
  EXPECT_EQ(losses[1].size(), 1u) << "the restart resumed from a checkpoint, not from scratch";
  ASSERT_EQ(losses.size(), 400u);
  EXPECT_LT(losses[400][0], losses[1][0]) << "it learned";
  int replayed = 0;
  for (const auto& [step, seen] : losses) {
    for (double loss : seen) EXPECT_EQ(loss, seen[0]) << "step " << step << " differs on replay";
    replayed += seen.size() > 1 ? 1 : 0;
  }
  std::printf("Llama DP2 restart: %d step(s) replayed, each with the first attempt's loss; "
              "loss %.4f -> %.4f\n",
              replayed, losses[1][0], losses[400][0]);

  // Text out: the newest checkpoint continues a prompt, decoded with the BPE
  // model beside the shards; the same seed gives the same text.
  auto sample = Ctl(absl::StrCat("sample ", job, " --prompt 'The ' --tokens 24 --seed 7"));
  ASSERT_EQ(sample.exit_code, 0) << sample.err;
  EXPECT_THAT(sample.out, ::testing::StartsWith("The "));
  EXPECT_GT(sample.out.size(), 8u);
  EXPECT_THAT(sample.err, HasSubstr("step 400"));
  EXPECT_THAT(sample.err, HasSubstr("24 generated (bpe tokenizer)"));
  auto again = Ctl(absl::StrCat("sample ", job, " --prompt 'The ' --tokens 24 --seed 7"));
  EXPECT_EQ(again.out, sample.out);
  std::printf("sample: %s", sample.out.c_str());
  auto missing = Ctl(absl::StrCat("sample ", job, " --prompt x --step 7"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no committed checkpoint at step 7; committed: "));

  // Weights out: Hugging Face's layout, read by the independent reader
  // (tests/export/hf_logits.py; the logits check itself is
  // loom_hf_export_test).
  const std::string hf = absl::StrCat(home_, "/hf");
  auto exported = Ctl(absl::StrCat("export ", job, " --out ", hf));
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_THAT(exported.out, HasSubstr("exported step 400 as Hugging Face llama"));
  auto read = loom::testing::RunCommand(absl::StrCat(
      "/usr/bin/python3 ", LOOM_SOURCE_DIR, "/tests/export/hf_logits.py ", hf, " 3 17 42"));
  ASSERT_EQ(read.exit_code, 0) << read.err;
  EXPECT_THAT(read.out, ::testing::StartsWith("llama\n"));
  EXPECT_EQ(loom::testing::RunCommand(absl::StrCat("cmp ", hf, "/tokenizer.model ", home_,
                                                   "/bpe/tokenizer.model"))
                .exit_code,
            0);

  // The job as pictures, opened by a real browser (Debian's chromium,
  // headless): every chart has data points (the page's own count, after its
  // script ran), the console shows no error, and a screenshot is written
  // under the build tree.
  const std::string report = absl::StrCat(home_, "/report.html");
  auto wrote = Ctl(absl::StrCat("report ", job, " --out ", report));
  ASSERT_EQ(wrote.exit_code, 0) << wrote.err;
  const std::string profile = absl::StrCat(home_, "/chromium-profile");
  const std::string chromium = absl::StrCat(
      "timeout 120 chromium --headless=new --no-sandbox --disable-gpu --no-first-run "
      "--disable-extensions --user-data-dir=", profile, " --enable-logging=stderr --v=1 ");
  auto dom = RunCommand(absl::StrCat(chromium, "--dump-dom file://", report));
  ASSERT_EQ(dom.exit_code, 0) << dom.err.substr(0, 2000);
  const size_t at = dom.out.find("id=\"self-check\"");
  ASSERT_NE(at, std::string::npos) << dom.out.substr(0, 3000);
  const std::string tag = dom.out.substr(at, 200);
  std::smatch check;
  ASSERT_TRUE(std::regex_search(tag, check,
                                std::regex("id=\"self-check\" data-charts=\"(\\d+)\" "
                                           "data-points=\"(\\d+)\" data-empty=\"(\\d+)\"")))
      << tag;
  EXPECT_EQ(check[1], "7") << "charts";
  EXPECT_GT(std::stoi(check[2]), 7 * 100) << "points";
  EXPECT_EQ(check[3], "0") << "charts without data";
  // The page logs nothing: any console message (an error, an uncaught
  // exception, a refused fetch) is a defect.
  for (absl::string_view line : absl::StrSplit(dom.err, '\n')) {
    EXPECT_FALSE(absl::StrContains(line, ":CONSOLE")) << line;
  }
  const std::string screenshot = std::string(kBin) + "/../report-screenshot.png";
  auto shot = RunCommand(absl::StrCat(chromium, "--hide-scrollbars --window-size=1000,2900 "
                                                "--screenshot=", screenshot, " file://", report));
  ASSERT_EQ(shot.exit_code, 0) << shot.err.substr(0, 2000);
  auto size = RunCommand(absl::StrCat("stat -c %s ", screenshot));
  EXPECT_GT(std::stol(size.out), 20000) << "a screenshot of seven charts is not tiny";
  std::printf("report: %s; screenshot %s (%s bytes)\n", check[0].str().c_str(),
              screenshot.c_str(), std::string(absl::StripAsciiWhitespace(size.out)).c_str());
}

// TLS on the controller's port: loomctl and workers connect with the CA,
// and a plaintext client is refused.
TEST(TlsTest, ControllerServesTlsWhenGivenACertificate) {
  std::string dir = loom::testing::MakeTempDir("loom_tls_test");
  auto gen = RunCommand(absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ", dir, "/key.pem -out ", dir,
      "/cert.pem"));
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  ASSERT_TRUE(WritePrivateFile(dir + "/token", "s3cret\n").ok());
  ASSERT_TRUE(WritePrivateFile(dir + "/worker-token", "w0rkers\n").ok());
  ASSERT_TRUE(WritePrivateFile(dir + "/users", controller::UsersFileLine(
                                                   "ops", controller::Role::kAdmin, "s3cret"))
                  .ok());
  std::string ready = dir + "/controller.json";
  std::string cmd = absl::StrCat(kBin, "/loom-controller --listen=127.0.0.1:0 --data_dir=", dir,
                                 "/data --users_file=", dir, "/users --worker_token_file=", dir,
                                 "/worker-token --ready_file=", ready, " --tls_cert=", dir,
                                 "/cert.pem --tls_key=", dir, "/key.pem > ", dir,
                                 "/controller.log 2>&1 & echo $!");
  auto started = RunCommand(cmd);
  int pid = atoi(started.out.c_str());
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(WaitFor([&] { return cli::ReadReadyFile(ready).ok(); }, 20));
  std::string address = cli::ReadReadyFile(ready)->grpc_address;
  std::string base = absl::StrCat(kBin, "/loomctl --home ", dir, " --controller ", address,
                                  " --token-file ", dir, "/token");
  auto ok = RunCommand(base + " --tls-ca " + dir + "/cert.pem list");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("ID"));
  auto plain = RunCommand(base + " --plaintext list");
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_THAT(plain.err, HasSubstr("UNAVAILABLE"));
  // TLS is the default: without the CA, the self-signed certificate is
  // not trusted.
  auto untrusted = RunCommand(base + " list");
  EXPECT_EQ(untrusted.exit_code, 1);
  EXPECT_THAT(untrusted.err, HasSubstr("UNAVAILABLE"));
  kill(pid, SIGTERM);
  EXPECT_TRUE(WaitFor([&] { return !loom::testing::ProcessAlive(pid); }, 10));
}

// PaLM-style recovery, end to end and untouched by humans: a region of the
// data order is replaced by random bytes, the loss spikes there, the
// controller rolls back to a checkpoint and skips the region, and the run
// ends bitwise identical to a run from scratch told to skip that range.
// PaLM-style recovery end to end, under `layout` (the spec's
// resources and parallelism): poisoned data batches [60, 64) make a spike;
// the controller rolls back to the step-40 checkpoint and skips them; a
// replay from scratch with the recorded skip list ends with the same
// parameters bit for bit.
void ClusterTest::SpikeRollsBackSkipsAndMatchesAReplay(const std::string& layout,
                                                       const std::string& cluster_flags) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, 10, cluster_flags));
  constexpr int kSeqLen = 32, kGlobalBatch = 16, kPoisonBegin = 60, kPoisonEnd = 64;
  constexpr uint64_t kSeed = 7;
  // Poison every sample of data batches [60, 64) in the data order.
  ASSERT_NO_FATAL_FAILURE(
      PoisonDataBatches(kPoisonBegin, kPoisonEnd, kSeqLen, kGlobalBatch, kSeed));

  // keep: 10 keeps every checkpoint of the 100 steps: with keep: 2 the
  // ranks keep the step-40 target only until they pass step 90, and on a
  // fast idle machine this toy job's ranks can get that far before the
  // stop reaches them (tests/deploy/prometheus_test.sh failed so once).
  const std::string common = R"(recovery: {window: 32, min_history: 16, rollback_distance: 20,
           skip_before: 10, skip_after: 10, max_rollbacks: 2, max_restarts: 0}
)";
  auto spec = [&](const std::string& name, const std::string& extra) {
    std::string path = absl::StrCat(home_, "/", name, ".yaml");
    std::ofstream out(path);
    out << "name: " << name << R"(
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data: {train: ["data/train_*.bin"]}
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 100, warmup_steps: 5}
batch: {global_batch: 16, micro_batch: 8}
checkpoint: {interval_steps: 10, keep: 10}
seed: 7
)" << layout << common << extra;
    return path;
  };

  auto r = Ctl("submit --follow " + spec("spiky", ""));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  loom::v1::Job recovered = Status("spiky-1");
  ASSERT_EQ(recovered.state(), loom::v1::SUCCEEDED);
  EXPECT_EQ(recovered.rollbacks(), 1);
  EXPECT_EQ(recovered.restarts(), 0);
  const std::vector<loom::v1::RecoveryEvent> recovery = RecoveryEvents(recovered);
  ASSERT_EQ(recovery.size(), 2u) << recovered.DebugString();
  const auto& spike = recovery[0];
  const auto& rollback = recovery[1];
  EXPECT_EQ(spike.kind(), loom::v1::RecoveryEvent::SPIKE);
  EXPECT_EQ(spike.step(), kPoisonBegin + 1) << "step 61 trains data batch 60, the first poisoned";
  EXPECT_GT(spike.score(), 6.0);
  EXPECT_EQ(rollback.kind(), loom::v1::RecoveryEvent::ROLLBACK);
  EXPECT_EQ(rollback.resume_step(), 40) << "the newest checkpoint at or before 61 - 20";
  EXPECT_LE(rollback.skip().begin(), kPoisonBegin);
  EXPECT_GE(rollback.skip().end(), kPoisonEnd);
  EXPECT_EQ(recovered.summary().last_step(), 100);
  EXPECT_THAT(r.out, HasSubstr("ROLLBACK"));

  // The replay: from scratch, same seed and layout, the recovered run's skip list.
  std::string skip = absl::StrCat("skip_batches: [{begin: ", rollback.skip().begin(),
                                  ", end: ", rollback.skip().end(), "}]\n");
  r = Ctl("submit --follow " + spec("replay", skip));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  loom::v1::Job replay = Status("replay-2");
  ASSERT_EQ(replay.state(), loom::v1::SUCCEEDED);
  EXPECT_EQ(RecoveryEvents(replay).size(), 0u) << "no spike: the poison is skipped";

  auto digest = RunCommand(absl::StrCat(kBin, "/loom-ckpt digest ",
                                        recovered.summary().last_checkpoint(), " ",
                                        replay.summary().last_checkpoint()));
  ASSERT_EQ(digest.exit_code, 0) << digest.err;
  std::vector<std::string> lines = absl::StrSplit(digest.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  std::string a = lines[0].substr(0, 64), b = lines[1].substr(0, 64);
  EXPECT_EQ(a, b) << "final parameters differ:\n" << digest.out;
}

TEST_F(ClusterTest, LossSpikeRollsBackSkipsAndMatchesAReplay) {
  SpikeRollsBackSkipsAndMatchesAReplay("resources: {workers: 2, ranks: 2}\n", "");
}

// The same under tensor x pipeline parallelism (2 micro-batches
// through 2 stages, each split over 2 tensor ranks).
TEST_F(ClusterTest, LossSpikeUnderTensorPipelineRollsBackAndMatchesAReplay) {
  SpikeRollsBackSkipsAndMatchesAReplay(
      "resources: {workers: 2, ranks: 4}\nparallelism: {data: 1, tensor: 2, pipeline: 2}\n",
      "--slots 2");
}

// The planner in the controller: workers report their measured GEMM rate, the
// Plan RPC plans on the live cluster, parallelism.auto is planned and stored
// at submit, and a layout that cannot fit is refused with the reason.
TEST_F(ClusterTest, PlansOnTheLiveClusterAndStoresTheAutoPlan) {
  StartCluster(2);
  auto workers = Ctl("-o json workers");
  ASSERT_EQ(workers.exit_code, 0) << workers.err;
  loom::v1::ListWorkersResponse wl;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(workers.out, &wl).ok());
  ASSERT_EQ(wl.workers_size(), 2);
  for (const auto& w : wl.workers()) {
    EXPECT_GT(w.gemm_flops_per_second_per_thread(), 1e8) << w.DebugString();
    EXPECT_GT(w.memory_bandwidth_bytes_per_second(), 1e8) << w.DebugString();
    EXPECT_THAT(w.gemm_source(), HasSubstr("sgemm"));
  }

  std::string spec = WriteSpec("auto", 30, 2, "parallelism: {auto: true}\n");
  // `loomctl plan SPEC` without --topology asks the controller.
  auto plan = Ctl("plan " + spec + " --top 3");
  ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("Cluster: 2 x 1 cpu"));
  EXPECT_THAT(plan.out, HasSubstr("2 live worker(s), measured GEMM"));
  auto plan_json = Ctl("-o json plan " + spec + " --executable-only");
  ASSERT_EQ(plan_json.exit_code, 0) << plan_json.err;
  loom::v1::PlanResponse planned;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(plan_json.out, &planned).ok())
      << plan_json.out;
  EXPECT_TRUE(planned.topology_measured());
  EXPECT_EQ(planned.chosen().data(), 2);
  EXPECT_EQ(planned.chosen().tensor(), 1);
  EXPECT_TRUE(planned.chosen().fits());
  EXPECT_GT(planned.chosen().tokens_per_second(), 0);
  EXPECT_GT(planned.chosen().weights_bytes(), 0);

  // parallelism.auto: planned at submit, the degrees recorded, and it trains.
  auto r = Ctl("submit --follow " + spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  loom::v1::Job job = Status("auto-1");
  EXPECT_EQ(job.state(), loom::v1::SUCCEEDED);
  ASSERT_TRUE(job.has_plan());
  EXPECT_TRUE(job.plan().auto_());
  EXPECT_TRUE(job.plan().topology_measured());
  EXPECT_EQ(job.plan().layout().data(), 2);
  EXPECT_EQ(job.spec().parallelism().data(), 2);
  EXPECT_EQ(job.spec().parallelism().tensor(), 1);
  auto status = Ctl("status auto-1");
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("chosen (parallelism.auto) on 2 x 1 cpu"));
  EXPECT_THAT(status.out, HasSubstr("tp 1 | pp 1 | dp 2"));

  // A 7B-parameter model's training state (~112 GB) fits no worker here.
  std::string big = absl::StrCat(home_, "/big.yaml");
  std::ofstream(big) << R"(name: big
model:
  gpt: {n_layer: 32, n_head: 32, d_model: 4096, seq_len: 2048, vocab_size: 256}
data: {train: ["data/train_*.bin"]}
optimizer: {adamw: {lr: 0.0003}}
schedule: {total_steps: 10}
batch: {global_batch: 2, micro_batch: 1}
resources: {workers: 2, ranks: 2}
)";
  r = Ctl("submit " + big);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: parallelism.data: layout tp 1 | pp 1 | dp 2"));
  EXPECT_THAT(r.err, HasSubstr("GB per device before activations"));
  auto list = Ctl("-o json list");
  EXPECT_THAT(list.out, ::testing::Not(HasSubstr("\"big-")));
}

// Each worker lends its 2 ranks 2.16 GiB; the planner keeps a
// 1 GB + 5% reserve per rank, leaving ~100 MB per rank. The 12.6M-parameter
// model's fp32 AdamW state is 16 bytes a parameter, 201 MB replicated, so
// pure data parallelism is refused; parallelism.auto picks the fastest
// layout that fits (tensor x pipeline here, 50 MB a rank and 38 MB of
// checkpoint staging, ahead of ZeRO),
// places every tensor-parallel group inside one worker, and trains it.
TEST_F(ClusterTest, AutoSplitsAModelThatDataParallelismCannotHoldAndTrainsIt) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, 10, "--slots 2 --memory 2.16"));
  std::string path = absl::StrCat(home_, "/split.yaml");
  std::ofstream(path) << R"(name: split
model:
  gpt: {n_layer: 4, n_head: 8, d_model: 512, seq_len: 64, vocab_size: 256}
data:
  train: ["data/train_*.bin"]
  validation: ["data/val_*.bin"]
optimizer:
  adamw: {lr: 0.001, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 6, warmup_steps: 2, eval_batches: 2}
batch: {global_batch: 4, micro_batch: 1}
resources: {workers: 2, ranks: 4}
parallelism: {auto: true}
checkpoint: {interval_steps: 3, keep: 2}
seed: 11
)";
  // Pure data parallelism over the 4 ranks does not fit.
  const std::string dp_path = absl::StrCat(home_, "/split-dp.yaml");
  {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("parallelism: {auto: true}"), 25, "parallelism: {data: 4}");
    text.replace(text.find("name: split"), 11, "name: split-dp");
    std::ofstream(dp_path) << text;
  }
  auto dp = Ctl("submit " + dp_path);
  EXPECT_EQ(dp.exit_code, 1) << dp.out;
  EXPECT_THAT(dp.err, HasSubstr("parallelism.data: layout tp 1 | pp 1 | dp 4"));
  EXPECT_THAT(dp.err, HasSubstr("does not fit"));

  auto r = Ctl("submit --follow " + path);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  loom::v1::Job job = Status("split-1");
  EXPECT_EQ(job.state(), loom::v1::SUCCEEDED) << job.reason();
  const auto& par = job.spec().parallelism();
  EXPECT_TRUE(par.tensor() > 1 || par.pipeline() > 1) << job.plan().layout().summary();
  EXPECT_EQ(par.data() * par.tensor() * par.pipeline(), 4);
  EXPECT_TRUE(job.plan().layout().fits());
  ASSERT_EQ(job.ranks_size(), 4);
  std::map<std::pair<int, int>, std::set<std::string>> tensor_group_workers;
  for (const auto& a : job.ranks()) {
    EXPECT_EQ(a.rank(), (a.dp() * par.pipeline() + a.pp()) * par.tensor() + a.tp()) << a.rank();
    tensor_group_workers[{a.dp(), a.pp()}].insert(a.worker_id());
  }
  for (const auto& [group, workers] : tensor_group_workers) {
    EXPECT_EQ(workers.size(), 1u) << "TP group (dp " << group.first << ", pp " << group.second
                                  << ") spans workers";
  }
  EXPECT_EQ(job.summary().last_step(), 6);
  EXPECT_GE(job.summary().checkpoints_written(), 2);  // steps 3 and 6
  auto status = Ctl("status split-1");
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("placement"));
  EXPECT_THAT(status.out, HasSubstr("PP (stage)"));
  std::cout << status.out.substr(0, status.out.find("history")) << std::endl;
}

// Manual control: `loomctl rollback` stops a running job, resumes it
// from the newest checkpoint at or before the step, skips the batches, and
// the job still finishes.
TEST_F(ClusterTest, OperatorRollbackResumesSkipsAndSucceeds) {
  StartCluster(1);
  // Long enough to be still running when rolled back; every checkpoint kept.
  constexpr int kSteps = 1500;
  std::string spec = absl::StrCat(home_, "/manual.yaml");
  std::ofstream(spec) << "name: manual\n" << R"(
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data: {train: ["data/train_*.bin"]}
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )" << kSteps << R"(, warmup_steps: 5}
batch: {global_batch: 8, micro_batch: 8}
resources: {workers: 1, ranks: 1}
checkpoint: {interval_steps: 10, keep: 1000}
recovery: {disable_spike_detection: true}
seed: 7
)";
  std::string job = Submit(spec);
  auto usage = Ctl("rollback " + job + " --to-step 10 --skip 5-9");
  EXPECT_EQ(usage.exit_code, 2) << usage.err;
  auto missing = Ctl("rollback nope-7 --to-step 10");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("NOT_FOUND"));

  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().checkpoints_written() >= 3; }, 120))
      << Status(job).DebugString();
  int64_t at = Status(job).summary().last_step();
  ASSERT_LT(at, kSteps - 200) << "the job must still be running";
  int64_t to = at - 1;
  int64_t checkpoint = to / 10 * 10;
  int64_t skip_begin = checkpoint + 5, skip_end = checkpoint + 15;
  auto bad = Ctl(absl::StrCat("rollback ", job, " --to-step ", to, " --skip 50:50"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("INVALID_ARGUMENT: skip[0]: [50, 50) is empty"));
  auto r = Ctl(absl::StrCat("rollback ", job, " --to-step ", to, " --skip ", skip_begin, ":",
                            skip_end, " --reason drill"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("operator rollback (by user 'local': drill)"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("(step ", checkpoint, ")")));

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  loom::v1::Job done = Status(job);
  EXPECT_EQ(done.summary().last_step(), kSteps);
  EXPECT_EQ(done.operator_rollbacks(), 1);
  EXPECT_EQ(done.rollbacks(), 0);
  EXPECT_EQ(done.restarts(), 0);
  int rendezvous_retries = 0;
  StatesWithoutRendezvousRetries(done, &rendezvous_retries);
  EXPECT_EQ(done.generation(), 1 + rendezvous_retries) << done.DebugString();
  ASSERT_EQ(done.skip_batches_size(), 1);
  EXPECT_EQ(done.skip_batches(0).begin(), skip_begin);
  EXPECT_EQ(done.skip_batches(0).end(), skip_end);
  const std::vector<loom::v1::RecoveryEvent> recovery = RecoveryEvents(done);
  ASSERT_EQ(recovery.size(), 1u) << done.DebugString();
  EXPECT_EQ(recovery[0].kind(), loom::v1::RecoveryEvent::ROLLBACK);
  EXPECT_EQ(recovery[0].cause(), "operator");
  EXPECT_EQ(recovery[0].checkpoint_step(), checkpoint);
  EXPECT_GE(recovery[0].steps_lost(), at - checkpoint);

  // The second attempt resumed after the checkpoint and trained around the
  // skip: step c+1 trained batch c, step c+6 batch c+15.
  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &steps));
  int64_t first = -1, after_skip = -1;
  for (const auto& m : steps.steps()) {  // oldest first: the newest report wins
    if (m.step() == checkpoint + 1) first = m.data_batch();
    if (m.step() == checkpoint + 6) after_skip = m.data_batch();
  }
  EXPECT_EQ(first, checkpoint);
  EXPECT_EQ(after_skip, skip_end);

  auto events = Ctl("events " + job);
  EXPECT_EQ(events.exit_code, 0) << events.err;
  EXPECT_THAT(events.out, HasSubstr("operator"));
  EXPECT_THAT(events.out, HasSubstr("operator rollbacks 1"));
  std::string id = job;
  CheckMetrics(controller_metrics_,
               {"loom_controller_recoveries_total{cause=\"operator\",job_id=\"" + id +
                    "\",kind=\"rollback\"} 1",
                "loom_controller_batches_skipped_total{job_id=\"" + id + "\"} 10",
                "loom_controller_steps_lost_total{cause=\"operator\",job_id=\"" + id + "\"}",
                "loom_controller_last_checkpoint_bytes{job_id=\"" + id + "\"}",
                "loom_controller_checkpoint_stall_duration_seconds_bucket"});
}

}  // namespace
}  // namespace loom
