#include "tests/failover_cluster.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/local_cluster.h"
#include "cli/local_postgres.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "loom/v1/service.pb.h"
#include "tests/netns_lab.h"
#include "tests/test_util.h"

namespace loom::testing {
namespace {

using Steady = std::chrono::steady_clock;

double SecondsSince(Steady::time_point t) {
  return std::chrono::duration<double>(Steady::now() - t).count();
}

// Waits (bounded) until `done`; false when it never held.
bool WaitUntil(const std::function<bool()>& done, double seconds) {
  const auto deadline = Steady::now() + std::chrono::duration<double>(seconds);
  while (Steady::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

template <typename Message>
bool ParseJson(const std::string& json, Message* m) {
  return google::protobuf::util::JsonStringToMessage(json, m).ok();
}

class Harness {
 public:
  explicit Harness(const FailoverOptions& o) : o_(o) {}
  ~Harness() {
    stop_client_ = true;
    if (client_.joinable()) client_.join();
    if (!home_.empty()) {
      cli::LocalDown(home_).IgnoreError();
      cli::RemoveLocalPostgres(home_).IgnoreError();
    }
  }

  absl::Status Start();
  absl::StatusOr<FailoverCycle> Cycle(const std::string& kind);
  absl::Status Drain();
  void Check(FailoverResult* r);

 private:
  void Log(const std::string& line) {
    if (o_.log) o_.log(line);
  }
  CommandResult Ctl(const std::string& args) {
    return RunCommand(absl::StrCat(lab_->shell_prefix(client_member_), o_.bin_dir,
                                   "/loomctl --home ", ShellQuote(home_), " ", args));
  }
  cli::DaemonInfo Daemon(const std::string& name) {
    auto info = cli::ReadReadyFile(home_ + "/run/" + name + ".json");
    return info.ok() ? *info : cli::DaemonInfo();
  }
  // The controller that leads now ("" when none does, by the ready files).
  std::string Active() {
    for (const char* name : {"controller-0", "controller-1"}) {
      cli::DaemonInfo d = Daemon(name);
      if (d.alive && d.role == "active") return name;
    }
    return "";
  }
  bool Steady2() {
    cli::DaemonInfo a = Daemon("controller-0"), b = Daemon("controller-1");
    return a.alive && b.alive &&
           ((a.role == "active" && b.role == "standby") ||
            (a.role == "standby" && b.role == "active"));
  }
  void ClientLoop();
  // Job n: 400 steps; `long_running` ones run until cancelled, `urgent`
  // ones (40 steps) have priority class "high" and preempt the others.
  std::string WriteSpec(int n, bool long_running, bool urgent);

  const FailoverOptions o_;
  std::unique_ptr<NetnsLab> lab_;
  std::string home_;
  int client_member_ = 0;
  std::thread client_;
  std::atomic<bool> stop_client_{false};
  std::mutex mu_;
  std::vector<std::string> acked_;         // submissions acknowledged (job ids)
  std::vector<std::string> acked_cancel_;  // cancels acknowledged
  std::vector<FailoverCycle> cycles_;
};

std::string Harness::WriteSpec(int n, bool long_running, bool urgent) {
  const std::string path = absl::StrCat(home_, "/job-", n, ".yaml");
  std::ofstream(path) << "name: gang" << n << R"(
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data:
  train: ["data/train_*.bin"]
  validation: ["data/val_*.bin"]
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )"
                      << (long_running ? 100000
                          : urgent     ? 40
                                       : 400)
                      << R"(, warmup_steps: 5, eval_interval: 50, eval_batches: 2}
batch: {global_batch: 8, micro_batch: 4}
resources: {workers: 2, ranks: 2}
seed: 7
checkpoint: {interval_steps: 20, keep: 2}
recovery: {disable_spike_detection: true, max_restarts: 0}
)" << (urgent ? "scheduling: {priority: high}\n" : "");
  return path;
}

absl::Status Harness::Start() {
  // Members: 0 database, 1-2 controllers, then workers, then the client.
  const int members = 3 + o_.workers + 1;
  auto lab = NetnsLab::Create(members, "fo");
  if (!lab.ok()) return lab.status();
  lab_ = *std::move(lab);
  client_member_ = members - 1;
  home_ = MakeTempDir("loom_failover");
  cli::LocalClusterOptions c;
  c.home = home_;
  c.bin_dir = o_.bin_dir;
  c.workers = o_.workers;
  // One gang at a time: a high-priority gang finds the slots taken and
  // preempts.
  c.slots_per_worker = 1;
  c.worker_timeout_s = 10;
  c.ha = true;
  c.postgres_prefix = lab_->prefix(0);
  c.postgres_host = lab_->address(0);
  c.ha_controller_prefix = {lab_->prefix(1), lab_->prefix(2)};
  c.ha_controller_host = {lab_->address(1), lab_->address(2)};
  for (int i = 0; i < o_.workers; ++i) {
    c.worker_prefix.push_back(lab_->prefix(3 + i));
    c.worker_address.push_back(lab_->address(3 + i));
  }
  // A priority class that preempts (checkpoint first, 30 s grace).
  c.queues_file = home_ + "/queues.yaml";
  std::ofstream(c.queues_file) << "preemption: {grace_seconds: 30, min_run_time_seconds: 0}\n"
                                  "priority_classes: {high: 100}\n";
  c.controller_flags = {absl::StrCat("--lease_s=", o_.lease_s),
                        absl::StrCat("--lease_renew_s=", o_.lease_s / 4)};
  auto up = cli::LocalUp(c);
  if (!up.ok()) return up.status();
  Log(absl::StrCat("cluster up under ", home_, ": PostgreSQL at ", lab_->address(0),
                   ", controllers at ", lab_->address(1), " and ", lab_->address(2), ", ",
                   o_.workers, " workers"));
  std::string inputs;
  for (const char* f : {"fortunes", "literature", "riddles"}) {
    inputs += absl::StrCat(" /usr/share/games/fortunes/", f);
  }
  CommandResult prepared = RunCommand(
      absl::StrCat(o_.bin_dir, "/loomctl --home ", ShellQuote(home_), " data prepare --input",
                   inputs, " --out ", home_, "/data --val-fraction 0.1"));
  if (prepared.exit_code != 0) return absl::InternalError("data prepare: " + prepared.err);
  CommandResult workers;
  if (!WaitUntil(
          [&] {
            workers = Ctl("workers");
            return workers.out.find("local-1") != std::string::npos;
          },
          60)) {
    return absl::DeadlineExceededError(
        absl::StrCat("workers did not register: loomctl workers: ", workers.out, workers.err));
  }
  client_ = std::thread([this] { ClientLoop(); });
  // The first fault lands on a cluster with work in flight.
  if (!WaitUntil(
          [&] {
            CommandResult r = Ctl("-o json list --state RUNNING");
            loom::v1::ListJobsResponse jobs;
            return r.exit_code == 0 && ParseJson(r.out, &jobs) && jobs.jobs_size() > 0;
          },
          60)) {
    return absl::DeadlineExceededError("no job started");
  }
  return absl::OkStatus();
}

// Submits a job every few seconds and cancels every fourth soon after it
// is acknowledged; records what the controller acknowledged.
void Harness::ClientLoop() {
  for (int n = 1; !stop_client_.load(); ++n) {
    CommandResult r =
        Ctl("submit " + WriteSpec(n, /*long_running=*/n % 4 == 0, /*urgent=*/n % 5 == 2));
    const std::string out(absl::StripAsciiWhitespace(r.out));
    if (r.exit_code == 0 && absl::StartsWith(out, "submitted ")) {
      const std::string id = out.substr(std::string("submitted ").size());
      {
        std::lock_guard<std::mutex> lock(mu_);
        acked_.push_back(id);
      }
      if (n % 4 == 0) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        if (Ctl("cancel " + id).exit_code == 0) {
          std::lock_guard<std::mutex> lock(mu_);
          acked_cancel_.push_back(id);
        }
      }
    }
    for (int i = 0; i < 15 && !stop_client_.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

absl::StatusOr<FailoverCycle> Harness::Cycle(const std::string& kind) {
  if (!WaitUntil([&] { return Steady2(); }, 60)) {
    return absl::DeadlineExceededError("no active/standby pair to fault");
  }
  FailoverCycle cycle;
  cycle.kind = kind;
  cycle.from = Active();
  cycle.to = cycle.from == "controller-0" ? "controller-1" : "controller-0";
  const int member = cycle.from == "controller-0" ? 1 : 2;
  const int pid = Daemon(cycle.from).pid;
  const std::string to_address = Daemon(cycle.to).grpc_address;
  const auto t0 = Steady::now();
  if (kind == "kill") {
    kill(pid, SIGKILL);
  } else if (kind == "pause") {
    kill(pid, SIGSTOP);
  } else if (kind == "partition") {
    if (absl::Status s = lab_->Cut(member, 0); !s.ok()) return s;
  } else {
    return absl::InvalidArgumentError("unknown fault " + kind);
  }
  // The failover: until the other one answers a request as the leader.
  const bool served =
      WaitUntil([&] { return Ctl("--controller " + to_address + " queues").exit_code == 0; }, 60);
  cycle.failover_seconds = SecondsSince(t0);
  if (!served) return absl::DeadlineExceededError(kind + ": the standby never took over");
  // Put the faulted one back, as a standby.
  if (kind == "kill") {
    auto restarted = cli::LocalRestart(home_, cycle.from, /*kill_first=*/false);
    if (!restarted.ok()) return restarted.status();
  } else if (kind == "pause") {
    kill(pid, SIGCONT);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (absl::Status s = lab_->Heal(member, 0); !s.ok()) return s;
  }
  if (!WaitUntil([&] { return Steady2() && Active() == cycle.to; }, 60)) {
    return absl::DeadlineExceededError(kind + ": the faulted controller did not come back");
  }
  Log(absl::StrFormat("cycle %-9s %s -> %s: failover %.2f s", kind, cycle.from, cycle.to,
                      cycle.failover_seconds));
  cycles_.push_back(cycle);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // jobs train on
  return cycle;
}

absl::Status Harness::Drain() {
  stop_client_ = true;
  if (client_.joinable()) client_.join();
  // Every job ends (the long ones were cancelled).
  const bool drained = WaitUntil(
      [&] {
        for (const char* state : {"PENDING", "SCHEDULED", "RUNNING"}) {
          CommandResult r = Ctl(absl::StrCat("-o json list --state ", state));
          loom::v1::ListJobsResponse jobs;
          if (r.exit_code != 0 || !ParseJson(r.out, &jobs) || jobs.jobs_size() > 0) return false;
        }
        return true;
      },
      300);
  return drained ? absl::OkStatus() : absl::DeadlineExceededError("jobs did not finish");
}

void Harness::Check(FailoverResult* r) {
  std::ostringstream out;
  r->cycles = cycles_;
  std::vector<double> times;
  for (const auto& c : cycles_) times.push_back(c.failover_seconds);
  std::sort(times.begin(), times.end());
  auto rank = [&](double q) {
    if (times.empty()) return 0.0;
    const size_t i = static_cast<size_t>(std::ceil(q * times.size())) - 1;
    return times[std::min(i, times.size() - 1)];
  };
  r->p50_seconds = rank(0.50);
  r->p99_seconds = rank(0.99);
  r->max_seconds = times.empty() ? 0 : times.back();

  // 1. Acknowledged submissions and cancels.
  std::vector<std::string> acked, cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    acked = acked_;
    cancels = acked_cancel_;
  }
  r->acked_submissions = static_cast<int>(acked.size());
  r->acked_cancels = static_cast<int>(cancels.size());
  const std::set<std::string> cancelled(cancels.begin(), cancels.end());
  for (const std::string& id : acked) {
    CommandResult s = Ctl("-o json status " + id);
    loom::v1::Job job;
    if (s.exit_code != 0 || !ParseJson(s.out, &job)) {
      ++r->lost_acked_writes;
      out << "LOST: submission of " << id << " was acknowledged, the controller has no such job\n";
      continue;
    }
    if (cancelled.count(id) && job.state() != loom::v1::CANCELLED) {
      ++r->lost_acked_writes;
      out << "LOST: the cancel of " << id << " was acknowledged, the job ended "
          << loom::v1::JobState_Name(job.state()) << "\n";
    }
  }
  // 2. Every job: no restart; a finished one has every step once and every
  // checkpoint in its catalog.
  CommandResult listed = Ctl("-o json list");
  loom::v1::ListJobsResponse all;
  if (listed.exit_code != 0 || !ParseJson(listed.out, &all)) {
    out << "ERROR: cannot list jobs: " << listed.err << "\n";
  }
  for (const auto& listed_job : all.jobs()) {
    CommandResult s = Ctl("-o json status " + listed_job.id());
    loom::v1::Job job;
    if (s.exit_code != 0 || !ParseJson(s.out, &job)) continue;
    ++r->jobs_checked;
    r->preemptions += job.preemptions();
    for (const auto& e : job.events()) {
      if (e.kind() == loom::v1::RecoveryEvent::PREEMPTED && e.steps_lost() != 0) {
        ++r->lost_acked_writes;
        out << "LOST: the preemption of " << job.id() << " lost " << e.steps_lost() << " step(s)\n";
      }
    }
    if (job.restarts() > 0) {
      out << "RESTARTED: " << job.id() << " restarted " << job.restarts() << " time(s)\n";
    }
    if (job.state() != loom::v1::SUCCEEDED) continue;
    CommandResult st = Ctl("-o json steps " + job.id());
    loom::v1::GetStepMetricsResponse steps;
    if (st.exit_code != 0 || !ParseJson(st.out, &steps)) {
      ++r->lost_acked_writes;
      out << "LOST: the steps of " << job.id() << " cannot be read\n";
      continue;
    }
    std::map<int64_t, int> seen;
    for (const auto& m : steps.steps()) {
      if (m.step() > 0) seen[m.step()]++;
    }
    const int64_t total = job.summary().last_step();
    for (int64_t step = 1; step <= total; ++step) {
      ++r->steps_checked;
      if (seen[step] != 1 && job.restarts() == 0) {
        ++r->lost_acked_writes;
        out << "LOST: step " << step << " of " << job.id() << " stored " << seen[step]
            << " time(s)\n";
      }
    }
    CommandResult ck = Ctl("-o json checkpoints " + job.id());
    loom::v1::ListCheckpointsResponse catalog;
    std::set<int64_t> at;
    if (ck.exit_code == 0 && ParseJson(ck.out, &catalog)) {
      for (const auto& c : catalog.checkpoints()) at.insert(c.step());
    }
    for (int64_t step = 20; step <= total; step += 20) {
      ++r->checkpoints_checked;
      if (!at.count(step)) {
        ++r->lost_acked_writes;
        out << "LOST: checkpoint " << job.id() << " step " << step << " not in the catalog\n";
      }
    }
  }
  // 3. Gangs started twice, and the epochs each worker followed.
  const std::regex started("started rank (\\d+)/(\\d+) of (\\S+) \\(attempt (\\d+)\\)");
  const std::regex moved("controller leader epoch (\\d+) -> (\\d+)");
  std::map<std::string, int> starts;
  for (int w = 0; w < o_.workers; ++w) {
    auto log = ReadFile(absl::StrCat(home_, "/logs/worker-", w, ".log"));
    if (!log.ok()) continue;
    for (std::sregex_iterator it(log->begin(), log->end(), started), end; it != end; ++it) {
      starts[absl::StrCat((*it)[3].str(), " attempt ", (*it)[4].str(), " rank ", (*it)[1].str())]++;
      ++r->gang_starts;
    }
    for (std::sregex_iterator it(log->begin(), log->end(), moved), end; it != end; ++it) {
      if (std::stoll((*it)[2]) <= std::stoll((*it)[1])) {
        ++r->epochs_backwards;
        out << "BACKWARDS: worker-" << w << " went from epoch " << (*it)[1] << " to " << (*it)[2]
            << "\n";
      }
    }
  }
  for (const auto& [key, n] : starts) {
    if (n > 1) {
      ++r->double_scheduled_gangs;
      out << "DOUBLE: " << key << " started " << n << " times\n";
    }
  }
  // 4. The leaders' epochs, in time order over both logs: strictly rising.
  const std::regex leading(
      "(\\d\\d:\\d\\d:\\d\\d\\.\\d+) loom-controller: leading as epoch (\\d+)");
  std::vector<std::pair<std::string, int64_t>> led;
  for (const char* name : {"controller-0", "controller-1"}) {
    auto log = ReadFile(absl::StrCat(home_, "/logs/", name, ".log"));
    if (!log.ok()) continue;
    for (std::sregex_iterator it(log->begin(), log->end(), leading), end; it != end; ++it) {
      led.emplace_back((*it)[1].str(), std::stoll((*it)[2]));
    }
  }
  std::sort(led.begin(), led.end());
  for (size_t i = 0; i < led.size(); ++i) {
    r->leader_epochs.push_back(led[i].second);
    if (i > 0 && led[i].second <= led[i - 1].second) {
      ++r->epochs_backwards;
      out << "BACKWARDS: epoch " << led[i].second << " led at " << led[i].first << " after epoch "
          << led[i - 1].second << "\n";
    }
  }
  // 5. The failovers' story: the controllers' lines (taking over, stepping
  // down), in time order, and the events of a job that rode through one.
  std::vector<std::string> story;
  for (const char* name : {"controller-0", "controller-1"}) {
    auto log = ReadFile(absl::StrCat(home_, "/logs/", name, ".log"));
    if (!log.ok()) continue;
    std::istringstream lines(*log);
    for (std::string line; std::getline(lines, line);) {
      if (absl::StrContains(line, "loom-controller: leading as epoch") ||
          absl::StrContains(line, "loom-controller: stepping down")) {
        story.push_back(absl::StrCat(line.substr(0, line.find(' ')), " ", name, ": ",
                                     line.substr(line.find(' ') + 1)));
      }
    }
  }
  std::sort(story.begin(), story.end());
  r->one_failover = absl::StrCat(absl::StrJoin(story, "\n"), "\n");
  for (const auto& listed_job : all.jobs()) {
    CommandResult ev = Ctl("events " + listed_job.id());
    if (ev.exit_code == 0 && absl::StrContains(ev.out, "took over from")) {
      r->one_failover += absl::StrCat("loomctl events ", listed_job.id(), ":\n", ev.out);
      break;
    }
  }
  r->checker_output = absl::StrFormat(
      "checker: %d cycles (%s); %d acknowledged submissions, %d acknowledged cancels, %d jobs "
      "(%d preemptions), %d steps and %d checkpoints checked, %d rank starts\n"
      "checker: %d gangs scheduled twice, %d acknowledged writes lost, %d epochs backwards; "
      "leaders' epochs %s\n"
      "checker: failover p50 %.2f s, p99 %.2f s, max %.2f s\n%s",
      cycles_.size(), absl::StrJoin(o_.kinds, "/"), r->acked_submissions, r->acked_cancels,
      r->jobs_checked, r->preemptions, r->steps_checked, r->checkpoints_checked, r->gang_starts,
      r->double_scheduled_gangs, r->lost_acked_writes, r->epochs_backwards,
      absl::StrJoin(r->leader_epochs, ","), r->p50_seconds, r->p99_seconds, r->max_seconds,
      out.str());
}

}  // namespace

absl::StatusOr<FailoverResult> RunFailoverCycles(const FailoverOptions& options) {
  Harness h(options);
  if (absl::Status s = h.Start(); !s.ok()) return s;
  for (int i = 0; i < options.cycles; ++i) {
    const std::string& kind = options.kinds[i % options.kinds.size()];
    absl::StatusOr<FailoverCycle> c = h.Cycle(kind);
    if (!c.ok())
      return absl::Status(c.status().code(),
                          absl::StrCat("cycle ", i + 1, " (", kind, "): ", c.status().message()));
  }
  if (absl::Status s = h.Drain(); !s.ok()) return s;
  FailoverResult r;
  h.Check(&r);
  return r;
}

}  // namespace loom::testing
