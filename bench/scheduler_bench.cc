// The scheduler benchmark, which gates scheduling
// regressions: the real scheduling policy (controller/scheduling/
// AdmissionPolicy) driven through the real fake cluster (ClusterSim) on a
// fake clock, over a synthetic trace; no copy of either.
//
// The trace (fixed seed, so runs are comparable):
//  * 1,000 workers of 8 slots each (8,000 slots; GPUs are not modelled: a
//    rank takes one slot);
//  * 3 queues in one cohort "fleet": prod (nominal 3,600 slots, weight 3),
//    research (2,800, weight 2), batch (1,600, weight 1); each may borrow
//    the others' unused quota; arrivals 40 / 35 / 25 %;
//  * gangs of 1, 2, 4 or 8 slots on one worker, or 16, 32, 64 slots as 2, 4
//    or 8 whole workers: 30 / 20 / 18 / 14 / 9 / 6 / 3 % of the jobs;
//  * priority classes low 0 (55 %), normal 100 (35 %), high 1000 (10 %);
//  * runtimes log-normal (median 10 min, sigma 1.2, 1 min to 12 h: heavy
//    tailed), each job declaring a max_runtime 1 to 2 times its runtime;
//  * a morning rush (the first BURST jobs at t = 0, about 1.2 times the
//    cluster), then Poisson arrivals at LOAD times the cluster's capacity,
//    so demand exceeds capacity for most of the run; then the backlog
//    drains.
//
// The driver is event-wise, as a controller would run: a cycle when
// something changed (an arrival, a job's end, a victim's stop), at most one
// per kMinCycleInterval of simulated time (events in between are batched)
// and at least one per kMaxCycleInterval while jobs wait (time alone
// changes no-thrash windows and reservations).
//
// Figures (all simulated time except decisions/s and wall time):
//  * time to admission per size class: first admission - arrival, p50/p99/
//    max over the class;
//  * utilisation: slot-seconds held by gangs / capacity slot-seconds, over
//    the intervals where demand (slots of pending + running jobs) exceeds
//    the 8,000 slots;
//  * goodput: productive slot-seconds / allocated slot-seconds, over the
//    whole run. Allocated: every slot-second a gang held, its save window
//    and the time from its end to the cycle that frees it included.
//    Productive: work that counts towards a job's end (ClusterSim resumes a
//    preempted job from its save, so nothing is redone; work lost to a
//    preemption would be allocated but not productive);
//  * preemptions (by reason) and the steps they lost: ClusterSim's count,
//    and the bench's own check that every job ended exactly when its work
//    was done (no step done twice);
//  * decisions/s: decisions over the real time spent inside
//    AdmissionPolicy::Decide (ClusterSim::decide_wall_time). A decision is
//    every verdict a cycle returns: each admission, each preemption and each
//    waiting job (Decisions::admissions + preemptions + waiting);
//  * wall time of the whole run.
// Each figure is checked against bench/scheduler_thresholds.txt (like
// Kueue's scheduler performance test and its range file): the bench exits 1
// when one crosses its threshold.
//
// Last line:
//   scheduler: <n> jobs, utilisation <u>, p99 wait (largest class) <x> s ratio=<u/0.9>
// Usage: loom_scheduler_bench THRESHOLDS_FILE [jobs] [seed]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "controller/scheduling/cluster_sim.h"
#include "controller/scheduling/queue_config.h"

