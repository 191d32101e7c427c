// elastic: one elastic job through a fault every 30-50 s on a real local
// cluster of 4 workers.
//
// An uninterrupted 4-rank run of the job goes first: its loss at every step
// is the reference, and, since slow-rank detection is on by default, it is
// also the clean run in which no rank may be named slow. Then the same job,
// elastic between 1 and 4 ranks with recovery.slow_rank.action "cordon",
// trains through, in order:
//   1. worker-kill: kill -9 of a worker daemon hosting a rank (not rank 0):
//      the job shrinks to the workers left;
//   2. worker-returns: that daemon starts again (a rebooted node): the job
//      grows back;
//   3. preempt-part: a high-priority 1-rank job that may not be preempted
//      arrives: the job saves, stops, comes back at once on the other slots
//      (re-planned smaller) and grows back when the other job ends;
//   4. slow-rank: a worker and its rank get 15% of one CPU (a cgroup this
//      bench makes): the controller names the rank, cordons the node and the
//      job moves off it; it grows back when the cordon ends;
//   5. controller-kill: kill -9 of the controller, started again within the
//      workers' lease: its ranks are re-adopted.
// For each fault it prints the recovery time (from the fault to the first
// step trained after it under the new layout, or for the controller to the
// first step report it takes) and the steps lost (the events' steps_lost).
// At the end: the job's ETTR from its goodput buckets (controller/progress/goodput.h),
// its data ledger (every batch once), and the worst relative loss difference
// against the reference, within 20 steps of a re-plan from a checkpoint
// still on the reference's path and elsewhere (the trajectories drift apart
// slowly once a reduction order differs: docs/recovery.md).
//
// Needs root (the cgroup). Usage:
//   loom_elastic_bench BIN_DIR [STEPS (3000)] [CLEAN_SECONDS (0)]
// CLEAN_SECONDS > 0 adds a clean run of that long (a 4-rank job cancelled
// then) in which no rank may be named slow either.
// Last line: elastic: ETTR <x> over <n> faults, loss max rel diff <y>
// ratio=<x/0.95>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/local_cluster.h"
#include "controller/progress/goodput.h"
#include "google/protobuf/util/json_util.h"
#include "loom/v1/service.pb.h"
#include "tests/cpu_quota.h"
#include "tests/test_util.h"

