// chaos: Jepsen-style fault trials on a real local cluster.
//
// One controller and three workers, each in a network namespace of its own
// (tests/netns_lab.h), train the same small GPT job again and again. Each
// trial submits it and, at a random step, does one of: kill -9 a worker
// daemon that hosts a rank (then starts it again, as a rebooted node
// would), kill -9 one rank process, kill -9 the controller and start it
// again within the workers' lease, kill -9 it and keep it down past the
// lease, cut a worker off from the controller with iptables and heal it
// once the job has moved, fill the checkpoint volume (a small tmpfs)
// during saves and free it again, or preempt it: at random steps,
// three times, a high-priority 2-rank job arrives and takes the job's slots
// (checkpoint-then-preempt); every preemption must lose 0 steps and count no
// restart. Elastic trials run an elastic job of 2 to 3 ranks
// that grows to 3, loses a worker (kill -9, then the node returns) and
// shrinks, then grows back: it must end SUCCEEDED with no restart, every
// data batch of its committed trajectory trained exactly once (loomctl
// steps --ledger), attempts never going backwards, and its losses checked
// against uninterrupted runs of the same spec on fixed 2-rank and 3-rank
// gangs (bench/elastic_check.h: its steps on the first layout bit for bit,
// each re-plan's first step within 1e-12, later steps within 10%, the worst
// printed). The run needs at least 25
// layout generations in all. The daemons' open files, threads and RSS are sampled
// after every trial and must stay under fixed ceilings. Every other trial
// must end SUCCEEDED with final
// parameters bitwise equal (SHA-256 over every parameter, loom-ckpt digest)
// to an uninterrupted run's of the same length (the controller-down trial
// trains 4x longer, against its own reference run, so that its ranks are
// still training when their lease runs out), and no checkpoint the catalog
// lists may be missing or fail verification (loomctl checkpoints --verify).
//
// Needs root (namespaces, iptables, mount). Usage:
//   loom_chaos_bench BIN_DIR [TRIALS (32)] [SEED (1)]
// Last line: chaos: <n>/<n> trials bit-exact, <k> checkpoints lost, <p>
// preemptions (<s> steps lost), <g> layout generations ratio=<passed/n>
// (an elastic trial counts as passed when its checks hold)
#include <dirent.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/elastic_check.h"
#include "cli/local_cluster.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "loom/v1/service.grpc.pb.h"
#include "tests/netns_lab.h"
#include "tests/test_util.h"

namespace {

using loom::testing::RankPidsOf;
using loom::testing::RunCommand;
using loom::testing::ShellQuote;
using loom::testing::WaitFor;

constexpr int kSteps = 1000;
// The controller-down trial's job: the controller stays down past the
// lease (4 s), so the ranks must still be training then. 1,000 steps take
// ~3 s of training here, and its trials struck at step 296 and at step 79
// saw the ranks finish within the lease (restarts=0: no lease tested).
constexpr int kLongSteps = 4 * kSteps;
constexpr int kWorkers = 3;
// Preemptions per "preempt" trial, and those trials in the default mix:
// 8 x 3 = 24 random preemptions.
constexpr int kPreemptionsPerTrial = 3;
constexpr int kPreemptTrials = 8;
// Elastic trials: each grows, shrinks and grows again (3 layout
// generations); 9 of them give the 25 the issue asks for.
constexpr int kElasticTrials = 9;
constexpr int kElasticSteps = 6000;
constexpr int kMinLayoutGenerations = 25;
// Ceilings for every daemon, sampled after each trial.
constexpr int kMaxOpenFiles = 512;
constexpr int kMaxThreads = 256;
constexpr int64_t kMaxRssBytes = int64_t{2} << 30;

int Die(const std::string& msg) {
  std::cerr << "chaos bench: " << msg << std::endl;
  return 1;
}

class Cluster {
 public:
  Cluster(std::string bin, std::string home, loom::testing::NetnsLab* lab)
      : bin_(std::move(bin)), home_(std::move(home)), lab_(lab) {}

  loom::testing::CommandResult Ctl(const std::string& args) const {
    return RunCommand(absl::StrCat(lab_->shell_prefix(0), bin_, "/loomctl --home ",
                                   ShellQuote(home_), " ", args));
  }

  bool Status(const std::string& job, loom::v1::Job* out) const {
    auto r = Ctl("-o json status " + job);
    return r.exit_code == 0 && google::protobuf::util::JsonStringToMessage(r.out, out).ok();
  }

