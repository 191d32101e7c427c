// The fixture of the integration tests that run a local cluster
// (`loomctl local up`: real daemons on loopback, or in network namespaces
// the test makes) and the helpers they share, for tests/cluster_test.cc and
// tests/ha_test.cc. Included by one translation unit per test binary (its
// helpers sit in an unnamed namespace).
#ifndef LOOM_TESTS_CLUSTER_FIXTURE_H_
#define LOOM_TESTS_CLUSTER_FIXTURE_H_

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli/local_cluster.h"
#include "cli/local_postgres.h"
#include "common/file_util.h"
#include "common/formats/data.h"
#include "controller/service/access.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "loom/v1/service.grpc.pb.h"
#include "tests/cpu_quota.h"
#include "tests/netns_lab.h"
#include "tests/test_util.h"

namespace loom {
namespace {

using ::loom::testing::RunCommand;
using ::loom::testing::ShellQuote;
using ::testing::HasSubstr;

const std::string kBin = LOOM_BIN_DIR;
// loom_cluster_test runs on the default store (SQLite); loom_cluster_pg_test
// is the same tests with the controller on PostgreSQL.
#ifdef LOOM_CLUSTER_TESTS_ON_POSTGRES
constexpr char kStoreFlag[] = " --store postgres";
#else
constexpr char kStoreFlag[] = "";
#endif

bool WaitFor(const std::function<bool()>& pred, int seconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return pred();
}

// Pids of the rank processes whose command line mentions `job` and `home`
// (the assignment path is <home>/workers/<i>/<job>/...): the ranks of this
// test's cluster only, not those of a test beside it (ctest -j runs each
// cluster test on both stores at once, with the same job ids).
std::set<int> RankPids(const std::string& job, const std::string& home) {
  std::set<int> pids;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    int pid = atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string cmd = loom::testing::RankProcessIdentity(pid);
    if (cmd.find(job) != std::string::npos && cmd.find(home) != std::string::npos &&
        loom::testing::ProcessAlive(pid)) {
      pids.insert(pid);
    }
  }
  closedir(d);
  return pids;
}

// How many of them there are.
int CountRankProcesses(const std::string& needle, const std::string& home) {
  return static_cast<int>(RankPids(needle, home).size());
}

// A job's states without its rendezvous retries (defined below).
std::vector<loom::v1::JobState> StatesWithoutRendezvousRetries(const loom::v1::Job& job,
                                                               int* retries = nullptr);

class ClusterTest : public ::testing::Test {
 protected:
  // Two workers, a queue file with priority class `high` and preemption
  // after a grace of `grace_s` (no minimum run time).
  void StartPreemptionCluster(int grace_s) {
    const std::string queues = loom::testing::MakeTempDir("loom_preempt") + "/queues.yaml";
    std::ofstream(queues) << "preemption: {grace_seconds: " << grace_s
                          << ", min_run_time_seconds: 0}\npriority_classes: {high: 100}\n";
    StartCluster(2, /*worker_timeout_s=*/10, "--queues " + queues);
  }

  void StartCluster(int workers, double worker_timeout_s = 10, const std::string& extra = "") {
    home_ = loom::testing::MakeTempDir("loom_cluster_test");
    auto r = Ctl(absl::StrCat("local up --workers ", workers, " --worker-timeout ",
                              worker_timeout_s, " ", extra, kStoreFlag));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    // With --ha, controller-0 leads at first.
    auto ctl = cli::ReadReadyFile(home_ + "/run/controller.json");
    if (!ctl.ok()) ctl = cli::ReadReadyFile(home_ + "/run/controller-0.json");
    ASSERT_TRUE(ctl.ok());
    controller_ = ctl->grpc_address;
    controller_metrics_ = ctl->metrics_address;
    token_ = std::string(absl::StripAsciiWhitespace(*ReadFile(home_ + "/token")));
    PrepareData();
  }

  void TearDown() override {
    if (home_.empty()) return;
    Ctl("local down");
    // A --ha cluster's database lives outside the home under root.
    EXPECT_TRUE(cli::RemoveLocalPostgres(home_).ok());
  }

  loom::testing::CommandResult Ctl(const std::string& args) {
    return RunCommand(
        absl::StrCat(ctl_prefix_, kBin, "/loomctl --home ", ShellQuote(home_), " ", args));
  }

