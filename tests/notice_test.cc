// Node notices end to end on a local cluster: a worker's SIGTERM and a
// notice file, each draining its node mid-run; then twenty jobs, each told
// at a random step that its node is going away, from each of the three
// sources a worker watches (its own SIGTERM, a notice file, a cloud's
// metadata endpoint, served here on loopback in AWS's spot
// `instance-action` shape). Every notice gives far more than one step plus
// a save, so every job must save at its next step boundary, move to another
// node, lose no step, count no restart, and end bitwise equal to the
// uninterrupted run of the same spec.
#include <signal.h>

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "httplib.h"
#include "tests/cluster_fixture.h"

namespace loom {
namespace {

// The AWS spot shape, per node: 404 until the test gives the node a notice,
// then {"action": "terminate", "time": <now + 90 s>}; 404 again once the
// test takes it back.
class SpotEndpoint {
 public:
  SpotEndpoint() {
    server_.Get(R"(/([^/]+)/latest/meta-data/spot/instance-action)",
                [this](const httplib::Request& req, httplib::Response& res) {
                  std::lock_guard<std::mutex> lock(mu_);
                  auto it = noticed_.find(req.matches[1].str());
                  if (it == noticed_.end()) {
                    res.status = 404;
                    return;
                  }
                  res.set_content(absl::StrCat(R"({"action": "terminate", "time": ")",
                                               absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", it->second,
                                                                absl::UTCTimeZone()),
                                               "\"}"),
                                  "application/json");
                });
    port_ = server_.bind_to_any_port("127.0.0.1");
    // (Bound and listening: a request made before the thread serves waits.)
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~SpotEndpoint() {
    server_.stop();
    thread_.join();
  }

