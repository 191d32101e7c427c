// Active/standby controllers over PostgreSQL, end to end:
// `loomctl local up --ha` starts a PostgreSQL server and two controllers on
// it; these tests kill or pause the leader under a running job and check
// that the standby takes over, that the job loses nothing, and that the old
// leader is fenced out.
#include <future>

#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/cluster_fixture.h"

namespace loom {
namespace {

class HaTest : public ClusterTest {
 protected:
  // The daemon `name`'s ready file (pid, role).
  cli::DaemonInfo Daemon(const std::string& name) {
    auto info = cli::ReadReadyFile(home_ + "/run/" + name + ".json");
    EXPECT_TRUE(info.ok()) << name;
    return info.ok() ? *info : cli::DaemonInfo();
  }

  // ExpectEveryStepOnceAndEveryCheckpoint, asking the controller that
  // leads now.
  void ExpectNothingLost(const std::string& job, int steps) {
    for (const char* name : {"controller-0", "controller-1"}) {
      if (Daemon(name).role == "active") controller_ = Daemon(name).grpc_address;
    }
    ASSERT_NO_FATAL_FAILURE(ExpectEveryStepOnceAndEveryCheckpoint(job, steps));
  }

  // The job ended SUCCEEDED with no restart and no new attempt but those
  // placed again after a rendezvous failure at the start.
  void ExpectNoRestart(const loom::v1::Job& done, int steps) {
    EXPECT_EQ(done.state(), loom::v1::SUCCEEDED) << done.DebugString();
    EXPECT_EQ(done.restarts(), 0);
    int rendezvous_retries = 0;
    StatesWithoutRendezvousRetries(done, &rendezvous_retries);
    EXPECT_EQ(done.generation(), rendezvous_retries) << done.DebugString();
    EXPECT_EQ(done.summary().last_step(), steps);
    for (const auto& e : done.events()) {
      EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::RESTART) << e.DebugString();
    }
  }

  // curl to a console, trusting the cluster CA, with a cookie jar:
  // "<HTTP status> <Location header>"; with `reply`, the body goes there.
  std::string Console(const std::string& method, const std::string& url,
                      const std::string& body = "", std::string* reply = nullptr) {
    const std::string jar = home_ + "/console.cookies", out = home_ + "/console.reply";
    std::string cmd =
        absl::StrCat("curl -sS --max-time 10 --cacert ", home_, "/tls/ca.pem -b ", jar, " -c ", jar,
                     " -X ", method, " -o ", out, " -w '%{http_code} %{redirect_url}'");
    if (!body.empty()) {
      absl::StrAppend(&cmd, " -H 'Content-Type: application/json' --data-binary ",
                      ShellQuote(body));
    }
    const std::string status(
        absl::StripAsciiWhitespace(RunCommand(cmd + " " + ShellQuote(url)).out));
    if (reply != nullptr) *reply = ReadFile(out).value_or("");
    return status;
  }