namespace {

using loom::testing::RunCommand;
using loom::testing::WaitFor;
using loom::testing::ShellQuote;
using loom::v1::RecoveryEvent;

constexpr int kWorkers = 4;
constexpr int kCordonSeconds = 40;

int Die(const std::string& msg) {
  std::cerr << "elastic bench: " << msg << std::endl;
  return 1;
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

class Cluster {
 public:
  Cluster(std::string bin, std::string home) : bin_(std::move(bin)), home_(std::move(home)) {}

  loom::testing::CommandResult Ctl(const std::string& args) const {
    return RunCommand(absl::StrCat(bin_, "/loomctl --home ", ShellQuote(home_), " ", args));
  }
  bool Status(const std::string& job, loom::v1::Job* out) const {
    auto r = Ctl("-o json status " + job);
    return r.exit_code == 0 && google::protobuf::util::JsonStringToMessage(r.out, out).ok();
  }
  loom::v1::Job Status(const std::string& job) const {
    loom::v1::Job j;
    Status(job, &j);
    return j;
  }
  std::string Submit(const std::string& spec) const {
    auto r = Ctl("submit " + spec);
    std::string out(absl::StripAsciiWhitespace(r.out));
    if (r.exit_code != 0 || out.rfind("submitted ", 0) != 0) {
      std::cerr << "submit " << spec << ": " << r.out << r.err;
      return "";
    }
    return out.substr(std::string("submitted ").size());
  }
  std::vector<loom::v1::StepMetrics> Steps(const std::string& job) const {
    loom::v1::GetStepMetricsResponse records;
    auto listed = Ctl("-o json steps " + job);
    if (!google::protobuf::util::JsonStringToMessage(listed.out, &records).ok()) return {};
    return {records.steps().begin(), records.steps().end()};
  }
  int DaemonPid(const std::string& name) const {
    for (const auto& d : loom::cli::LocalStatus(home_)) {
      if (d.name == name && d.alive) return d.pid;
    }
    return 0;
  }
  bool Restart(const std::string& name) const {
    auto r = loom::cli::LocalRestart(home_, name, /*kill_first=*/false);
    if (!r.ok()) std::cerr << "restart " << name << ": " << r.status() << std::endl;
    return r.ok();
  }

 private:
  std::string bin_;
  std::string home_;
};

// The job: a 4-layer GPT on 24-sequence global batches (micro-batch 2, so
// that 1 to 4 data-parallel ranks all divide it), 4 ranks on 4 workers.
std::string WriteSpec(const std::string& home, const std::string& name, int steps, bool elastic) {
  const std::string path = absl::StrCat(home, "/", name, ".yaml");
  std::ofstream(path) << "name: " << name << R"(
model:
  gpt: {n_layer: 4, n_head: 4, d_model: 128, seq_len: 64, vocab_size: 256}
data:
  train: [")" << home << R"(/data/train_*.bin"]
optimizer:
  adamw: {lr: 0.001, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )"
                      << steps << R"(, warmup_steps: 20}
batch: {global_batch: 24, micro_batch: 2}
resources: {workers: 4, ranks: 4}
checkpoint: {interval_steps: 50, keep: 4}
seed: 13
recovery:
  disable_spike_detection: true
)"
                      << (elastic ? absl::StrCat("  slow_rank: {action: cordon, cordon_seconds: ",
                                                 kCordonSeconds,
                                                 "}\nelastic: {min_ranks: 1, max_ranks: 4}\n")
                                  : std::string());
  return path;
}

struct Fault {
  std::string name;
  int64_t at_ms = 0;         // when it was injected
  int64_t recovered_ms = 0;  // the first step trained after it (0: never)
  int64_t steps_lost = 0;
  std::string note;
};

// Events of `kind` recorded at or after `since_ms`.
std::vector<RecoveryEvent> EventsSince(const loom::v1::Job& j, RecoveryEvent::Kind kind,
                                       int64_t since_ms) {
  std::vector<RecoveryEvent> out;
  for (const auto& e : j.events()) {
    if (e.kind() == kind && e.time_unix_ms() >= since_ms) out.push_back(e);
  }
  return out;
}

// When the first step of an attempt newer than `generation` started (its
// report's time less its step time), from the step records; 0 if none yet.
int64_t FirstStepOfAttemptAfter(const std::vector<loom::v1::StepMetrics>& steps,
                                int64_t generation) {
  int64_t first = 0;
  for (const auto& m : steps) {
    if (m.step() <= 0 || m.generation() <= generation) continue;
    const int64_t started = m.time_unix_ms() - static_cast<int64_t>(m.step_time_seconds() * 1000);
    if (first == 0 || started < first) first = started;
  }
  return first;
}

// A worker daemon hosting a rank other than rank 0 ("worker-<i>").
std::string WorkerOfALaterRank(const loom::v1::Job& j) {
  for (const auto& a : j.ranks()) {
    if (a.rank() != 0) return "worker-" + a.node().substr(a.node().rfind('-') + 1);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Die("usage: loom_elastic_bench BIN_DIR [STEPS] [CLEAN_SECONDS]");
  if (geteuid() != 0) return Die("needs root (a CPU-quota cgroup slows a rank)");
  const std::string bin = argv[1];
  const int steps = argc > 2 ? std::max(1500, atoi(argv[2])) : 3000;
  const int clean_seconds = argc > 3 ? std::max(0, atoi(argv[3])) : 0;

  const std::string home = loom::testing::MakeTempDir("loom_elastic_bench");
  loom::cli::LocalClusterOptions o;
  o.home = home;
  o.bin_dir = bin;
  o.workers = kWorkers;
  o.slots_per_worker = 1;
  // As a worker alone on its node runs: a warm rank per slot, so that a
  // restart or re-plan skips process start-up.
  o.warm_ranks = 1;
  o.worker_timeout_s = 2;
  o.queues_file = home + "/queues.yaml";
  std::ofstream(o.queues_file) << "preemption: {grace_seconds: 30, min_run_time_seconds: 0}\n"
                                  "priority_classes: {urgent: 1000}\n";
  auto up = loom::cli::LocalUp(o);
  if (!up.ok()) return Die(up.status().ToString());
  const loom::testing::RunOnExit down(
      absl::StrCat(bin, "/loomctl --home ", ShellQuote(home), " local down"));
  Cluster cluster(bin, home);
  auto prep = RunCommand(
      absl::StrCat(bin,
                   "/loomctl data prepare --input /usr/share/games/fortunes/fortunes "
                   "/usr/share/games/fortunes/literature /usr/share/games/fortunes/riddles --out ",
                   home, "/data"));
  if (prep.exit_code != 0) return Die(prep.err);

  // --- the uninterrupted reference, and the clean run(s)
  const auto t_ref = std::chrono::steady_clock::now();
  const std::string reference = cluster.Submit(WriteSpec(home, "uncut", steps, false));
  loom::v1::Job ref;
  if (reference.empty() ||
      !WaitFor(
          [&] { return cluster.Status(reference, &ref) && ref.state() == loom::v1::SUCCEEDED; },
          900)) {
    return Die("the uninterrupted run did not succeed: " + ref.DebugString());
  }
  std::map<int64_t, double> want;
  int64_t judged_reports = 0;
  for (const auto& m : cluster.Steps(reference)) {
    if (m.step() > 0) want[m.step()] = m.loss();
  }
  judged_reports += static_cast<int64_t>(want.size());
  if (static_cast<int>(want.size()) != steps) return Die("the reference's step records are short");
  int false_positives = static_cast<int>(EventsSince(ref, RecoveryEvent::SLOW_RANK, 0).size());
  const double ref_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_ref).count();
  std::cout << absl::StrFormat(
      "reference: %d steps on 4 ranks in %.1f s, final loss %.5f, %d rank(s) named slow\n", steps,
      ref_s, want.rbegin()->second, false_positives);
  if (clean_seconds > 0) {
    const std::string clean = cluster.Submit(WriteSpec(home, "clean", 10000000, false));
    std::this_thread::sleep_for(std::chrono::seconds(clean_seconds));
    const loom::v1::Job c = cluster.Status(clean);
    const int named = static_cast<int>(EventsSince(c, RecoveryEvent::SLOW_RANK, 0).size());
    std::cout << absl::StrFormat("clean run: %d s, %d steps on 4 ranks, %d rank(s) named slow\n",
                                 clean_seconds, c.summary().last_step(), named);
    false_positives += named;
    judged_reports += c.summary().last_step();
    cluster.Ctl("cancel " + clean);
    WaitFor([&] { return cluster.Status(clean).state() == loom::v1::CANCELLED; }, 30);
    WaitFor([&] { return cluster.Status(clean).ranks_size() == 0; }, 10);
  }

  // --- the elastic run
  const auto t_run = std::chrono::steady_clock::now();
  const std::string job = cluster.Submit(WriteSpec(home, "elastic", steps, true));
  if (job.empty()) return Die("could not submit the elastic job");
  loom::v1::Job j;
  auto full_and_training = [&](int ranks) {
    return cluster.Status(job, &j) && j.state() == loom::v1::RUNNING && j.ranks_size() == ranks;
  };
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count();
  };
  auto settle_until = [&](double second) {
    while (elapsed() < second && cluster.Status(job).state() != loom::v1::SUCCEEDED) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  };
  // Waits for the job to train under a layout newer than `generation` (and
  // with `ranks` ranks when > 0); fills the fault's recovery time.
  auto recovered = [&](Fault& f, int64_t generation, int ranks, double timeout) {
    const bool ok = WaitFor(
        [&] {
          if (!cluster.Status(job, &j)) return false;
          if (j.state() == loom::v1::SUCCEEDED) return true;
          if (j.generation() <= generation || j.state() != loom::v1::RUNNING) return false;
          if (ranks > 0 && j.ranks_size() != ranks) return false;
          return FirstStepOfAttemptAfter(cluster.Steps(job), generation) > 0;
        },
        timeout);
    if (ok && j.state() == loom::v1::RUNNING) {
      f.recovered_ms = FirstStepOfAttemptAfter(cluster.Steps(job), generation);
    }
    return ok;
  };
  auto lost_since = [&](int64_t since_ms) {
    const loom::v1::Job now = cluster.Status(job);
    int64_t lost = 0;
    for (RecoveryEvent::Kind k : {RecoveryEvent::REPLANNED, RecoveryEvent::PREEMPTED,
                                  RecoveryEvent::RESTART, RecoveryEvent::ROLLBACK}) {
      for (const auto& e : EventsSince(now, k, since_ms)) lost += e.steps_lost();
    }
    return lost;
  };
  std::vector<Fault> faults;
  if (!WaitFor([&] { return full_and_training(4) && j.summary().last_step() >= 50; }, 120)) {
    return Die("the elastic job never trained on 4 ranks: " + j.DebugString());
  }