  std::string Submit(const std::string& spec) const {
    auto r = Ctl("submit " + spec);
    std::string out(absl::StripAsciiWhitespace(r.out));
    if (r.exit_code != 0 || out.rfind("submitted ", 0) != 0) return "";
    return out.substr(std::string("submitted ").size());
  }

  bool Catalog(const std::string& job, bool verify, loom::v1::ListCheckpointsResponse* out) const {
    auto r = Ctl(absl::StrCat("-o json checkpoints ", verify ? "--verify " : "", job));
    return google::protobuf::util::JsonStringToMessage(r.out, out).ok();
  }

  std::string Digest(const std::string& path) const {
    auto r = RunCommand(absl::StrCat(bin_, "/loom-ckpt digest ", ShellQuote(path)));
    if (r.exit_code != 0) return "";
    return r.out.substr(0, r.out.find(' '));
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

  const std::string& home() const { return home_; }
  loom::testing::NetnsLab& lab() const { return *lab_; }

 private:
  std::string bin_;
  std::string home_;
  loom::testing::NetnsLab* lab_;
};

// The trials' job: a 2-worker, 2-rank gang on 8-sequence batches unless
// `shape` gives other batch and resources lines; `tail` adds the rest.
constexpr char kPairShape[] =
    "batch: {global_batch: 8, micro_batch: 4}\nresources: {workers: 2, ranks: 2}\n";
std::string WriteSpec(const std::string& home, const std::string& name, const std::string& tail,
                      int steps = kSteps, const std::string& shape = kPairShape, int seed = 7) {
  const std::string path = absl::StrCat(home, "/", name, ".yaml");
  std::ofstream out(path);
  out << "name: " << name << R"(
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data:
  train: [")"
      << home << R"(/data/train_*.bin"]
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )"
      << steps << R"(, warmup_steps: 5}
recovery: {disable_spike_detection: true, max_restarts: 4}
)"
      << "seed: " << seed << "\n"
      << shape << tail;
  return path;
}

// An elastic job (2 ranks, re-planned between 1 and 3) of the same model on
// 12-sequence global batches; `fixed_ranks` > 0: an uninterrupted reference
// run of the same spec on that many ranks, never re-planned.
std::string WriteElasticSpec(const std::string& home, const std::string& name,
                             int fixed_ranks = 0) {
  const bool elastic = fixed_ranks == 0;
  const int ranks = elastic ? 2 : fixed_ranks;
  return WriteSpec(home, name,
                   absl::StrCat("checkpoint: {interval_steps: 50, keep: 3}\n",
                                elastic ? "elastic: {min_ranks: 1, max_ranks: 3}\n" : ""),
                   kElasticSteps,
                   absl::StrCat("batch: {global_batch: 12, micro_batch: 2}\nresources: {workers: ",
                                ranks, ", ranks: ", ranks, "}\n"),
                   /*seed=*/11);
}

// A daemon's open files, threads and resident bytes (/proc).
struct Usage {
  int files = 0;
  int threads = 0;
  int64_t rss = 0;
};
Usage UsageOf(int pid) {
  Usage u;
  if (DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (dirent* e = readdir(d)) u.files += e->d_name[0] != '.';
    closedir(d);
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) u.threads = atoi(line.c_str() + 8);
    if (line.rfind("VmRSS:", 0) == 0) u.rss = int64_t{atoll(line.c_str() + 6)} * 1024;
  }
  return u;
}

struct Outcome {
  bool succeeded = false;
  bool bit_exact = false;
  int lost = 0;
  std::string note;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Die("usage: loom_chaos_bench BIN_DIR [TRIALS] [SEED]");
  if (geteuid() != 0) return Die("needs root (network namespaces, iptables, a tmpfs mount)");
  const std::string bin = argv[1];
  const int trials = argc > 2 ? std::max(6 + kPreemptTrials + kElasticTrials, atoi(argv[2])) : 41;
  const uint64_t seed = argc > 3 ? strtoull(argv[3], nullptr, 10) : 1;
  std::mt19937_64 rng(seed);