  // The epochs worker-<i> followed, in order, from its log.
  std::vector<int64_t> WorkerEpochs(int i) {
    std::vector<int64_t> epochs;
    auto log = ReadFile(absl::StrCat(home_, "/logs/worker-", i, ".log"));
    if (!log.ok()) return epochs;
    std::regex moved("controller leader epoch (\\d+) -> (\\d+)");
    for (std::sregex_iterator it(log->begin(), log->end(), moved), end; it != end; ++it) {
      if (epochs.empty()) epochs.push_back(std::stoll((*it)[1]));
      epochs.push_back(std::stoll((*it)[2]));
    }
    return epochs;
  }
};

// kill -9 of the leader under a running job: the standby serves within
// seconds, re-adopts the job's ranks, and the job finishes with no restart,
// every step once and every checkpoint in its catalog. The killed one comes
// back as the standby.
TEST_F(HaTest, KilledLeaderIsReplacedWithinSecondsAndItsJobLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, /*worker_timeout_s=*/10, "--ha"));
  ASSERT_EQ(Daemon("controller-0").role, "active");
  ASSERT_EQ(Daemon("controller-1").role, "standby");
  constexpr int kSteps = 1200;
  const std::string job = Submit(WriteSpec(
      "steady", kSteps, 2, "recovery: {disable_spike_detection: true, max_restarts: 0}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 10; }, 90))
      << Status(job).DebugString();
  ASSERT_LT(Status(job).summary().last_step(), kSteps) << "the kill must land mid-run";

  // Two clients follow the job across the failover: `events --follow` and
  // `watch` (both JSON, one event a line). They end when the job does.
  auto events_follower = std::async(std::launch::async,
                                    [&] { return Ctl("-o json events " + job + " --follow"); });
  auto watcher = std::async(std::launch::async, [&] { return Ctl("-o json watch " + job); });
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 20; }, 60));

  // A client of the standby's address: it answers UNAVAILABLE naming the
  // leader until it leads.
  const std::string standby = Daemon("controller-1").grpc_address;
  auto stub = loom::v1::JobService::NewStub(*cli::LocalControllerChannel(home_, standby));
  auto get = [&]() {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    loom::v1::GetJobRequest req;
    req.set_job_id(job);
    loom::v1::Job j;
    grpc::Status s = stub->GetJob(&ctx, req, &j);
    if (!s.ok()) {
      const auto& trailers = ctx.GetServerTrailingMetadata();
      auto it = trailers.find("loom-leader");
      return std::make_pair(s, it == trailers.end()
                                   ? std::string()
                                   : std::string(it->second.data(), it->second.size()));
    }
    return std::make_pair(s, std::string());
  };
  auto before = get();
  EXPECT_EQ(before.first.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(before.first.error_message(), HasSubstr("this controller is a standby"));
  EXPECT_EQ(before.second, controller_);
  // So does its console: it sends the browser to the leader's (307). A
  // page logged in at the leader stays logged in across the failover (the
  // session is in the store).
  const std::string leader_console = Daemon("controller-0").console_url;
  const std::string standby_console = Daemon("controller-1").console_url;
  ASSERT_FALSE(leader_console.empty());
  ASSERT_FALSE(standby_console.empty());
  EXPECT_EQ(Console("POST", leader_console + "/api/v1/session",
                    absl::StrCat(R"({"token": ")", token_, R"("})")),
            "200");
  EXPECT_EQ(Console("GET", standby_console + "/api/v1/jobs/" + job),
            absl::StrCat("307 ", leader_console, "/api/v1/jobs/", job));

  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(Daemon("controller-0").pid, SIGKILL), 0);
  bool served = false;
  for (int i = 0; i < 1000 && !served; ++i) {  // 20 s at most
    served = get().first.ok();
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double failover_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  ASSERT_TRUE(served);
  std::cout << "[ failover ] kill -9 of the leader to the standby serving: " << failover_s << " s"
            << std::endl;
  // The promise is 3 s (lease 2 s); twice that here, for a loaded machine.
  // ./bench/run.sh failover measures the p50 and p99 over many cycles.
  EXPECT_LT(failover_s, 6.0);
  EXPECT_EQ(Daemon("controller-1").role, "active");
  EXPECT_EQ(Console("GET", standby_console + "/api/v1/jobs/" + job), "200");

  // loomctl follows the leader on its own.
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 180))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  ASSERT_NO_FATAL_FAILURE(ExpectNoRestart(done, kSteps));
  // The console's chart series, from the new leader with the session made
  // at the old one: every step, before and after the failover, in 50
  // buckets.
  std::string series;
  ASSERT_EQ(
      Console("GET", standby_console + "/api/v1/jobs/" + job + "/series?buckets=50", "", &series),
      "200");
  // (Steps 0, the evaluation before training, to kSteps.)
  EXPECT_THAT(series, HasSubstr(absl::StrCat(R"("steps":")", kSteps + 1, R"(")")));
  loom::v1::GetStepSeriesResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(series, &parsed).ok()) << series;
  EXPECT_EQ(parsed.bucket_first_step_size(), 50);
  EXPECT_EQ(parsed.bucket_last_step(49), kSteps);
  ASSERT_EQ(parsed.series_size(), 4);
  EXPECT_EQ(parsed.series(0).name(), "loss");
  bool readopted = false;
  for (const auto& e : done.events()) {
    if (e.kind() != loom::v1::RecoveryEvent::READOPTED) continue;
    readopted = true;
    EXPECT_THAT(e.message(), HasSubstr("took over from"));
    EXPECT_THAT(e.message(), HasSubstr("as leader (epoch 2)"));
  }
  EXPECT_TRUE(readopted) << done.DebugString();
  ASSERT_NO_FATAL_FAILURE(ExpectNothingLost(job, kSteps));
  for (int w = 0; w < 2; ++w) EXPECT_EQ(WorkerEpochs(w), (std::vector<int64_t>{1, 2})) << w;

  // Both followers printed every logged event of the job exactly once, in
  // log order, with no gap, across the kill: the same numbers the new
  // leader's log has, from the first to SUCCEEDED.
  auto logged = Ctl("-o json events " + job);
  ASSERT_EQ(logged.exit_code, 0) << logged.err;
  loom::v1::ListEventsResponse log;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(logged.out, &log).ok()) << logged.out;
  std::vector<int64_t> want;
  for (const auto& e : log.events()) want.push_back(e.seq());
  ASSERT_GE(want.size(), 5u) << logged.out;
  ASSERT_EQ(log.events().rbegin()->transition().to(), loom::v1::SUCCEEDED) << logged.out;
  std::cout << "[ events ] " << want.size() << " logged events, seq " << want.front() << ".."
            << want.back() << std::endl;
  for (auto* follower : {&events_follower, &watcher}) {
    ASSERT_EQ(follower->wait_for(std::chrono::seconds(60)), std::future_status::ready);
    const auto followed = follower->get();
    EXPECT_EQ(followed.exit_code, 0) << followed.err;
    std::vector<int64_t> seen;
    bool readopted_seen = false;
    for (absl::string_view line : absl::StrSplit(followed.out, '\n', absl::SkipEmpty())) {
      loom::v1::JobEvent e;
      ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(std::string(line), &e).ok()) << line;
      if (e.seq() == 0) continue;  // steps: live only
      seen.push_back(e.seq());
      readopted_seen |= e.has_recovery() && e.recovery().kind() == loom::v1::RecoveryEvent::READOPTED;
    }
    EXPECT_EQ(seen, want) << followed.out.substr(0, 4000) << followed.err;
    EXPECT_TRUE(readopted_seen);
  }

  // Rank logs live in the shared database: the new leader has every byte
  // the ranks wrote, shipped to either controller, the same as the file
  // each rank's worker kept.
  loom::v1::GetRankLogResponse catalog;
  auto whole = [&] {
    auto listing = Ctl("-o json logs " + job);
    catalog.Clear();
    if (listing.exit_code != 0 ||
        !google::protobuf::util::JsonStringToMessage(listing.out, &catalog).ok()) {
      return false;
    }
    int complete = 0;
    for (const auto& l : catalog.logs()) {
      complete += l.generation() == done.generation() && l.complete() ? 1 : 0;
    }
    return complete == 2;
  };
  ASSERT_TRUE(WaitFor(whole, 30)) << catalog.DebugString();
  for (const auto& r : done.ranks()) {
    SCOPED_TRACE(absl::StrCat("rank ", r.rank(), " on ", r.node()));
    auto shown = Ctl(absl::StrCat("logs ", job, " --rank ", r.rank()));
    ASSERT_EQ(shown.exit_code, 0) << shown.err;
    for (const auto& l : catalog.logs()) {
      if (l.rank() != r.rank() || l.generation() != done.generation()) continue;
      EXPECT_EQ(l.first_kept(), 0);
      EXPECT_EQ(l.end(), static_cast<int64_t>(shown.out.size()));
    }
    auto file = ReadFile(absl::StrCat(home_, "/workers/", r.node().substr(r.node().rfind('-') + 1),
                                      "/", job, "/rank-", r.rank(), ".log"));
    ASSERT_TRUE(file.ok());
    ASSERT_GE(file->size(), shown.out.size());
    EXPECT_FALSE(shown.out.empty());
    EXPECT_EQ(file->substr(file->size() - shown.out.size()), shown.out);
  }
  auto grep = Ctl("logs " + job + " --grep " + ShellQuote("loom-rank 1/2"));
  EXPECT_EQ(grep.exit_code, 0) << grep.err;
  EXPECT_THAT(grep.out, HasSubstr("rank 1 attempt "));

  // The killed controller comes back as the standby.
  auto restarted = Ctl("local restart controller-0");
  ASSERT_EQ(restarted.exit_code, 0) << restarted.out << restarted.err;
  auto status = Ctl("-o json local status");
  google::protobuf::ListValue daemons;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(status.out, &daemons).ok()) << status.out;
  std::map<std::string, google::protobuf::Struct> by_name;
  for (const auto& d : daemons.values()) {
    by_name[d.struct_value().fields().at("name").string_value()] = d.struct_value();
  }
  ASSERT_EQ(by_name.count("controller-0"), 1u) << status.out;
  const auto& c0 = by_name["controller-0"].fields();
  EXPECT_EQ(c0.at("pid").number_value(), Daemon("controller-0").pid) << status.out;
  EXPECT_TRUE(c0.at("alive").bool_value()) << status.out;
  EXPECT_EQ(c0.at("role").string_value(), "standby") << status.out;
  EXPECT_EQ(by_name.count("controller-1"), 1u) << status.out;
  EXPECT_EQ(Daemon("controller-1").role, "active");
}