  // 1-2. A worker killed, then back.
  settle_until(25);
  {
    Fault f{"worker-kill"};
    cluster.Status(job, &j);
    const int64_t generation = j.generation();
    const std::string daemon = WorkerOfALaterRank(j);
    const int pid = cluster.DaemonPid(daemon);
    f.at_ms = NowMs();
    if (pid > 0) ::kill(pid, SIGKILL);
    recovered(f, generation, 0, 60);
    f.note = absl::StrCat("kill -9 ", daemon, "; now ", j.ranks_size(), " rank(s)");
    f.steps_lost = lost_since(f.at_ms);
    faults.push_back(f);

    settle_until(elapsed() + 10);
    Fault back{"worker-returns"};
    cluster.Status(job, &j);
    const int64_t shrunk = j.generation();
    back.at_ms = NowMs();
    cluster.Restart(daemon);
    recovered(back, shrunk, 4, 90);
    back.note = absl::StrCat(daemon, " started again; now ", j.ranks_size(), " rank(s)");
    back.steps_lost = lost_since(back.at_ms);
    faults.push_back(back);
  }

  // 3. Part of the job preempted by a 1-rank urgent job.
  settle_until(elapsed() + 15);
  {
    Fault f{"preempt-part"};
    const std::string urgent_path = home + "/urgent.yaml";
    {
      std::ifstream in(WriteSpec(home, "urgent-base", 600, false));
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      text = absl::StrReplaceAll(text, {{"name: urgent-base", "name: urgent"},
                                        {"resources: {workers: 4, ranks: 4}",
                                         "resources: {workers: 1, ranks: 1}\n"
                                         "scheduling: {priority: urgent, preemptible: false}"}});
      std::ofstream(urgent_path) << text;
    }
    cluster.Status(job, &j);
    const int64_t generation = j.generation();
    f.at_ms = NowMs();
    const std::string urgent = cluster.Submit(urgent_path);
    recovered(f, generation, 0, 90);
    f.note = absl::StrCat("urgent 1-rank job ", urgent, "; now ", j.ranks_size(), " rank(s)");
    WaitFor([&] { return cluster.Status(urgent).state() == loom::v1::SUCCEEDED; }, 120);
    const int64_t during = cluster.Status(job).generation();
    Fault regrow{"preempt-part"};
    const bool grew = recovered(regrow, during, 4, 60);
    absl::StrAppend(
        &f.note,
        grew ? absl::StrCat("; grew back to 4 after it ended, in ",
                            absl::StrFormat("%.1f s", (regrow.recovered_ms - f.at_ms) / 1000.0))
             : "; did not grow back");
    f.steps_lost = lost_since(f.at_ms);
    faults.push_back(f);
  }

