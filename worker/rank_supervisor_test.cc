#include "worker/rank_supervisor.h"

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The supervisor runs whatever binary it is given; these tests give it small
// shell scripts that behave like ranks (emit events, fail, crash, hang).
class RankSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_sup_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }

  std::string Script(const std::string& body) {
    std::string path = dir_ + "/rank.sh";
    std::ofstream out(path);
    out << "#!/bin/sh\n" << body << "\n";
    out.close();
    chmod(path.c_str(), 0755);
    return path;
  }

  std::unique_ptr<RankSupervisor> Make(const std::string& binary,
                                       absl::Duration grace = absl::Seconds(5)) {
    RankSupervisorOptions opts;
    opts.rank_binary = binary;
    opts.work_dir = dir_ + "/work";
    opts.stop_grace = grace;
    opts.on_event = [this](const std::string& /*job*/, int /*rank*/, int64_t /*generation*/,
                           const loom::v1::RankEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(e);
    };
    opts.on_exit = [this](const RankExit& exit) {
      std::lock_guard<std::mutex> lock(mu_);
      exits_.push_back(exit);
      cv_.notify_all();
    };
    return std::make_unique<RankSupervisor>(opts);
  }

  RankExit WaitExit() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(20), [&] { return !exits_.empty(); }));
    return exits_.empty() ? RankExit{} : exits_.back();
  }

  std::string dir_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<loom::v1::RankEvent> events_;
  std::vector<RankExit> exits_;
};

TEST_F(RankSupervisorTest, ForwardsEventsAndCleanExit) {
  auto sup = Make(Script(
      "test \"$1\" = --assignment && test -f \"$2\" || exit 9\n"
      "echo '{\"step\": {\"step\": \"1\", \"loss\": 5.5}}'\n"
      "echo 'not an event'\n"
      "echo '{\"checkpoint\": {\"step\": \"1\", \"path\": \"/c/1\"}}'\n"
      "echo 'done training' >&2\n"
      "exit 0"));
  ASSERT_TRUE(sup->Start("job-1", 0, 4, "{}").ok());
  RankExit exit = WaitExit();
  EXPECT_EQ(exit.job_id, "job-1");
  EXPECT_EQ(exit.generation, 4);
  EXPECT_EQ(exit.exit_code, 0);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_EQ(exit.reason, "done training");
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[0].step().step(), 1);
  EXPECT_DOUBLE_EQ(events_[0].step().loss(), 5.5);
  EXPECT_EQ(events_[1].checkpoint().path(), "/c/1");
}

// A rank that has exited stays unsettled until its exit has been handed to
// on_exit: a worker leaving once nothing is unsettled never leaves an exit
// behind (Running() lists the rank no more while on_exit still runs).
TEST_F(RankSupervisorTest, AnExitIsUnsettledUntilOnExitReturns) {
  std::mutex mu;
  std::condition_variable cv;
  bool in_callback = false, release = false;
  RankSupervisorOptions opts;
  opts.rank_binary = Script("exit 0");
  opts.work_dir = dir_ + "/work";
  opts.on_exit = [&](const RankExit&) {
    std::unique_lock<std::mutex> lock(mu);
    in_callback = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  RankSupervisor sup(opts);
  ASSERT_TRUE(sup.Start("job-9", 0, 1, "{}").ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return in_callback; }));
  }
  EXPECT_TRUE(sup.Running().empty());
  EXPECT_EQ(sup.Unsettled(), 1u);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  // Bounded: 20 s at most for the callback's thread to return.
  for (int i = 0; i < 2000 && sup.Unsettled() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(sup.Unsettled(), 0u);
}

// A rank starts with the OpenMP wait policy a training process wants, so
// it need not exec itself again to get it; a policy the worker's
// environment chose is passed on as it is.
TEST_F(RankSupervisorTest, RanksGetTheTrainingOpenMpPolicyUnlessOneWasChosen) {
  const std::string script =
      Script("echo \"spin=$GOMP_SPINCOUNT wait=$OMP_WAIT_POLICY set=$LOOM_OPENMP_WAIT_SET\" >&2");
  unsetenv("GOMP_SPINCOUNT");
  unsetenv("OMP_WAIT_POLICY");
  setenv("LOOM_OPENMP_WAIT_SET", "1", 1);  // stale: not passed on by itself
  {
    auto sup = Make(script);
    ASSERT_TRUE(sup->Start("job-10", 0, 1, "{}").ok());
    EXPECT_EQ(WaitExit().reason, "spin=30000 wait= set=1");
  }
  exits_.clear();
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  {
    auto sup = Make(script);
    ASSERT_TRUE(sup->Start("job-11", 0, 1, "{}").ok());
    EXPECT_EQ(WaitExit().reason, "spin= wait=PASSIVE set=");
  }
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("LOOM_OPENMP_WAIT_SET");
}