  auto lab = loom::testing::NetnsLab::Create(kWorkers + 1, "ch");
  if (!lab.ok()) return Die(lab.status().ToString());
  const std::string home = loom::testing::MakeTempDir("loom_chaos_bench");
  loom::cli::LocalClusterOptions o;
  o.home = home;
  o.bin_dir = bin;
  o.workers = kWorkers;
  o.slots_per_worker = 1;
  // The lease: long enough that a killed controller is back (start-up and
  // the workers' reconnection) well within it.
  o.worker_timeout_s = 4;
  // Preemption within the default queue, at once (no minimum run time).
  o.queues_file = home + "/queues.yaml";
  std::ofstream(o.queues_file) << "preemption: {grace_seconds: 30, min_run_time_seconds: 0}\n"
                                  "priority_classes: {urgent: 1000}\n";
  o.controller_prefix = (*lab)->prefix(0);
  o.controller_host = (*lab)->address(0);
  for (int i = 0; i < kWorkers; ++i) {
    o.worker_prefix.push_back((*lab)->prefix(i + 1));
    o.worker_address.push_back((*lab)->address(i + 1));
  }
  // The disk-full trial's volume: 3 MiB, a few checkpoints of this model.
  // Mounted before the daemons start: `ip netns exec` gives each a copy of
  // the mount table as it is then.
  const std::string full_dir = home + "/checkpoints/fullvol";
  if (!loom::MakeDirs(full_dir).ok() ||
      ::mount("tmpfs", full_dir.c_str(), "tmpfs", 0, "size=3m") != 0) {
    return Die(absl::StrCat("mount tmpfs on ", full_dir, ": ", std::strerror(errno)));
  }
  const loom::testing::RunOnExit unmount("umount -l " + ShellQuote(full_dir));

  auto up = loom::cli::LocalUp(o);
  if (!up.ok()) return Die(up.status().ToString());
  const loom::testing::RunOnExit down(
      absl::StrCat(bin, "/loomctl --home ", ShellQuote(home), " local down"));
  Cluster cluster(bin, home, lab->get());
  auto prep = RunCommand(
      absl::StrCat(bin,
                   "/loomctl data prepare --input /usr/share/games/fortunes/fortunes "
                   "/usr/share/games/fortunes/literature /usr/share/games/fortunes/riddles --out ",
                   home, "/data"));
  if (prep.exit_code != 0) return Die(prep.err);