namespace {

using loom::scheduling::ClusterSim;
using loom::scheduling::Decisions;
using loom::scheduling::GangDemand;
using loom::scheduling::PendingJob;
using loom::scheduling::PreemptionReason;
using loom::scheduling::QueueConfig;
using loom::scheduling::Resources;
using loom::scheduling::WorkerFree;

constexpr int kWorkers = 1000;
constexpr int kSlotsPerWorker = 8;
constexpr int64_t kCapacitySlots = int64_t{kWorkers} * kSlotsPerWorker;
constexpr double kLoad = 1.15;      // offered load after the rush, x capacity
constexpr double kBurstLoad = 1.2;  // the rush at t = 0, x capacity in slots
constexpr absl::Duration kMinCycleInterval = absl::Seconds(5);
constexpr absl::Duration kMaxCycleInterval = absl::Seconds(60);
constexpr absl::Duration kSaveTime = absl::Seconds(20);

constexpr char kQueueConfig[] = R"(
fair_share:
  half_life_seconds: 1800
preemption:
  grace_seconds: 60
  min_run_time_seconds: 600
priority_classes: {low: 0, normal: 100, high: 1000}
queues:
  - {name: prod, cohort: fleet, nominal_quota: {slots: 3600}, weight: 3}
  - {name: research, cohort: fleet, nominal_quota: {slots: 2800}, weight: 2}
  - {name: batch, cohort: fleet, nominal_quota: {slots: 1600}, weight: 1}
)";
const char* const kQueues[] = {"prod", "research", "batch"};
constexpr double kQueueShare[] = {0.40, 0.35, 0.25};
constexpr int kSizes[] = {1, 2, 4, 8, 16, 32, 64};
constexpr double kSizeShare[] = {0.30, 0.20, 0.18, 0.14, 0.09, 0.06, 0.03};
constexpr int kNumSizes = 7;
constexpr int kPriorities[] = {0, 100, 1000};
constexpr double kPriorityShare[] = {0.55, 0.35, 0.10};

// Portable draws (the same trace from any standard library): mt19937_64 is
// specified bit for bit; the transforms are ours.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  double Exponential(double mean) { return -mean * std::log1p(-Uniform()); }
  double Normal() {  // Box-Muller
    const double u = 1 - Uniform(), v = Uniform();
    return std::sqrt(-2 * std::log(u)) * std::cos(2 * M_PI * v);
  }
  template <size_t N>
  int Pick(const double (&shares)[N]) {
    double u = Uniform();
    for (size_t i = 0; i + 1 < N; ++i) {
      if (u < shares[i]) return static_cast<int>(i);
      u -= shares[i];
    }
    return static_cast<int>(N - 1);
  }

 private:
  std::mt19937_64 rng_;
};

struct TraceJob {
  std::string id;
  int queue = 0;
  int priority = 0;
  int size_class = 0;  // index into kSizes
  int64_t arrival_s = 0;
  int64_t work_s = 0;         // runtime if never stopped
  int64_t max_runtime_s = 0;  // what the job declares (>= work_s)
  int slots() const { return kSizes[size_class]; }
};

std::vector<TraceJob> MakeTrace(int jobs, uint64_t seed) {
  Draw draw(seed);
  std::vector<TraceJob> trace(jobs);
  double mean_slot_seconds = 0;  // of the whole trace, for the arrival rate
  for (int i = 0; i < jobs; ++i) {
    TraceJob& j = trace[i];
    j.id = absl::StrFormat("j%05d", i);
    j.queue = draw.Pick(kQueueShare);
    j.size_class = draw.Pick(kSizeShare);
    j.priority = kPriorities[draw.Pick(kPriorityShare)];
    const double runtime = 600 * std::exp(1.2 * draw.Normal());
    j.work_s = std::clamp<int64_t>(std::llround(runtime), 60, 12 * 3600);
    j.max_runtime_s = std::llround(j.work_s * (1 + draw.Uniform()));
    mean_slot_seconds += static_cast<double>(j.slots()) * j.work_s / jobs;
  }
  // The rush: jobs at t = 0 until their slots reach kBurstLoad x capacity;
  // then a Poisson stream offering kLoad x capacity.
  const double rate = kLoad * kCapacitySlots / mean_slot_seconds;  // jobs per second
  double burst_slots = 0, t = 0;
  for (TraceJob& j : trace) {
    if (burst_slots < kBurstLoad * kCapacitySlots) {
      burst_slots += j.slots();
      j.arrival_s = 0;
      continue;
    }
    t += draw.Exponential(1 / rate);
    j.arrival_s = std::llround(t);
  }
  return trace;
}