  // The cluster of StartCluster with every daemon in its own network
  // namespace (the controller in lab_ member 0, worker i in member i + 1),
  // so that a test can cut one off with iptables. loomctl runs in the
  // controller's namespace.
  void StartNetnsCluster(int workers, double worker_timeout_s, int slots) {
    auto lab = loom::testing::NetnsLab::Create(workers + 1, "ct");
    ASSERT_TRUE(lab.ok()) << lab.status();
    lab_ = *std::move(lab);
    home_ = loom::testing::MakeTempDir("loom_netns_test");
    cli::LocalClusterOptions o;
    o.home = home_;
    o.bin_dir = kBin;
    o.workers = workers;
    o.slots_per_worker = slots;
    o.worker_timeout_s = worker_timeout_s;
    // (Its unix socket reaches across network namespaces.)
    o.postgres = std::string(kStoreFlag).find("postgres") != std::string::npos;
    o.controller_prefix = lab_->prefix(0);
    o.controller_host = lab_->address(0);
    for (int i = 0; i < workers; ++i) {
      o.worker_prefix.push_back(lab_->prefix(i + 1));
      o.worker_address.push_back(lab_->address(i + 1));
    }
    auto up = cli::LocalUp(o);
    ASSERT_TRUE(up.ok()) << up.status();
    ctl_prefix_ = lab_->shell_prefix(0);
    auto ctl = cli::ReadReadyFile(home_ + "/run/controller.json");
    ASSERT_TRUE(ctl.ok());
    controller_ = ctl->grpc_address;
    token_ = std::string(absl::StripAsciiWhitespace(*ReadFile(home_ + "/token")));
    PrepareData();
  }