  // For `loomctl local up --notice-url`.
  std::string url() const {
    return absl::StrCat("http://127.0.0.1:", port_,
                        "/{node}/latest/meta-data/spot/instance-action");
  }
  void Notice(const std::string& node, absl::Duration left) {
    std::lock_guard<std::mutex> lock(mu_);
    noticed_[node] = absl::Now() + left;
  }
  void Withdraw(const std::string& node) {
    std::lock_guard<std::mutex> lock(mu_);
    noticed_.erase(node);
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::mutex mu_;
  std::map<std::string, absl::Time> noticed_;  // guarded by mu_
  std::thread thread_;
};

class NoticeTest : public ClusterTest {
 protected:
  // Every job the controller has (one call for all of them): summaries
  // with their ranks, or whole with `full`.
  std::map<std::string, loom::v1::Job> AllJobs(bool full) {
    auto stub = loom::v1::JobService::NewStub(*cli::LocalControllerChannel(home_, controller_));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    loom::v1::ListJobsRequest req;
    req.set_full(full);
    req.set_page_size(1000);
    loom::v1::ListJobsResponse resp;
    std::map<std::string, loom::v1::Job> out;
    grpc::Status s = stub->ListJobs(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    for (const auto& j : resp.jobs()) out[j.id()] = j;
    return out;
  }

  loom::v1::Job GetJob(const std::string& job) {
    auto stub = loom::v1::JobService::NewStub(*cli::LocalControllerChannel(home_, controller_));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    loom::v1::GetJobRequest req;
    req.set_job_id(job);
    loom::v1::Job out;
    grpc::Status s = stub->GetJob(&ctx, req, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  // The path of `job`'s checkpoint at `step` ("" if it has none).
  std::string FinalCheckpoint(const std::string& job, int64_t step) {
    auto stub = loom::v1::JobService::NewStub(*cli::LocalControllerChannel(home_, controller_));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    loom::v1::ListCheckpointsRequest req;
    req.set_job_id(job);
    loom::v1::ListCheckpointsResponse resp;
    grpc::Status s = stub->ListCheckpoints(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    for (const auto& c : resp.checkpoints()) {
      if (c.step() == step) return c.path();
    }
    return "";
  }

  // loom-ckpt digest of each checkpoint, in order, in one run.
  std::vector<std::string> Digests(const std::vector<std::string>& paths) {
    std::string args;
    for (const std::string& p : paths) absl::StrAppend(&args, " ", ShellQuote(p));
    auto r = RunCommand(absl::StrCat(kBin, "/loom-ckpt digest", args));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    std::vector<std::string> out;
    for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      out.emplace_back(line.substr(0, line.find(' ')));
    }
    return out;
  }
};

// How a job is told, and where it stands.
enum class Source { kSigterm, kFile, kEndpoint };
const char* Name(Source s) {
  switch (s) {
    case Source::kSigterm:
      return "sigterm";
    case Source::kFile:
      return "file";
    case Source::kEndpoint:
      return "aws-spot";
  }
  return "";
}

struct NoticedJob {
  std::string id;
  Source source = Source::kFile;
  int64_t notice_at = 0;  // the step after which the notice is given
  std::string node;       // where it was when told ("local-<i>")
  int64_t told_at = -1;   // the last step reported when it was told
  absl::Time told_time;
  int sigtermed_pid = 0;
  bool drained = false;  // its DRAINED event is in, and the node is back
  bool done = false;
};

// A node's own notices: its worker's SIGTERM (as Kubernetes sends on a
// drain or eviction) and a notice file (as a node agent or a preStop hook
// writes). Each worker tells the controller, which drains the node: both
// jobs save at their next step boundary and move (waiting for room while a
// reference run holds the third worker), with no step lost and no restart,
// and end bitwise equal to the reference. The SIGTERMed worker exits once
// its rank has stopped. (The metadata endpoint's path is
// worker/node_notice_test.cc's, on loopback.)
TEST_F(ClusterTest, SigtermAndNoticeFileDrainTheirNodesLosingNothing) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  // About 3 ms a step: each notice, given as soon as its job passes step
  // 60, lands long before the end, even under load.
  constexpr int kSteps = 3000;
  // Checkpoints every 100 steps, all kept.
  const std::string extra =
      "recovery: {disable_spike_detection: true}\n"
      "checkpoint: {interval_steps: 100, keep: 100}\n";
  const std::string reference = Submit(WriteSpec("uncut", kSteps, 1, extra));
  const std::string termed = Submit(WriteSpec("termed", kSteps, 1, extra));
  const std::string filed = Submit(WriteSpec("filed", kSteps, 1, extra));
  std::map<std::string, int> pid_of;  // "worker-N" -> pid
  for (const auto& d : Daemons()) pid_of[d.name] = d.pid;
  int termed_pid = 0;
  std::string termed_node, filed_node;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const std::string& j : {termed, filed}) {
          std::string& node = j == termed ? termed_node : filed_node;
          if (!node.empty()) continue;
          const loom::v1::Job s = Status(j);
          if (s.summary().last_step() < 60 || s.ranks_size() != 1) continue;
          EXPECT_LT(s.summary().last_step(), kSteps / 2) << j << ": the notice must land mid-run";
          node = s.ranks(0).node();
          const std::string index = node.substr(node.rfind('-') + 1);
          if (j == termed) {
            termed_pid = pid_of["worker-" + index];
            if (termed_pid > 0) kill(termed_pid, SIGTERM);
          } else {
            std::ofstream(absl::StrCat(home_, "/workers/", index, "/notice")) << "90\n";
          }
        }
        return !termed_node.empty() && !filed_node.empty();
      },
      120))
      << Status(termed).DebugString() << Status(filed).DebugString();
  ASSERT_GT(termed_pid, 0);
  // The SIGTERMed worker leaves once its rank has saved and stopped.
  ASSERT_TRUE(WaitFor([&] { return !loom::testing::ProcessAlive(termed_pid); }, 30));
  for (const std::string& j : {reference, termed, filed}) {
    ASSERT_TRUE(WaitFor([&] { return Status(j).state() == loom::v1::SUCCEEDED; }, 240))
        << Status(j).DebugString();
  }
  const std::string want = Digest(CheckpointPathAt(reference, kSteps));
  for (const auto& [j, source] :
       std::vector<std::pair<std::string, std::string>>{{termed, "sigterm"}, {filed, "file"}}) {
    const loom::v1::Job done = Status(j);
    EXPECT_EQ(done.restarts(), 0) << j;
    const loom::v1::RecoveryEvent* moved = nullptr;
    for (const auto& e : done.events()) {
      if (e.kind() == loom::v1::RecoveryEvent::DRAINING) {
        EXPECT_THAT(e.message(), HasSubstr(source + " notice, ")) << e.message();
      }
      if (e.kind() == loom::v1::RecoveryEvent::DRAINED) moved = &e;
    }
    ASSERT_NE(moved, nullptr) << done.DebugString();
    EXPECT_EQ(moved->steps_lost(), 0) << moved->message();
    loom::v1::GetStepMetricsResponse steps;
    ASSERT_NO_FATAL_FAILURE(GetStepMetrics(j, &steps));
    std::map<int64_t, int> trained;
    for (const auto& m : steps.steps()) {
      if (m.step() > 0) trained[m.step()] += 1;
    }
    for (const auto& [step, times] : trained) EXPECT_EQ(times, 1) << j << " step " << step;
    EXPECT_EQ(trained.size(), static_cast<size_t>(kSteps)) << j;
    EXPECT_EQ(Digest(CheckpointPathAt(j, kSteps)), want) << j;
    std::cout << source << " notice, loomctl events " << j << ":\n"
              << Ctl("events " + j).out << std::endl;
  }
}