GangDemand Gang(int slots) {
  return slots <= kSlotsPerWorker ? GangDemand::Even(1, {slots, 0})
                                  : GangDemand::Even(slots / kSlotsPerWorker, {kSlotsPerWorker, 0});
}

// The bench's own account of each job, from the decisions it sees.
struct JobState {
  enum Phase { kNotArrived, kPending, kRunning, kSaving, kFinished } phase = kNotArrived;
  int64_t done_s = 0;                            // work done before the current run
  absl::Time start;                              // of the current run
  absl::Time stop_at;                            // while saving
  absl::Time admitted = absl::InfiniteFuture();  // first admission
  int generation = 0;                            // invalidates stale events
  int runs = 0;
};

struct Event {
  absl::Time at;
  int job;
  int generation;
  bool operator>(const Event& o) const { return std::tie(at, job) > std::tie(o.at, o.job); }
};

// FNV-1a over every decision of the run, field by field (messages and
// placements included): two builds that print the same digest for the same
// trace and seed made the same decisions.
class Digest {
 public:
  void Add(absl::string_view s) {
    for (unsigned char ch : s) h_ = (h_ ^ ch) * 1099511628211ull;
    h_ = (h_ ^ 0xff) * 1099511628211ull;  // field separator
  }
  void Add(int64_t v) { Add(absl::string_view(reinterpret_cast<const char*>(&v), sizeof v)); }
  void Add(const Decisions& d) {
    for (const auto& a : d.admissions) {
      Add(a.job_id);
      for (const auto& s : a.placement) Add(s.worker_id), Add(s.amount.slots), Add(s.amount.gpus);
      Add(int64_t{a.borrowing} * 2 + a.opportunistic);
    }
    for (const auto& p : d.preemptions) {
      Add(p.victim_id), Add(p.for_job_id), Add(static_cast<int64_t>(p.reason)), Add(p.message);
    }
    for (const auto& w : d.waiting) {
      Add(w.job_id), Add(w.position), Add(static_cast<int64_t>(w.reason));
      Add(w.blocking_job_id), Add(w.message), Add(absl::ToUnixNanos(w.expected_start));
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[p <= 0 ? 0 : i];
}

// Thresholds: one per line, "FIGURE <= VALUE" or "FIGURE >= VALUE"; '#'
// starts a comment. Returns the number crossed, or -1 on a malformed file or
// an unknown figure.
int CheckThresholds(const std::string& path, const std::map<std::string, double>& figures) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "scheduler: cannot read thresholds %s\n", path.c_str());
    return -1;
  }
  std::string line;
  int crossed = 0, line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    std::string name, op;
    double limit;
    if (!(fields >> name)) continue;
    if (!(fields >> op >> limit) || (op != "<=" && op != ">=")) {
      std::fprintf(stderr, "scheduler: %s:%d: want \"FIGURE <= VALUE\" or \">=\"\n", path.c_str(),
                   line_no);
      return -1;
    }
    auto it = figures.find(name);
    if (it == figures.end()) {
      std::fprintf(stderr, "scheduler: %s:%d: unknown figure \"%s\"\n", path.c_str(), line_no,
                   name.c_str());
      return -1;
    }
    const bool ok = op == "<=" ? it->second <= limit : it->second >= limit;
    std::printf("threshold %-28s %12.4g %s %-10g %s\n", name.c_str(), it->second, op.c_str(), limit,
                ok ? "ok" : "CROSSED");
    if (!ok) ++crossed;
  }
  return crossed;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s THRESHOLDS_FILE [jobs] [seed]\n", argv[0]);
    return 2;
  }
  const auto wall_start = std::chrono::steady_clock::now();
  const int n = argc > 2 ? std::max(1, std::atoi(argv[2])) : 15000;
  const uint64_t seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 30;
  const std::vector<TraceJob> trace = MakeTrace(n, seed);

  auto config = loom::scheduling::ParseQueueConfig(kQueueConfig);
  if (!config.ok()) {
    std::fprintf(stderr, "scheduler: %s\n", config.status().ToString().c_str());
    return 1;
  }
  std::vector<WorkerFree> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.push_back({absl::StrCat("w", w), {kSlotsPerWorker, 0}});
  }
  const absl::Time t0 = absl::FromUnixSeconds(1800000000);
  ClusterSim sim(*config, std::move(workers), t0);
  sim.set_options({kSaveTime, /*checkpoint_every_steps=*/100});

  std::map<std::string, int> index;
  for (int i = 0; i < n; ++i) index[trace[i].id] = i;
  std::vector<JobState> state(n);
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  auto push_end = [&](int i) {  // the job's end, or its stop when saving
    JobState& s = state[i];
    absl::Time at = s.start + absl::Seconds(trace[i].work_s - s.done_s);
    if (s.phase == JobState::kSaving) at = std::min(at, s.stop_at);
    events.push({at, i, ++s.generation});
  };
  auto next_event = [&]() {
    while (!events.empty() && events.top().generation != state[events.top().job].generation) {
      events.pop();
    }
    return events.empty() ? absl::InfiniteFuture() : events.top().at;
  };

  // Running totals, constant between steps.
  int64_t held_slots = 0, pending_slots = 0;
  int pending_jobs = 0, finished = 0;
  double busy_while_short = 0, capacity_while_short = 0, seconds_short = 0;
  double allocated = 0, productive = 0, held_all = 0;
  absl::Time last_step = t0;
  auto integrate = [&](absl::Time to) {
    const double dt = absl::ToDoubleSeconds(to - last_step);
    if (dt <= 0) return;
    held_all += static_cast<double>(held_slots) * dt;
    if (held_slots + pending_slots > kCapacitySlots) {
      busy_while_short += static_cast<double>(held_slots) * dt;
      capacity_while_short += static_cast<double>(kCapacitySlots) * dt;
      seconds_short += dt;
    }
    last_step = to;
  };

  int64_t decisions = 0, cycles = 0, admissions = 0;
  std::map<PreemptionReason, int> preempted_by;
  int64_t max_pending = 0, stale_ends = 0;
  size_t next_arrival = 0;
  absl::Time last_cycle = absl::InfinitePast();
  absl::Time dirty_since = absl::InfiniteFuture();  // earliest change not yet cycled on
  double cycle_wall_s = 0;
  Digest digest;
  absl::Time last_admission = t0;

  while (finished < n) {
    const absl::Time arrival = next_arrival < trace.size()
                                   ? t0 + absl::Seconds(trace[next_arrival].arrival_s)
                                   : absl::InfiniteFuture();
    const absl::Time change = std::min(dirty_since, next_event());
    absl::Time cycle_at = change;
    if (pending_jobs > 0 && last_cycle != absl::InfinitePast()) {
      cycle_at = std::min(cycle_at, last_cycle + kMaxCycleInterval);
    }
    if (last_cycle != absl::InfinitePast()) {
      cycle_at = std::max(cycle_at, last_cycle + kMinCycleInterval);
    }
    if (arrival == absl::InfiniteFuture() && cycle_at == absl::InfiniteFuture()) {
      std::fprintf(stderr, "scheduler: stuck with %d of %d jobs finished\n", finished, n);
      return 1;
    }
    if (arrival <= cycle_at) {
      integrate(arrival);
      sim.Advance(arrival - sim.now());
      const TraceJob& t = trace[next_arrival];
      PendingJob job;
      job.id = t.id;
      job.queue = kQueues[t.queue];
      job.priority = t.priority;
      job.gang = Gang(t.slots());
      job.expected_runtime = absl::Seconds(t.max_runtime_s);
      sim.Submit(std::move(job), absl::Seconds(t.work_s));
      state[next_arrival].phase = JobState::kPending;
      pending_slots += t.slots();
      ++pending_jobs;
      dirty_since = std::min(dirty_since, arrival);
      ++next_arrival;
      continue;
    }

    // A cycle at cycle_at.
    const absl::Time now = cycle_at;
    integrate(now);
    sim.Advance(now - sim.now());
    // Ends and stops the sim applies at the start of this cycle.
    while (next_event() <= now) {
      const Event e = events.top();
      events.pop();
      JobState& s = state[e.job];
      const TraceJob& t = trace[e.job];
      const int64_t ran = absl::ToInt64Seconds(e.at - s.start);
      allocated += static_cast<double>(t.slots()) * absl::ToDoubleSeconds(now - s.start);
      productive += static_cast<double>(t.slots()) * ran;
      s.done_s += ran;
      ++s.generation;
      held_slots -= t.slots();
      if (s.done_s >= t.work_s) {
        s.phase = JobState::kFinished;
        ++finished;
      } else {
        s.phase = JobState::kPending;
        pending_slots += t.slots();
        ++pending_jobs;
      }
    }
    dirty_since = absl::InfiniteFuture();
    const auto cycle_start = std::chrono::steady_clock::now();
    absl::StatusOr<Decisions> d = sim.RunCycle();
    cycle_wall_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - cycle_start).count();
    if (!d.ok()) {
      std::fprintf(stderr, "scheduler: cycle at t=%.0fs: %s\n", absl::ToDoubleSeconds(now - t0),
                   d.status().ToString().c_str());
      return 1;
    }
    last_cycle = now;
    ++cycles;
    digest.Add(*d);
    max_pending = std::max<int64_t>(max_pending, pending_jobs);
    decisions += d->admissions.size() + d->preemptions.size() + d->waiting.size();
    for (const auto& p : d->preemptions) {
      const int i = index.at(p.victim_id);
      state[i].phase = JobState::kSaving;
      state[i].stop_at = now + kSaveTime;
      push_end(i);
      ++preempted_by[p.reason];
    }
    for (const auto& a : d->admissions) {
      const int i = index.at(a.job_id);
      JobState& s = state[i];
      if (s.phase != JobState::kPending) {
        std::fprintf(stderr, "scheduler: %s admitted but not pending here\n", a.job_id.c_str());
        return 1;
      }
      s.phase = JobState::kRunning;
      s.start = now;
      ++s.runs;
      if (s.admitted == absl::InfiniteFuture()) s.admitted = now;
      last_admission = now;
      push_end(i);
      held_slots += trace[i].slots();
      pending_slots -= trace[i].slots();
      --pending_jobs;
      ++admissions;
    }
    // The sim must agree with the bench's account.
    if (pending_jobs != static_cast<int>(d->waiting.size())) {
      std::fprintf(stderr, "scheduler: %d pending here, %zu waiting in the sim at t=%.0fs\n",
                   pending_jobs, d->waiting.size(), absl::ToDoubleSeconds(now - t0));
      return 1;
    }
  }
  integrate(sim.now());
  for (int i = 0; i < n; ++i) {
    if (!sim.Finished(trace[i].id) || state[i].done_s != trace[i].work_s) ++stale_ends;
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  const double decide_s = absl::ToDoubleSeconds(sim.decide_wall_time());

  // ---- Report ----
  const double makespan_s = absl::ToDoubleSeconds(sim.now() - t0);
  std::printf(
      "trace: %d jobs (seed %llu), %d workers x %d slots, 3 queues in cohort \"fleet\" "
      "(prod 3600 w3, research 2800 w2, batch 1600 w1), load %.2f after a %.1fx rush, "
      "arrivals over %.0f s, makespan %.0f s simulated\n",
      n, static_cast<unsigned long long>(seed), kWorkers, kSlotsPerWorker, kLoad, kBurstLoad,
      static_cast<double>(trace.back().arrival_s), makespan_s);
  std::printf("cycles: %lld (event-wise, %.0f-%.0f s apart), pending jobs at most %lld\n",
              static_cast<long long>(cycles), absl::ToDoubleSeconds(kMinCycleInterval),
              absl::ToDoubleSeconds(kMaxCycleInterval), static_cast<long long>(max_pending));
  std::map<std::string, double> figures;
  std::vector<double> largest_waits;
  std::printf("time to admission (first admission - arrival, simulated s):\n");
  for (int c = 0; c < kNumSizes; ++c) {
    std::vector<double> waits;
    for (int i = 0; i < n; ++i) {
      if (trace[i].size_class == c)
        waits.push_back(absl::ToDoubleSeconds(state[i].admitted - t0) -
                        static_cast<double>(trace[i].arrival_s));
    }
    const double p50 = Percentile(waits, 0.5), p99 = Percentile(waits, 0.99),
                 max = Percentile(waits, 1.0);
    std::printf("  %2d slot(s): %5zu jobs  p50 %8.0f  p99 %8.0f  max %8.0f\n", kSizes[c],
                waits.size(), p50, p99, max);
    figures[absl::StrCat("wait_p50_s.", kSizes[c])] = p50;
    figures[absl::StrCat("wait_p99_s.", kSizes[c])] = p99;
    figures[absl::StrCat("wait_max_s.", kSizes[c])] = max;
    if (c == kNumSizes - 1) largest_waits = waits;
  }
  const double utilisation = capacity_while_short > 0 ? busy_while_short / capacity_while_short : 0;
  const double goodput = allocated > 0 ? productive / allocated : 0;
  // The loaded run: until the last admission (every job has started); after
  // it the last long jobs only run out.
  const double loaded_s = absl::ToDoubleSeconds(last_admission - t0);
  std::printf(
      "utilisation: %.4f of %lld slots while demand exceeds capacity, which it does %.0f "
      "s of the %.0f s until the last admission (%.1f%%; the last jobs then run out until "
      "%.0f s); %.4f over the whole run\n",
      utilisation, static_cast<long long>(kCapacitySlots), seconds_short, loaded_s,
      100 * seconds_short / loaded_s, makespan_s,
      held_all / (static_cast<double>(kCapacitySlots) * makespan_s));
  std::printf(
      "goodput: %.4f = productive %.4g / allocated %.4g slot-s (work kept towards the "
      "job's end / slot-s held, saves and end-to-free included)\n",
      goodput, productive, allocated);
  std::printf(
      "preemptions: %d (priority %d, reclaim %d, fair share %d, reservation %d), steps "
      "lost %lld; jobs whose runs do not add up to their work: %lld\n",
      sim.preemptions(), preempted_by[PreemptionReason::kPriority],
      preempted_by[PreemptionReason::kReclaim], preempted_by[PreemptionReason::kFairShare],
      preempted_by[PreemptionReason::kReservation], static_cast<long long>(sim.steps_lost()),
      static_cast<long long>(stale_ends));
  const double decisions_per_second = decide_s > 0 ? decisions / decide_s : 0;
  std::printf(
      "decisions: %lld (admissions %lld, preemptions %d, waiting verdicts %lld) in %.3f s "
      "of Decide = %.0f decisions/s (%.0f/s counting the sim's whole cycle, %.3f s)\n",
      static_cast<long long>(decisions), static_cast<long long>(admissions), sim.preemptions(),
      static_cast<long long>(decisions - admissions - sim.preemptions()), decide_s,
      decisions_per_second, cycle_wall_s > 0 ? decisions / cycle_wall_s : 0, cycle_wall_s);
  std::printf("decision digest: %016llx (FNV-1a of every decision; equal for the same decisions)\n",
              static_cast<unsigned long long>(digest.value()));
  std::printf("wall time: %.2f s\n", wall_s);

  figures["utilisation"] = utilisation;
  figures["goodput"] = goodput;
  figures["preemptions"] = sim.preemptions();
  figures["steps_lost"] = static_cast<double>(sim.steps_lost() + stale_ends);
  figures["decisions_per_second"] = decisions_per_second;
  figures["wall_seconds"] = wall_s;
  figures["demand_exceeds_capacity_fraction"] = seconds_short / loaded_s;
  const int crossed = CheckThresholds(argv[1], figures);
  const double p99_largest = Percentile(largest_waits, 0.99);
  std::printf("scheduler: %d jobs, utilisation %.4f, p99 wait (largest class) %.0f s ratio=%.4f\n",
              n, utilisation, p99_largest, utilisation / 0.9);
  if (crossed < 0) return 2;
  return crossed > 0 ? 1 : 0;
}