  // The newest committed checkpoint of `job` at `step`, by the catalog.
  std::string CheckpointPathAt(const std::string& job, int64_t step) {
    auto listed = Ctl("-o json checkpoints " + job);
    EXPECT_EQ(listed.exit_code, 0) << listed.err;
    loom::v1::ListCheckpointsResponse catalog;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &catalog).ok());
    for (const auto& c : catalog.checkpoints()) {
      if (c.step() == step) return c.path();
    }
    return "";
  }

  // loom-ckpt digest of a checkpoint's parameters.
  std::string Digest(const std::string& path) {
    auto r = RunCommand(absl::StrCat(kBin, "/loom-ckpt digest ", ShellQuote(path)));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return r.out.substr(0, r.out.find(' '));
  }

  void PrepareData() {
    // Three real English text files from Debian's fortunes package.
    std::string inputs;
    for (const char* f : {"fortunes", "literature", "riddles"}) {
      inputs += absl::StrCat(" /usr/share/games/fortunes/", f);
    }
    auto r = Ctl(
        absl::StrCat("data prepare --input", inputs, " --out ", home_, "/data --val-fraction 0.1"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_THAT(r.out, HasSubstr("tokenizer: byte-level, vocabulary 256"));
  }

  // A small job; `steps` large makes it run until cancelled.
  // A preempted job's states, without rendezvous retries: placed, running,
  // then per preemption PREEMPTED and placed again, running again; except
  // that a job placed again may be preempted once more before its ranks
  // start (SCHEDULED -> PREEMPTED: nothing trained, nothing lost). It ends
  // running, then SUCCEEDED, preempted `preemptions` times.
  void ExpectPreemptedStates(const loom::v1::Job& done, int64_t preemptions) {
    const std::vector<loom::v1::JobState> got = StatesWithoutRendezvousRetries(done);
    ASSERT_GE(got.size(), 4u) << done.DebugString();
    EXPECT_EQ(got[0], loom::v1::PENDING);
    EXPECT_EQ(got[1], loom::v1::SCHEDULED);
    EXPECT_EQ(got[2], loom::v1::RUNNING);
    EXPECT_EQ(got[got.size() - 2], loom::v1::RUNNING) << done.DebugString();
    EXPECT_EQ(got.back(), loom::v1::SUCCEEDED);
    int64_t preempted = 0;
    for (size_t i = 3; i + 1 < got.size(); ++i) {
      if (got[i] == loom::v1::PREEMPTED) {
        ++preempted;
        EXPECT_TRUE(got[i - 1] == loom::v1::RUNNING || got[i - 1] == loom::v1::SCHEDULED)
            << done.DebugString();
        EXPECT_EQ(got[i + 1], loom::v1::SCHEDULED) << done.DebugString();
      } else if (got[i] == loom::v1::SCHEDULED) {
        EXPECT_TRUE(got[i + 1] == loom::v1::RUNNING || got[i + 1] == loom::v1::PREEMPTED)
            << done.DebugString();
      } else {
        EXPECT_EQ(got[i], loom::v1::RUNNING) << done.DebugString();
      }
    }
    EXPECT_EQ(preempted, preemptions) << done.DebugString();
  }

  // Replaces every sample of data batches [begin, end) of the cluster's
  // training shard (in the data order of `seed`, `seq_len` tokens a
  // sample, `global_batch` samples a batch) by random bytes: a job with
  // those settings sees its loss spike there.
  void PoisonDataBatches(int64_t begin, int64_t end, int seq_len, int global_batch, uint64_t seed) {
    const std::string shard = home_ + "/data/train_000000.bin";
    auto tokens = engine::ReadShard(shard);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    auto dataset = engine::TokenDataset::FromShards({*tokens}, seq_len);
    ASSERT_TRUE(dataset.ok());
    std::mt19937 rng(99);
    for (int64_t d = begin; d < end; ++d) {
      for (int j = 0; j < global_batch; ++j) {
        int64_t sample = dataset->SampleAt(seed, d * global_batch + j);
        for (int64_t k = 0; k <= seq_len; ++k) (*tokens)[sample * seq_len + k] = rng() % 256;
      }
    }
    ASSERT_TRUE(engine::WriteShard(shard, *tokens).ok());
  }

  std::string WriteSpec(const std::string& name, int steps, int workers,
                        const std::string& extra = "") {
    std::string path = absl::StrCat(home_, "/", name, ".yaml");
    std::ofstream out(path);
    out << "name: " << name << R"(
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data:
  train: ["data/train_*.bin"]
  validation: ["data/val_*.bin"]
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule:
  total_steps: )"
        << steps << R"(
  warmup_steps: 5
  eval_interval: 20
  eval_batches: 4
batch: {global_batch: 8, micro_batch: 4}
resources: {workers: )"
        << workers << ", ranks: " << workers << R"(}
seed: 7
)"
        << (extra.find("checkpoint:") == std::string::npos
                ? "checkpoint: {interval_steps: 20, keep: 2}\n"
                : "")
        << extra;
    return path;
  }

  loom::v1::Job Status(const std::string& job) {
    auto r = Ctl("-o json status " + job);
    loom::v1::Job j;
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &j).ok()) << r.out;
    return j;
  }

  std::string Submit(const std::string& spec_path) {
    auto r = Ctl("submit " + spec_path);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::string id(absl::StripAsciiWhitespace(r.out));
    EXPECT_EQ(id.rfind("submitted ", 0), 0u) << r.out;
    return id.substr(std::string("submitted ").size());
  }

  std::vector<cli::DaemonInfo> Daemons() { return cli::LocalStatus(home_); }

  void SpikeRollsBackSkipsAndMatchesAReplay(const std::string& layout,
                                            const std::string& cluster_flags);

  // kill -9 of the local worker daemon of `node` ("local-<i>").
  void KillWorkerOnNode(const std::string& node) {
    const std::string name = "worker-" + node.substr(node.rfind('-') + 1);
    int pid = 0;
    for (const auto& d : Daemons()) {
      if (d.name == name) pid = d.pid;
    }
    ASSERT_GT(pid, 0) << name;
    ASSERT_EQ(kill(pid, SIGKILL), 0);
  }

  // Every step of `job` (1..steps) trained and reported exactly once, in
  // order, and every checkpoint of interval 20 in its catalog: nothing a
  // controller acknowledged was lost.
  void ExpectEveryStepOnceAndEveryCheckpoint(const std::string& job, int steps) {
    loom::v1::GetStepMetricsResponse metrics;
    ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &metrics));
    std::vector<int64_t> trained;
    for (const auto& m : metrics.steps()) {
      if (m.step() > 0) trained.push_back(m.step());
    }
    ASSERT_EQ(trained.size(), static_cast<size_t>(steps));
    for (int i = 0; i < steps; ++i) ASSERT_EQ(trained[i], i + 1);
    auto listed = Ctl("-o json checkpoints " + job);
    ASSERT_EQ(listed.exit_code, 0) << listed.err;
    loom::v1::ListCheckpointsResponse catalog;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &catalog).ok());
    std::set<int64_t> at;
    for (const auto& c : catalog.checkpoints()) at.insert(c.step());
    for (int step = 20; step <= steps; step += 20) EXPECT_TRUE(at.count(step)) << step;
  }

  // Every step report the controller kept for `job`, both attempts'.
  void GetStepMetrics(const std::string& job, loom::v1::GetStepMetricsResponse* steps) {
    auto stub = loom::v1::JobService::NewStub(*cli::LocalControllerChannel(home_, controller_));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    loom::v1::GetStepMetricsRequest req;
    req.set_job_id(job);
    ASSERT_TRUE(stub->GetStepMetrics(&ctx, req, steps).ok());
  }

  void CheckMetrics(const std::string& address, const std::vector<std::string>& expected) {
    // Gauges are refreshed by the daemons' loops (every 100 ms): poll briefly.
    loom::testing::HttpResponse resp;
    WaitFor(
        [&] {
          resp = loom::testing::HttpGet(address, "/metrics");
          for (const auto& name : expected) {
            if (resp.body.find(name) == std::string::npos) return false;
          }
          return true;
        },
        5);
    ASSERT_EQ(resp.status, 200) << address;
    EXPECT_THAT(resp.headers, HasSubstr("text/plain; version=0.0.4"));
    for (const auto& name : expected) EXPECT_THAT(resp.body, HasSubstr(name)) << address;
    std::string file = home_ + "/metrics.txt";
    ASSERT_TRUE(WriteFileAtomically(file, resp.body).ok());
    auto check = RunCommand("promtool check metrics < " + file);
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err << "\n" << resp.body;
    EXPECT_EQ(check.out + check.err, "") << "promtool lint findings for " << address;
  }

  std::string home_;
  std::string controller_;
  std::string controller_metrics_;
  std::string token_;
  // Declared after home_ so that it goes last: TearDown stops the daemons
  // before the namespaces are removed.
  std::unique_ptr<loom::testing::NetnsLab> lab_;
  std::string ctl_prefix_;  // StartNetnsCluster: "ip netns exec <controller's> "
};