  // 4. A slow rank: its worker gets 15% of one CPU.
  settle_until(elapsed() + 10);
  double detect_s = -1;
  int64_t detect_steps = -1;
  {
    Fault f{"slow-rank"};
    cluster.Status(job, &j);
    const int64_t generation = j.generation();
    const std::string daemon = WorkerOfALaterRank(j);
    const int pid = cluster.DaemonPid(daemon);
    auto quota = loom::testing::CpuQuotaGroup::Create("loom-elastic-bench", 0.15);
    if (!quota.ok()) return Die(quota.status().ToString());
    (void)(*quota)->Add(pid);
    for (int child : loom::testing::ChildPids(pid)) (void)(*quota)->Add(child);
    const int64_t slowed_step = j.summary().last_step();
    f.at_ms = NowMs();
    std::optional<RecoveryEvent> named;
    WaitFor(
        [&] {
          const std::vector<RecoveryEvent> e =
              EventsSince(cluster.Status(job), RecoveryEvent::SLOW_RANK, f.at_ms);
          if (!e.empty()) named = e[0];
          return named.has_value();
        },
        60);
    recovered(f, generation, 0, 60);
    quota->reset();  // the node is cordoned; its CPU comes back for later
    if (named.has_value()) {
      detect_s = (named->time_unix_ms() - f.at_ms) / 1000.0;
      detect_steps = named->step() - slowed_step;
      f.note = absl::StrFormat(
          "%s at 15%% of a CPU: rank %d named %.2fx its peers %d step(s) and %.1f s later; "
          "node cordoned %d s; now %d rank(s)",
          daemon, named->rank(), named->slowdown(), detect_steps, detect_s, kCordonSeconds,
          j.ranks_size());
    } else {
      f.note = daemon + " at 15% of a CPU: NOT NAMED";
    }
    f.steps_lost = lost_since(f.at_ms);
    faults.push_back(f);
  }