  const std::string regular = "checkpoint: {interval_steps: 25, keep: 3}\n";
  // The uninterrupted runs the trials must match: `steps` steps of the
  // same spec; the digest of its final parameters, or empty.
  auto reference_digest = [&](const std::string& name, int steps) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string reference = cluster.Submit(WriteSpec(home, name, regular, steps));
    loom::v1::Job ref;
    if (reference.empty() ||
        !WaitFor(
            [&] { return cluster.Status(reference, &ref) && ref.state() == loom::v1::SUCCEEDED; },
            300)) {
      std::cerr << "the uninterrupted reference run did not succeed: " << ref.DebugString();
      return std::string();
    }
    const double reference_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loom::v1::ListCheckpointsResponse ref_catalog;
    std::string digest;
    if (cluster.Catalog(reference, false, &ref_catalog)) {
      for (const auto& c : ref_catalog.checkpoints()) {
        if (c.step() == steps) digest = cluster.Digest(c.path());
      }
    }
    if (!digest.empty()) {
      std::cout << absl::StrFormat("reference: %d steps in %.1f s, final parameters sha256 %s\n",
                                   steps, reference_s, digest.substr(0, 16));
    }
    return digest;
  };
  const std::string want = reference_digest("uncut", kSteps);
  if (want.empty()) return Die("no digest of the reference run's final checkpoint");
  const std::string want_long = reference_digest("uncut-long", kLongSteps);
  if (want_long.empty()) return Die("no digest of the long reference run's final checkpoint");

  // The trial mix: at least one of each rare kind, the rest kills.
  std::vector<std::string> kinds = {"controller-kill", "controller-kill", "controller-down",
                                    "partition", "disk-full"};
  for (int i = 0; i < kPreemptTrials; ++i) kinds.push_back("preempt");
  for (int i = 0; i < kElasticTrials; ++i) kinds.push_back("elastic");
  while (static_cast<int>(kinds.size()) < trials) {
    kinds.push_back(kinds.size() % 2 == 0 ? "worker-kill" : "rank-kill");
  }
  std::shuffle(kinds.begin(), kinds.end(), rng);

  // The elastic trials' references: the same spec on fixed 2-rank and
  // 3-rank gangs, each one's loss at every step.
  auto losses_of = [&](const std::string& job, loom::v1::GetStepMetricsResponse* records) {
    std::map<int64_t, double> out;
    auto listed = cluster.Ctl("-o json steps " + job);
    if (!google::protobuf::util::JsonStringToMessage(listed.out, records).ok()) return out;
    for (const auto& m : records->steps()) {
      if (m.step() > 0) out[m.step()] = m.loss();  // the newest attempt's last
    }
    return out;
  };
  std::map<int, std::map<int64_t, double>> elastic_refs;  // ranks -> step -> loss
  for (const int ranks : {2, 3}) {
    const std::string reference =
        cluster.Submit(WriteElasticSpec(home, absl::StrCat("elastic-uncut", ranks), ranks));
    loom::v1::Job ref;
    if (reference.empty() ||
        !WaitFor(
            [&] { return cluster.Status(reference, &ref) && ref.state() == loom::v1::SUCCEEDED; },
            600)) {
      return Die("the elastic reference run did not succeed: " + ref.DebugString());
    }
    loom::v1::GetStepMetricsResponse records;
    elastic_refs[ranks] = losses_of(reference, &records);
    if (static_cast<int>(elastic_refs[ranks].size()) != kElasticSteps) {
      return Die("the elastic reference run's step records are incomplete");
    }
    std::cout << absl::StrFormat("elastic reference: %d steps on %d ranks, final loss %.6f\n",
                                 kElasticSteps, ranks, elastic_refs[ranks].rbegin()->second);
  }

  int passed = 0, lost_total = 0, preemptions = 0, preempted_steps_lost = 0;
  int layout_generations = 0;
  std::map<std::string, Usage> peak;  // daemon -> the most it used after any trial
  auto sample_daemons = [&] {
    for (const auto& d : loom::cli::LocalStatus(home)) {
      if (!d.alive) continue;
      const Usage u = UsageOf(d.pid);
      Usage& p = peak[d.name];
      p.files = std::max(p.files, u.files);
      p.threads = std::max(p.threads, u.threads);
      p.rss = std::max(p.rss, u.rss);
    }
  };
  // CHAOS_FIRST_TRIALS=N replays only the first N trials of this mix, with
  // the same random draws as the full run: a failing trial is re-run by
  // its number without the rest (the summary then counts those N).
  int run_trials = trials;
  if (const char* first = std::getenv("CHAOS_FIRST_TRIALS"); first != nullptr && atoi(first) > 0) {
    run_trials = std::min(trials, atoi(first));
  }
  for (int t = 0; t < run_trials; ++t) {
    const std::string& kind = kinds[t];
    const auto start = std::chrono::steady_clock::now();
    if (kind == "elastic") {
      const std::string name = absl::StrCat("trial", t);
      const std::string job = cluster.Submit(WriteElasticSpec(home, name));
      loom::v1::Job j;
      // Layout generation g has trained a step past the checkpoint it
      // resumed from (so its first step is on record for the check below).
      auto at_generation = [&](int g) {
        return WaitFor(
            [&] {
              if (!cluster.Status(job, &j)) return false;
              if (j.state() == loom::v1::SUCCEEDED) return true;
              int64_t resumed_from = 0;
              for (const auto& e : j.events()) {
                if (e.kind() == loom::v1::RecoveryEvent::REPLANNED) {
                  resumed_from = e.checkpoint_step();
                }
              }
              return j.layout_generation() >= g && j.state() == loom::v1::RUNNING &&
                     j.summary().last_step() > resumed_from;
            },
            90);
      };
      std::string note;
      // Room for a third rank: it grows.
      if (job.empty() || !at_generation(1)) note = "never grew";
      // CHAOS_ELASTIC_KILL_STEP=S: the kill waits until the grown job has
      // reported step S (to replay a trial whose kill came at that step).
      if (const char* at = std::getenv("CHAOS_ELASTIC_KILL_STEP");
          at != nullptr && note.empty() && j.state() == loom::v1::RUNNING) {
        WaitFor([&] { return cluster.Status(job, &j) && j.summary().last_step() >= atoi(at); }, 60);
      }
      if (note.empty() && j.state() == loom::v1::RUNNING) {
        std::vector<int> hosts;
        for (const auto& r : j.ranks()) {
          hosts.push_back(std::stoi(r.node().substr(r.node().rfind('-') + 1)));
        }
        const int w = hosts[std::uniform_int_distribution<size_t>(0, hosts.size() - 1)(rng)];
        const std::string daemon = absl::StrCat("worker-", w);
        ::kill(cluster.DaemonPid(daemon), SIGKILL);
        note = absl::StrCat("grew to ", j.ranks_size(), ", killed ", daemon, " at step ",
                            j.summary().last_step());
        const bool shrank = at_generation(2);
        absl::StrAppend(&note,
                        shrank ? absl::StrCat(", shrank to ", j.ranks_size()) : ", DID NOT SHRINK");
        cluster.Restart(daemon);
        const bool regrew = at_generation(3);
        absl::StrAppend(&note, regrew ? absl::StrCat(", grew back to ", j.ranks_size())
                                      : ", did not grow back");
      }
      loom::v1::Job done;
      WaitFor(
          [&] {
            return cluster.Status(job, &done) &&
                   (done.state() == loom::v1::SUCCEEDED || done.state() == loom::v1::FAILED ||
                    done.state() == loom::v1::CANCELLED);
          },
          600);
      layout_generations += done.layout_generation();
      // Every batch of the committed trajectory once; attempts forward.
      auto ledger = cluster.Ctl("steps " + job + " --ledger");
      loom::v1::GetStepMetricsResponse records;
      const std::map<int64_t, double> got = losses_of(job, &records);
      const bool read = !got.empty();
      std::vector<std::pair<int64_t, int64_t>> by_time;  // (time, attempt)
      for (const auto& m : records.steps()) by_time.push_back({m.time_unix_ms(), m.generation()});
      std::sort(by_time.begin(), by_time.end());
      bool forward = read;
      for (size_t i = 1; i < by_time.size(); ++i)
        forward &= by_time[i].second >= by_time[i - 1].second;
      const loom::bench::ElasticCheck check =
          loom::bench::CheckElasticLosses(done, records, elastic_refs, /*last_ranks=*/3);
      const bool ok = done.state() == loom::v1::SUCCEEDED && done.restarts() == 0 &&
                      ledger.exit_code == 0 && forward && check.ok();
      passed += ok;
      std::cout
          << absl::StrFormat(
                 "trial %2d %-16s %-9s restarts=%d %s layouts=%d%s: steps 1-%d on %d ranks %s "
                 "the uninterrupted %d-rank run's; the first step after %d re-plan(s) within "
                 "%.2g of it (%d from a checkpoint past step %d, %d never reported it); later "
                 "steps within %.2g of the 3-rank run's  %5.1f s  (%s; %s%s)\n",
                 t, kind, loom::v1::JobState_Name(done.state()), done.restarts(),
                 ok ? "ok" : "FAILED", done.layout_generation(),
                 check.layouts_known ? "" : " (LAYOUTS UNKNOWN)", check.prefix, check.first_ranks,
                 check.prefix_diff == 0 ? std::string("bit-exact with")
                                        : absl::StrFormat("DIFFER (%.2g) from", check.prefix_diff),
                 check.first_ranks, check.checked, check.first_step_diff, check.past_prefix,
                 check.prefix, check.unreported, check.later,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 absl::StrCat(note, "; re-plans: ", absl::StrJoin(check.replans, ", ")),
                 std::string(absl::StripAsciiWhitespace(ledger.out)),
                 forward ? "" : "; ATTEMPTS WENT BACKWARDS")
          << std::flush;
      sample_daemons();
      continue;
    }
    // The controller-down trial trains kLongSteps: struck by step 500, its
    // ranks have ~10 s of training left when the 4 s lease runs out.
    const int steps = kind == "controller-down" ? kLongSteps : kSteps;
    const int at = std::uniform_int_distribution<int>(30, kSteps / 2)(rng);
    const bool full = kind == "disk-full";
    const std::string name = absl::StrCat("trial", t);
    const std::string checkpoint =
        full ? absl::StrCat("checkpoint: {interval_steps: 25, keep: 2, dir: ", full_dir, "/", name,
                            ", on_save_failure: CONTINUE}\n")
             : regular;
    Outcome out;
    const std::string job = cluster.Submit(WriteSpec(home, name, checkpoint, steps));
    loom::v1::Job j;
    auto step = [&] { return cluster.Status(job, &j) ? j.summary().last_step() : -1; };
    if (job.empty() ||
        !WaitFor([&] { return step() >= at || j.state() == loom::v1::SUCCEEDED; }, 120)) {
      out.note = "never reached the fault's step";
    } else if (j.state() == loom::v1::SUCCEEDED) {
      out.note = "finished before the fault";
    } else {
      const int64_t generation = j.generation();
      std::vector<int> hosts;  // worker indices of the job's ranks
      for (const auto& r : j.ranks()) {
        hosts.push_back(std::stoi(r.node().substr(r.node().rfind('-') + 1)));
      }
      auto moved = [&] {
        return WaitFor([&] { return step() >= 0 && j.generation() > generation; }, 60);
      };
      if (kind == "worker-kill" && !hosts.empty()) {
        const int w = hosts[std::uniform_int_distribution<size_t>(0, hosts.size() - 1)(rng)];
        const std::string daemon = absl::StrCat("worker-", w);
        ::kill(cluster.DaemonPid(daemon), SIGKILL);
        out.note = absl::StrCat("kill -9 ", daemon, " at step ", j.summary().last_step());
        if (!moved()) out.note += "; the job did not restart";
        cluster.Restart(daemon);  // the node comes back
      } else if (kind == "rank-kill") {
        std::set<int> pids = RankPidsOf(job);
        if (!pids.empty()) {
          auto it = pids.begin();
          std::advance(it, std::uniform_int_distribution<size_t>(0, pids.size() - 1)(rng));
          ::kill(*it, SIGKILL);
        }
        out.note = absl::StrCat("kill -9 a rank at step ", j.summary().last_step());
      } else if (kind == "controller-kill" || kind == "controller-down") {
        ::kill(cluster.DaemonPid("controller"), SIGKILL);
        out.note = absl::StrCat("kill -9 the controller at step ", j.summary().last_step());
        if (kind == "controller-down") {
          // Past the lease: the workers stop the ranks themselves.
          WaitFor([&] { return RankPidsOf(job).empty(); }, 30);
          out.note += ", down past the lease";
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(700));
        }
        cluster.Restart("controller");
      } else if (kind == "partition" && !hosts.empty()) {
        const int w = hosts[0];
        const std::set<int> old = RankPidsOf(job);
        (void)cluster.lab().Cut(w + 1, 0);
        out.note = absl::StrCat("cut worker-", w, " off at step ", j.summary().last_step());
        WaitFor(
            [&] {
              for (int pid : old) {
                if (loom::testing::ProcessAlive(pid)) return false;
              }
              return true;
            },
            60);
        if (!moved()) out.note += "; the job did not move";
        (void)cluster.lab().Heal(w + 1, 0);
      } else if (kind == "preempt") {
        // Three preemptions at increasing random steps; each waits until the
        // job is PREEMPTED, the preemptor has finished and the job trains
        // again.
        std::vector<int> at_steps = {at};
        for (int k = 1; k < kPreemptionsPerTrial; ++k) {
          at_steps.push_back(at_steps.back() + std::uniform_int_distribution<int>(60, 140)(rng));
        }
        out.note = "preempted at steps";
        for (int k = 0; k < kPreemptionsPerTrial; ++k) {
          if (k > 0 &&
              !WaitFor([&] { return step() >= at_steps[k] || j.state() == loom::v1::SUCCEEDED; },
                       120)) {
            break;
          }
          if (j.state() == loom::v1::SUCCEEDED) break;
          const int before = j.preemptions();
          const int64_t reached = j.summary().last_step();
          const std::string urgent_spec =
              WriteSpec(home, absl::StrCat(name, "-urgent", k),
                        "scheduling: {priority: urgent}\n" + regular, 40);
          const std::string urgent = cluster.Submit(urgent_spec);
          loom::v1::Job u;
          const bool preempted =
              WaitFor(
                  [&] {
                    return cluster.Status(job, &j) &&
                           (j.preemptions() > before || j.state() == loom::v1::SUCCEEDED);
                  },
                  60) &&
              j.preemptions() > before;
          const bool urgent_done = WaitFor(
              [&] { return cluster.Status(urgent, &u) && u.state() == loom::v1::SUCCEEDED; }, 120);
          absl::StrAppend(&out.note, k > 0 ? "," : "", " ", reached,
                          preempted ? "" : " (not preempted)",
                          urgent_done ? "" : " (the preemptor did not finish)");
          // Back to training before the next one.
          WaitFor([&] { return step() > reached && j.state() == loom::v1::RUNNING; }, 120);
        }
      } else if (full) {
        // Fill the volume until a save fails, then free it.
        const std::string filler = full_dir + "/filler";
        RunCommand("dd if=/dev/zero of=" + filler + " bs=64k 2>/dev/null");
        bool failed = false;
        WaitFor(
            [&] {
              if (!cluster.Status(job, &j)) return false;
              for (const auto& e : j.events()) {
                failed |= e.kind() == loom::v1::RecoveryEvent::CHECKPOINT_FAILED;
              }
              return failed || j.state() == loom::v1::SUCCEEDED;
            },
            60);
        ::unlink(filler.c_str());
        out.note = absl::StrCat("filled the checkpoint volume at step ", at,
                                failed ? ", a save failed" : ", no save failed");
      }
    }
    loom::v1::Job done;
    WaitFor(
        [&] {
          return cluster.Status(job, &done) &&
                 (done.state() == loom::v1::SUCCEEDED || done.state() == loom::v1::FAILED ||
                  done.state() == loom::v1::CANCELLED);
        },
        300);
    out.succeeded = done.state() == loom::v1::SUCCEEDED;
    int trial_lost = 0;
    for (const auto& e : done.events()) {
      if (e.kind() != loom::v1::RecoveryEvent::PREEMPTED) continue;
      preemptions += 1;
      trial_lost += static_cast<int>(e.steps_lost());
    }
    preempted_steps_lost += trial_lost;
    if (kind == "preempt") {
      absl::StrAppend(&out.note, "; ", done.preemptions(), " preemption(s), ", trial_lost,
                      " step(s) lost");
      if (done.preemptions() < kPreemptionsPerTrial) out.note += " (FEWER THAN ASKED)";
    }
    if (kind == "controller-down" && done.restarts() == 0) {
      out.note += "; the ranks finished within the lease, which this trial did not test";
    }
    loom::v1::ListCheckpointsResponse catalog;
    if (!cluster.Catalog(job, /*verify=*/true, &catalog)) {
      out.note += "; the catalog could not be read";
    }
    std::string final_path;
    for (const auto& c : catalog.checkpoints()) {
      if (c.status() == "missing" || c.status() == "corrupt") ++out.lost;
      if (c.step() == steps && c.status() == "committed") final_path = c.path();
    }
    out.bit_exact = out.succeeded && !final_path.empty() &&
                    cluster.Digest(final_path) == (steps == kLongSteps ? want_long : want);
    lost_total += out.lost;
    passed +=
        out.bit_exact && out.lost == 0 && trial_lost == 0 &&
        (kind != "preempt" || (done.preemptions() == kPreemptionsPerTrial && done.restarts() == 0));
    std::cout
        << absl::StrFormat(
               "trial %2d %-16s %-9s restarts=%d %s lost=%d  %5.1f s  (%s)\n", t, kind,
               loom::v1::JobState_Name(done.state()), done.restarts(),
               out.bit_exact ? "bit-exact" : "DIFFERENT", out.lost,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               out.note)
        << std::flush;
    if (full) RunCommand(absl::StrCat("rm -rf ", ShellQuote(full_dir + "/" + name)));
    sample_daemons();
  }
  bool bounded = true;
  for (const auto& [name, u] : peak) {
    const bool ok = u.files <= kMaxOpenFiles && u.threads <= kMaxThreads && u.rss <= kMaxRssBytes;
    bounded &= ok;
    std::cout << absl::StrFormat(
                     "daemon %-10s at most %4d open files, %4d threads, %6.1f MiB "
                     "resident%s\n",
                     name, u.files, u.threads, u.rss / 1048576.0, ok ? "" : "  OVER ITS CEILING")
              << std::flush;
  }
  if (!bounded) {
    std::cout << absl::StrFormat("a daemon went over %d open files, %d threads or %d MiB\n",
                                 kMaxOpenFiles, kMaxThreads, kMaxRssBytes >> 20);
    passed = std::min(passed, run_trials - 1);
  }
  if (run_trials == trials && layout_generations < kMinLayoutGenerations) {
    std::cout << absl::StrFormat("only %d layout generations (at least %d asked)\n",
                                 layout_generations, kMinLayoutGenerations);
    passed = std::min(passed, run_trials - 1);
  }
  std::cout << absl::StrFormat(
      "chaos: %d/%d trials bit-exact, %d checkpoints lost, %d preemptions (%d steps lost), %d "
      "layout generations ratio=%.3f\n",
      passed, run_trials, lost_total, preemptions, preempted_steps_lost, layout_generations,
      static_cast<double>(passed) / run_trials);
  return 0;
}