TEST_F(RankSupervisorTest, SameAttemptNeverRunsTwice) {
  auto sup = Make(Script("exit 0"));
  ASSERT_TRUE(sup->Start("job-7", 0, 1, "{}").ok());
  WaitExit();
  EXPECT_EQ(sup->Start("job-7", 0, 1, "{}").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(sup->Start("job-7", 0, 2, "{}").ok());  // the next attempt may
}

TEST_F(RankSupervisorTest, FailureCarriesLastLogLine) {
  auto sup = Make(Script("echo 'loading data' >&2\necho 'data.train: no such file' >&2\nexit 3"));
  ASSERT_TRUE(sup->Start("job-2", 1, 0, "{}").ok());
  RankExit exit = WaitExit();
  EXPECT_EQ(exit.rank, 1);
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.reason, "data.train: no such file");
}

TEST_F(RankSupervisorTest, CrashBySignalIsReportedAndDaemonSurvives) {
  auto sup = Make(Script("kill -ABRT $$"));
  ASSERT_TRUE(sup->Start("job-3", 0, 0, "{}").ok());
  RankExit exit = WaitExit();
  EXPECT_EQ(exit.signal, SIGABRT);
  EXPECT_TRUE(sup->Running().empty());
}

TEST_F(RankSupervisorTest, StopTerminatesAndEscalatesToKill) {
  // Ignores SIGTERM, so only the SIGKILL after the grace period ends it.
  auto sup = Make(Script("trap '' TERM\nwhile true; do sleep 0.1; done"), absl::Milliseconds(300));
  ASSERT_TRUE(sup->Start("job-4", 0, 0, "{}").ok());
  EXPECT_EQ(sup->Start("job-4", 0, 0, "{}").code(), absl::StatusCode::kAlreadyExists);
  ASSERT_EQ(sup->Running().size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  sup->Stop("job-4");
  RankExit exit = WaitExit();
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_THAT(exit.reason, HasSubstr("SIGKILL"));
}

TEST_F(RankSupervisorTest, StopWithTermEndsCooperativeRank) {
  auto sup = Make(Script("trap 'echo stopped >&2; exit 143' TERM\nwhile true; do sleep 0.1; done"));
  ASSERT_TRUE(sup->Start("job-5", 0, 0, "{}").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  sup->Stop("job-5");
  RankExit exit = WaitExit();
  EXPECT_EQ(exit.exit_code, 143);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_EQ(exit.reason, "stopped");
}

TEST_F(RankSupervisorTest, SaveAndStopSignalsUsr1WithoutEscalating) {
  // Saves (says so) on SIGUSR1 but stays up, as a rank whose save is slow:
  // no SIGKILL comes past the stop grace; a plain Stop afterwards still ends
  // it through its grace.
  auto sup = Make(Script("trap 'echo saving >&2' USR1\ntrap '' TERM\n"
                         "while true; do sleep 0.1; done"),
                  absl::Milliseconds(300));
  ASSERT_TRUE(sup->Start("job-7", 0, 0, "{}").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  sup->SaveAndStop("job-7");
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // 3 stop graces
  ASSERT_EQ(sup->Running().size(), 1u);
  sup->Stop("job-7");
  RankExit exit = WaitExit();
  EXPECT_EQ(exit.signal, SIGKILL);
}

TEST_F(RankSupervisorTest, SaveAndStopEndsARankThatSavesAndExits) {
  auto sup =
      Make(Script("trap 'echo saved at step 3 >&2; exit 79' USR1\n"
                  "while true; do sleep 0.1; done"));
  ASSERT_TRUE(sup->Start("job-8", 0, 2, "{}").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  sup->SaveAndStop("job-8", /*generation=*/1);  // an older attempt's: not this one
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(sup->Running().size(), 1u);
  sup->SaveAndStop("job-8", /*generation=*/2);
  RankExit exit = WaitExit();
  EXPECT_EQ(exit.exit_code, 79);
  EXPECT_EQ(exit.reason, "saved at step 3");
}

TEST_F(RankSupervisorTest, MissingBinaryExitsWith127) {
  auto sup = Make(dir_ + "/does-not-exist");
  ASSERT_TRUE(sup->Start("job-6", 0, 0, "{}").ok());
  RankExit exit = WaitExit();
  EXPECT_EQ(exit.exit_code, 127);
  EXPECT_THAT(exit.reason, HasSubstr("exec of the rank binary failed"));
}

// Warm ranks: once a rank has run and none has started for warm_after, a
// process is started ahead of need (`--warm`) and waits; the next start
// hands it the assignment and its log instead of starting a process. One
// of a rank binary that changed since is not used, and the supervisor's
// end takes the waiting ones with it.
TEST_F(RankSupervisorTest, AWarmRankTakesTheNextStartUnlessItsBinaryChanged) {
  const std::string body =
      "if [ \"$1\" = --warm ]; then\n"
      "  echo \"warm $$\" >&2\n"
      "  IFS=$(printf '\\t') read -r assignment log || exit 0\n"
      "  exec 2>>\"$log\"\n"
      "  echo 'came warm' >&2\n"
      "  set -- --assignment \"$assignment\"\n"
      "fi\n"
      "test \"$1\" = --assignment && test -f \"$2\" || exit 9\n"
      "echo '{\"step\": {\"step\": \"1\", \"loss\": 5.5}}'\n"
      "echo \"rank pid $$\" >&2\n"
      "exit 0";
  RankSupervisorOptions opts;
  opts.rank_binary = Script(body);
  opts.work_dir = dir_ + "/work";
  opts.warm_ranks = 1;
  opts.warm_after = absl::ZeroDuration();
  opts.on_exit = [this](const RankExit& exit) {
    std::lock_guard<std::mutex> lock(mu_);
    exits_.push_back(exit);
    cv_.notify_all();
  };
  auto sup = std::make_unique<RankSupervisor>(opts);
  auto log_of = [&](const std::string& job) {
    std::ifstream in(dir_ + "/work/" + job + "/rank-0.log");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  // The n-th exit (the helper WaitExit returns the newest one at once).
  auto nth_exit = [&](size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(20), [&] { return exits_.size() >= n; }));
    return exits_.size() >= n ? exits_[n - 1] : RankExit{};
  };
  auto wait_warm = [&] {
    // Bounded: 20 s for the supervisor's loop (every 100 ms) to start one.
    for (int i = 0; i < 2000 && sup->WarmReady() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return sup->WarmReady();
  };
  // None before any rank ran here.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(sup->WarmReady(), 0u);
  ASSERT_TRUE(sup->Start("job-1", 0, 1, "{}").ok());
  EXPECT_EQ(nth_exit(1).exit_code, 0);
  EXPECT_THAT(log_of("job-1"), Not(HasSubstr("came warm")));

  ASSERT_EQ(wait_warm(), 1u);
  ASSERT_TRUE(sup->Start("job-2", 0, 1, "{}").ok());
  const RankExit warm = nth_exit(2);
  EXPECT_EQ(warm.job_id, "job-2");
  EXPECT_EQ(warm.exit_code, 0) << warm.reason;
  EXPECT_THAT(log_of("job-2"), HasSubstr("came warm"));
  EXPECT_EQ(warm.reason.rfind("rank pid ", 0), 0u) << warm.reason;

  // The binary is replaced (a new inode): the waiting rank is not used.
  ASSERT_EQ(wait_warm(), 1u);
  {
    const std::string fresh = dir_ + "/rank.sh.new";
    std::ofstream(fresh) << "#!/bin/sh\n# a new build\n" << body << "\n";
    chmod(fresh.c_str(), 0755);
    ASSERT_EQ(rename(fresh.c_str(), opts.rank_binary.c_str()), 0);
  }
  ASSERT_TRUE(sup->Start("job-3", 0, 1, "{}").ok());
  EXPECT_EQ(nth_exit(3).exit_code, 0);
  EXPECT_THAT(log_of("job-3"), Not(HasSubstr("came warm")));

  // The supervisor's end kills the one waiting now.
  ASSERT_EQ(wait_warm(), 1u);
  std::ifstream warm_log(dir_ + "/work/warm-ranks.log");
  std::string line, last_pid;
  while (std::getline(warm_log, line)) {
    if (line.rfind("warm ", 0) == 0) last_pid = line.substr(5);
  }
  ASSERT_FALSE(last_pid.empty());
  sup.reset();
  EXPECT_NE(kill(std::stoi(last_pid), 0), 0) << "warm rank " << last_pid << " outlived its worker";
}

}  // namespace
}  // namespace loom::worker