  // 5. The controller killed and started again within the lease.
  settle_until(elapsed() + 10);
  {
    Fault f{"controller-kill"};
    cluster.Status(job, &j);
    const int64_t before = j.summary().last_step();
    const int pid = cluster.DaemonPid("controller");
    f.at_ms = NowMs();
    if (pid > 0) ::kill(pid, SIGKILL);
    cluster.Restart("controller");
    if (WaitFor(
            [&] {
              return cluster.Status(job, &j) &&
                     (j.summary().last_step() > before || j.state() == loom::v1::SUCCEEDED);
            },
            60)) {
      f.recovered_ms = NowMs();
    }
    f.note = absl::StrFormat("restarted; %d rank(s), %d restart(s)", j.ranks_size(), j.restarts());
    f.steps_lost = lost_since(f.at_ms);
    faults.push_back(f);
  }

  if (!WaitFor([&] { return cluster.Status(job, &j) && j.state() == loom::v1::SUCCEEDED; }, 900)) {
    return Die("the elastic job did not succeed: " + j.DebugString());
  }
  const double run_s = elapsed();

  // --- figures
  const std::vector<loom::v1::StepMetrics> records = cluster.Steps(job);
  std::map<int64_t, double> got;
  for (const auto& m : records) {
    if (m.step() > 0) got[m.step()] = m.loss();  // the newest attempt's report last
  }
  std::vector<int64_t> on_path;  // re-plans from a checkpoint the run still matched
  for (const auto& e : j.events()) {
    if (e.kind() != RecoveryEvent::REPLANNED) continue;
    const int64_t c = e.checkpoint_step();
    if (c == 0 || (got.count(c) && want.count(c) &&
                   std::abs(got.at(c) - want.at(c)) <= 1e-6 * std::abs(want.at(c)))) {
      on_path.push_back(c);
    }
  }
  double near = 0, later = 0, worst = 0;
  for (const auto& [s, loss] : got) {
    auto w = want.find(s);
    if (w == want.end()) continue;
    const double d = std::abs(loss - w->second) / std::abs(w->second);
    const bool after = std::any_of(on_path.begin(), on_path.end(),
                                   [s = s](int64_t c) { return s > c && s <= c + 20; });
    (after ? near : later) = std::max(after ? near : later, d);
    worst = std::max(worst, d);
  }
  auto ledger = cluster.Ctl("steps " + job + " --ledger");
  const loom::controller::GoodputBuckets b =
      loom::controller::ComputeGoodput(j, records, absl::Now());