// The states `job` went through, without the attempts that were placed
// again after a rendezvous failure (a rank could not join its process
// groups before any step, e.g. another process took the rendezvous port:
// JobManagerOptions::max_rendezvous_retries). Those lose no work and count
// no restart, and a loaded machine may see one; each is a PENDING whose
// reason says "rendezvous retry", followed by the states that led back to
// where the attempt had been. `retries` (may be null) gets their number.
std::vector<loom::v1::JobState> StatesWithoutRendezvousRetries(const loom::v1::Job& job,
                                                               int* retries) {
  std::vector<loom::v1::JobState> states;
  int n = 0;
  const auto& h = job.history();
  for (int i = 0; i < h.size(); ++i) {
    if (h[i].to() == loom::v1::PENDING && i > 0 &&
        h[i].reason().find("rendezvous retry") != std::string::npos) {
      ++n;
      const loom::v1::JobState back_to = h[i - 1].to();
      while (i + 1 < h.size() && h[i + 1].to() != back_to) ++i;
      ++i;  // the transition back to where the failed attempt had been
      continue;
    }
    states.push_back(h[i].to());
  }
  if (retries != nullptr) *retries = n;
  return states;
}

// `job`'s recovery events but SLOW_RANK ones: slow-rank detection runs on
// every multi-rank job and, on a machine loaded by the other tests, may name
// a rank; with the default action ("report") that changes nothing, and the
// tests of other recoveries check their own events' sequence.
std::vector<loom::v1::RecoveryEvent> RecoveryEvents(const loom::v1::Job& job) {
  std::vector<loom::v1::RecoveryEvent> out;
  for (const auto& e : job.events()) {
    if (e.kind() != loom::v1::RecoveryEvent::SLOW_RANK) out.push_back(e);
  }
  return out;
}

}  // namespace
}  // namespace loom

#endif  // LOOM_TESTS_CLUSTER_FIXTURE_H_