// Twenty notices at random steps, a seeded mix of the three sources, on a
// pool of one-slot workers: four noticed jobs train at a time (and the
// reference run beside the first ones), with two nodes to spare for the
// jobs that move. A node given back after its job drained (the notice
// withdrawn and the node uncordoned by an operator, or the SIGTERMed
// worker started again, which uncordons it) takes the next job.
TEST_F(NoticeTest, TwentyNoticesAtRandomStepsLoseNothingAndMatchTheUninterruptedRun) {
  SpotEndpoint endpoint;
  constexpr int kWorkers = 7;
  constexpr int kJobs = 20;
  constexpr int kAtOnce = 4;
  // About 2.5 ms a step alone: the notice (given at step 150 at the
  // latest, then up to a 1 s poll, a 0.5 s heartbeat and a 0.5 s command;
  // 470 steps at most in 60 notices, but once 1,350 on a machine running
  // another test beside this one, when 1,500 steps were too few) lands long
  // before the end.
  constexpr int kSteps = 3000;
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(kWorkers, /*worker_timeout_s=*/10, "--notice-url " + endpoint.url()));
  const std::string extra =
      "recovery: {disable_spike_detection: true}\n"
      "checkpoint: {interval_steps: 100, keep: 3}\n";
  const std::string spec = WriteSpec("noticed", kSteps, 1, extra);
  const std::string reference = Submit(WriteSpec("uncut", kSteps, 1, extra));

  std::mt19937 rng(2026);
  // The sources in a seeded order (7, 7 and 6 of them).
  std::vector<Source> order;
  for (int i = 0; i < kJobs; ++i) order.push_back(static_cast<Source>(i % 3));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<NoticedJob> jobs;
  auto submit_next = [&] {
    NoticedJob j;
    j.id = Submit(spec);
    j.source = order[jobs.size()];
    j.notice_at = std::uniform_int_distribution<int64_t>(20, 150)(rng);
    jobs.push_back(j);
  };
  for (int i = 0; i < kAtOnce; ++i) submit_next();

  auto worker_index = [](const std::string& node) { return node.substr(node.rfind('-') + 1); };
  auto active = [&] {
    int n = 0;
    for (const auto& j : jobs) n += j.done ? 0 : 1;
    return n;
  };
  std::mutex restarting;
  std::vector<std::future<loom::testing::CommandResult>> give_backs;
  const absl::Time start = absl::Now();
  // Bounded: 420 s in all, a look every 100 ms.
  const absl::Time give_up = start + absl::Seconds(420);
  while (absl::Now() < give_up) {
    const std::map<std::string, loom::v1::Job> all = AllJobs(/*full=*/false);
    for (NoticedJob& j : jobs) {
      auto it = all.find(j.id);
      if (it == all.end() || j.done) continue;
      const loom::v1::Job& s = it->second;
      if (s.state() == loom::v1::SUCCEEDED || s.state() == loom::v1::FAILED ||
          s.state() == loom::v1::CANCELLED) {
        j.done = true;
        continue;
      }
      if (j.told_at < 0) {
        if (s.state() != loom::v1::RUNNING || s.ranks_size() != 1 ||
            s.summary().last_step() < j.notice_at) {
          continue;
        }
        j.node = s.ranks(0).node();
        j.told_at = s.summary().last_step();
        j.told_time = absl::Now();
        const std::string index = worker_index(j.node);
        switch (j.source) {
          case Source::kSigterm:
            for (const auto& d : Daemons()) {
              if (d.name == "worker-" + index) j.sigtermed_pid = d.pid;
            }
            ASSERT_GT(j.sigtermed_pid, 0) << j.node;
            ASSERT_EQ(kill(j.sigtermed_pid, SIGTERM), 0);
            break;
          case Source::kFile:
            std::ofstream(absl::StrCat(home_, "/workers/", index, "/notice")) << "90\n";
            break;
          case Source::kEndpoint:
            endpoint.Notice(j.node, absl::Seconds(90));
            break;
        }
        continue;
      }
      if (j.drained) continue;
      bool drained = false;
      const loom::v1::Job whole = GetJob(j.id);
      for (const auto& e : whole.events()) drained |= e.kind() == loom::v1::RecoveryEvent::DRAINED;
      if (!drained) continue;
      // The job has left the node: give the node back, off this loop (a
      // worker's start takes seconds, in which a job trains hundreds of
      // steps).
      const std::string index = worker_index(j.node);
      if (j.source == Source::kSigterm) {
        if (loom::testing::ProcessAlive(j.sigtermed_pid)) continue;  // still leaving
        // One start at a time, with room: the workers of a host probe it
        // one after another, and on a machine this busy a start has taken
        // 20 s.
        give_backs.push_back(std::async(std::launch::async, [this, index, &restarting] {
          std::lock_guard<std::mutex> one_at_a_time(restarting);
          loom::testing::CommandResult r;
          auto started =
              cli::LocalRestart(home_, "worker-" + index, /*kill=*/false, absl::Seconds(120));
          r.exit_code = started.ok() ? 0 : 1;
          r.err = started.status().ToString();
          return r;
        }));
      } else {
        if (j.source == Source::kFile) {
          std::remove(absl::StrCat(home_, "/workers/", index, "/notice").c_str());
        } else {
          endpoint.Withdraw(j.node);
        }
        give_backs.push_back(std::async(std::launch::async,
                                        [this, node = j.node] { return Ctl("uncordon " + node); }));
      }
      j.drained = true;
    }
    while (active() < kAtOnce && static_cast<int>(jobs.size()) < kJobs) submit_next();
    if (active() == 0 && static_cast<int>(jobs.size()) == kJobs) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (auto& f : give_backs) {
    const loom::testing::CommandResult r = f.get();
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  std::printf("%d jobs of %d steps noticed in %.0f s\n", kJobs, kSteps,
              absl::ToDoubleSeconds(absl::Now() - start));
  ASSERT_EQ(static_cast<int>(jobs.size()), kJobs);
  ASSERT_TRUE(WaitFor([&] { return Status(reference).state() == loom::v1::SUCCEEDED; }, 120))
      << Status(reference).DebugString();
  // Each job's final checkpoint, digested in one loom-ckpt call (it loads
  // LibTorch once), the reference's first.
  const std::map<std::string, loom::v1::Job> all = AllJobs(/*full=*/true);
  std::vector<std::string> finals = {FinalCheckpoint(reference, kSteps)};
  for (const NoticedJob& j : jobs) finals.push_back(FinalCheckpoint(j.id, kSteps));
  const std::vector<std::string> digests = Digests(finals);
  ASSERT_EQ(digests.size(), finals.size());
  const std::string& want = digests[0];
  ASSERT_FALSE(want.empty());

  std::map<std::string, int> by_source;
  int lossless = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const NoticedJob& j = jobs[i];
    SCOPED_TRACE(absl::StrCat(j.id, " (", Name(j.source), " notice after step ", j.notice_at,
                              ", given after step ", j.told_at, ")"));
    ASSERT_EQ(all.count(j.id), 1u);
    const loom::v1::Job& done = all.at(j.id);
    if (done.state() != loom::v1::SUCCEEDED || j.told_at < 0) {
      ADD_FAILURE() << (j.told_at < 0 ? "the job ended before its notice was given\n" : "")
                    << done.DebugString();
      continue;
    }
    EXPECT_EQ(done.restarts(), 0);
    const loom::v1::RecoveryEvent* draining = nullptr;
    const loom::v1::RecoveryEvent* drained = nullptr;
    int drains = 0;
    for (const auto& e : done.events()) {
      if (e.kind() == loom::v1::RecoveryEvent::DRAINING) draining = &e;
      if (e.kind() == loom::v1::RecoveryEvent::DRAINED) {
        drained = &e;
        ++drains;
      }
    }
    if (draining == nullptr || drained == nullptr) {
      ADD_FAILURE() << "no drain: " << done.DebugString();
      continue;
    }
    EXPECT_EQ(drains, 1);
    EXPECT_THAT(draining->message(), HasSubstr(absl::StrCat(Name(j.source), " notice, ")));
    EXPECT_THAT(draining->message(), HasSubstr(j.node));
    EXPECT_EQ(drained->steps_lost(), 0) << drained->message();
    EXPECT_GE(drained->step(), j.told_at);
    EXPECT_EQ(digests[i + 1], want) << finals[i + 1];
    // Every step trained once, and every data batch once.
    loom::v1::GetStepMetricsResponse steps;
    ASSERT_NO_FATAL_FAILURE(GetStepMetrics(j.id, &steps));
    std::map<int64_t, int> trained;
    for (const auto& m : steps.steps()) {
      if (m.step() > 0) trained[m.step()] += 1;
    }
    for (const auto& [step, times] : trained) EXPECT_EQ(times, 1) << "step " << step;
    EXPECT_EQ(trained.size(), static_cast<size_t>(kSteps));
    auto ledger = Ctl("steps " + j.id + " --ledger");
    EXPECT_EQ(ledger.exit_code, 0) << ledger.out << ledger.err;
    EXPECT_THAT(
        ledger.out,
        HasSubstr(absl::StrCat(kSteps, " committed step(s) trained data batches 0..", kSteps - 1)));
    EXPECT_THAT(ledger.out, HasSubstr("0 skipped, 0 duplicated"));
    if (drained->steps_lost() == 0 && done.restarts() == 0) ++lossless;
    by_source[Name(j.source)] += 1;
    std::printf("%-12s %-8s told after step %4lld on %-8s, stopped at step %4lld (%s)\n",
                j.id.c_str(), Name(j.source), static_cast<long long>(j.told_at), j.node.c_str(),
                static_cast<long long>(drained->step()), drained->message().c_str());
  }
  std::printf(
      "notices: %d/%d jobs drained with 0 steps lost and 0 restarts, bitwise equal to "
      "the uninterrupted run (sigterm %d, file %d, aws-spot %d)\n",
      lossless, kJobs, by_source["sigterm"], by_source["file"], by_source["aws-spot"]);
  EXPECT_EQ(lossless, kJobs);
}

}  // namespace
}  // namespace loom