  std::cout << absl::StrFormat(
      "elastic run: %d steps in %.1f s, %d layout generation(s), "
      "%d restart(s), %d preemption(s)\n",
      steps, run_s, j.layout_generation(), j.restarts(), j.preemptions());
  for (const Fault& f : faults) {
    std::cout << absl::StrFormat(
        "fault %-16s recovery %s  steps lost %lld  (%s)\n", f.name,
        f.recovered_ms > 0 ? absl::StrFormat("%5.2f s", (f.recovered_ms - f.at_ms) / 1000.0)
                           : std::string("  never"),
        static_cast<long long>(f.steps_lost), f.note);
  }
  std::cout << absl::StrFormat(
      "goodput: %.1f s productive of %.1f s wall (queued %.1f, preempted waiting %.1f, "
      "recovery waiting %.1f, startup %.1f, restore %.1f, checkpoint stall %.1f, redone %.1f, "
      "unaccounted %.1f)\n",
      b.productive, b.wall, b.queued, b.preempted_waiting, b.recovery_waiting, b.startup,
      b.checkpoint_restore, b.checkpoint_stall, b.redone, b.unaccounted);
  std::cout << "ledger: " << absl::StripAsciiWhitespace(ledger.out) << "\n";
  std::cout << absl::StrFormat(
      "loss rel diff vs the uninterrupted run: %.3g within 20 steps of %d re-plan(s) from a "
      "checkpoint on its path, %.3g elsewhere\n",
      near, static_cast<int>(on_path.size()), later);
  std::cout << absl::StrFormat(
      "slow ranks: named %lld step(s) / %.1f s after the quota; %d named in %lld clean step "
      "report(s)\n",
      static_cast<long long>(detect_steps), detect_s, false_positives,
      static_cast<long long>(judged_reports));
  // Checks: the job ends with every step, every batch once, nothing
  // restarted, every fault recovered, the slow rank named, no false alarm.
  std::vector<std::string> failed;
  if (static_cast<int>(got.size()) != steps) failed.push_back("step records missing");
  if (!absl::StrContains(ledger.out, "0 skipped, 0 duplicated")) failed.push_back("ledger");
  if (j.restarts() != 0) failed.push_back("restarts counted");
  for (const Fault& f : faults) {
    if (f.recovered_ms == 0) failed.push_back(f.name + " never recovered");
  }
  if (detect_steps < 0) failed.push_back("slow rank not named");
  if (false_positives > 0) failed.push_back("a healthy rank named slow");
  if (later > 0.10) failed.push_back("loss drifted more than 10%");
  if (!failed.empty()) {
    std::cout << "FAILED: " << absl::StrJoin(failed, "; ") << std::endl;
    return 1;
  }
  std::cout << absl::StrFormat(
                   "elastic: ETTR %.3f over %d faults, loss max rel diff %.3g ratio=%.3f", b.ettr(),
                   static_cast<int>(faults.size()), worst, b.ettr() / 0.95)
            << std::endl;
  return 0;
}