// SIGSTOP of the leader past its lease: the standby takes over and the job
// trains on under it. Woken, the old leader finds the lease gone, steps
// down (running again as a standby, the same process) and never leads
// again; workers never go back to its epoch; the job loses nothing.
TEST_F(HaTest, PausedLeaderIsFencedOutAndStepsDown) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, /*worker_timeout_s=*/10, "--ha"));
  constexpr int kSteps = 1200;
  const std::string job = Submit(WriteSpec(
      "steady", kSteps, 2, "recovery: {disable_spike_detection: true, max_restarts: 0}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 10; }, 90))
      << Status(job).DebugString();
  const int old_pid = Daemon("controller-0").pid;
  ASSERT_EQ(kill(old_pid, SIGSTOP), 0);
  loom::testing::RunOnExit resume(absl::StrCat("kill -CONT ", old_pid));
  ASSERT_TRUE(WaitFor([&] { return Daemon("controller-1").role == "active"; }, 20));
  // The job trains on under the new leader.
  const int64_t at_takeover = Status(job).summary().last_step();
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= at_takeover + 20; }, 60))
      << Status(job).DebugString();
  ASSERT_EQ(kill(old_pid, SIGCONT), 0);
  // It steps down: the same pid serves again, as a standby.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto log = ReadFile(home_ + "/logs/controller-0.log");
        return log.ok() && log->find("stepping down") != std::string::npos &&
               Daemon("controller-0").role == "standby";
      },
      20));
  EXPECT_EQ(Daemon("controller-0").pid, old_pid);
  auto log = ReadFile(home_ + "/logs/controller-0.log");
  ASSERT_TRUE(log.ok());
  EXPECT_THAT(*log, HasSubstr("stepping down: the leader lease of epoch 1 was taken by"));
  EXPECT_EQ(Daemon("controller-1").role, "active");

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 180))
      << Status(job).DebugString();
  ASSERT_NO_FATAL_FAILURE(ExpectNoRestart(Status(job), kSteps));
  ASSERT_NO_FATAL_FAILURE(ExpectNothingLost(job, kSteps));
  for (int w = 0; w < 2; ++w) EXPECT_EQ(WorkerEpochs(w), (std::vector<int64_t>{1, 2})) << w;
}

}  // namespace
}  // namespace loom
