#include "controller/progress/goodput.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace loom::controller {
namespace {

bool Terminal(loom::v1::JobState s) {
  return s == loom::v1::SUCCEEDED || s == loom::v1::FAILED || s == loom::v1::CANCELLED;
}

double Seconds(int64_t from_ms, int64_t to_ms) {
  return static_cast<double>(std::max<int64_t>(0, to_ms - from_ms)) / 1000.0;
}

}  // namespace

double GoodputBuckets::ettr() const {
  const double training_time = wall - queued - preempted_waiting;
  return training_time > 0 ? productive / training_time : 0.0;
}

// Events after which the next attempt resumes from their checkpoint_step,
// having lost their steps_lost.
static bool ResumesFromACheckpoint(loom::v1::RecoveryEvent::Kind kind) {
  return kind == loom::v1::RecoveryEvent::ROLLBACK || kind == loom::v1::RecoveryEvent::RESTART ||
         kind == loom::v1::RecoveryEvent::PREEMPTED || kind == loom::v1::RecoveryEvent::REPLANNED;
}

GoodputBuckets ComputeGoodput(const loom::v1::Job& job,
                              const std::vector<loom::v1::StepMetrics>& steps, absl::Time now) {
  GoodputBuckets b;
  if (job.history_size() == 0) return b;
  const int64_t created = job.history(0).time_unix_ms();
  const loom::v1::StateTransition& last = job.history(job.history_size() - 1);
  const int64_t end = Terminal(last.to()) ? last.time_unix_ms() : absl::ToUnixMillis(now);
  b.wall = Seconds(created, end);

  // The placed stretches (attempts): from a SCHEDULED to the next
  // transition out of SCHEDULED/RUNNING (or the end).
  struct Attempt {
    int64_t begin = 0, end = 0;
  };
  std::vector<Attempt> attempts;
  bool placed_before = false;
  for (int i = 0; i < job.history_size(); ++i) {
    const loom::v1::StateTransition& t = job.history(i);
    const int64_t until = i + 1 < job.history_size() ? job.history(i + 1).time_unix_ms() : end;
    if (t.to() == loom::v1::PENDING) {
      (placed_before ? b.recovery_waiting : b.queued) += Seconds(t.time_unix_ms(), until);
    } else if (t.to() == loom::v1::PREEMPTED) {
      b.preempted_waiting += Seconds(t.time_unix_ms(), until);
    } else if (t.to() == loom::v1::SCHEDULED) {
      placed_before = true;
      attempts.push_back({t.time_unix_ms(), until});
    } else if (t.to() == loom::v1::RUNNING && !attempts.empty()) {
      attempts.back().end = until;  // the attempt goes on while it runs
    }
  }

  // Each attempt's reported steps: training time and its stalls; the gap
  // from the placement to its first step's start is start-up.
  std::vector<const loom::v1::StepMetrics*> sorted;
  for (const loom::v1::StepMetrics& s : steps) sorted.push_back(&s);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* c) { return a->time_unix_ms() < c->time_unix_ms(); });
  std::vector<double> median_step(attempts.size(), 0.0);
  for (size_t a = 0; a < attempts.size(); ++a) {
    const Attempt& at = attempts[a];
    std::vector<double> times;
    double first_start = -1;
    double restore = 0;
    // The step the attempt resumed after: 0 for the first; else the
    // checkpoint of the rollback, restart or preemption before it (unknown
    // after a rendezvous retry: its first report then stands for itself).
    int64_t previous_step = a == 0 ? 0 : -1;
    for (const loom::v1::RecoveryEvent& e : job.events()) {
      if (a > 0 && e.time_unix_ms() <= at.begin && ResumesFromACheckpoint(e.kind())) {
        previous_step = e.checkpoint_step();
      }
    }
    for (const loom::v1::StepMetrics* s : sorted) {
      if (s->time_unix_ms() <= at.begin || s->time_unix_ms() > at.end) continue;
      const double step = std::max(0.0, s->step_time_seconds());
      // A report stands for the steps since the attempt's previous one: runs
      // report every log_interval steps, and a finished job's series is
      // thinned (JobManagerOptions::finished_steps_kept).
      const double weight = previous_step >= 0 && s->step() > previous_step
                                ? static_cast<double>(s->step() - previous_step)
                                : 1.0;
      if (s->step() > 0) previous_step = s->step();
      if (first_start < 0) {
        // Its first report's steps ran back to back before it ended, and a
        // validation pass after them (a fresh run's step-0 report is one)
        // before the report was sent: that is evaluation, not start-up.
        first_start = std::max(0.0, Seconds(at.begin, s->time_unix_ms()) - weight * step -
                                        std::max(0.0, s->eval_seconds()));
        // The restore happened before the first step, within that gap.
        restore = std::clamp(s->checkpoint_restore_seconds(), 0.0, first_start);
      }
      times.push_back(step);
      const double data = std::clamp(s->data_wait_seconds(), 0.0, step);
      // A save stalls the one step after it, seen only when that step is
      // reported; it is not multiplied.
      const double save = std::clamp(s->checkpoint_stall_seconds(), 0.0, step - data);
      b.data_stall += weight * data;
      b.evaluation += std::max(0.0, s->eval_seconds());
      b.checkpoint_stall += save;
      b.productive += weight * (step - data) - save;
    }
    b.checkpoint_restore += restore;
    b.startup += first_start >= 0 ? first_start - restore : Seconds(at.begin, at.end);
    if (!times.empty()) {
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      median_step[a] = times[times.size() / 2];
    }
  }

  // Steps a rollback, restart, preemption or re-plan undid were trained
  // twice: the undone copy
  // is redone work, not productive. The event's attempt (generation) is
  // the one it starts, so the lost steps belong to the attempt before.
  for (const loom::v1::RecoveryEvent& e : job.events()) {
    if (!ResumesFromACheckpoint(e.kind())) continue;
    if (e.steps_lost() <= 0) continue;
    // The attempt that ran when the event came.
    double median = 0;
    for (size_t a = 0; a < attempts.size(); ++a) {
      if (attempts[a].begin <= e.time_unix_ms()) median = median_step[a];
    }
    const double lost = std::min(b.productive, static_cast<double>(e.steps_lost()) * median);
    b.redone += lost;
    b.productive -= lost;
  }
  b.unaccounted = b.wall - (b.queued + b.preempted_waiting + b.recovery_waiting + b.startup +
                            b.checkpoint_restore + b.productive + b.data_stall +
                            b.checkpoint_stall + b.evaluation + b.redone);
  // Reports timed by another host's clock can still overlap the wall time
  // by a little: the excess comes out of the buckets those clocks measured,
  // start-up first (a gap between two clocks' readings), then the steps'
  // own figures, so that every bucket is >= 0 and they sum to the wall time.
  if (b.unaccounted < 0) {
    double excess = -b.unaccounted;
    for (double* bucket : {&b.startup, &b.evaluation, &b.data_stall, &b.checkpoint_stall,
                           &b.redone, &b.productive}) {
      const double take = std::min(excess, *bucket);
      *bucket -= take;
      excess -= take;
    }
    b.unaccounted = 0;
  }
  return b;
}

GoodputMetrics::GoodputMetrics(metrics::Registry& registry)
    : seconds_(metrics::BuildGauge()
                   .Name("loom_controller_job_goodput_seconds")
                   .Help("A job's wall time so far, split into goodput buckets (queued, "
                         "preempted_waiting, recovery_waiting, startup, checkpoint_restore, "
                         "productive, data_stall, checkpoint_stall, evaluation, redone, "
                         "unaccounted).")
                   .Register(registry)),
      ettr_(metrics::BuildGauge()
                .Name("loom_controller_job_ettr")
                .Help("A job's effective training time ratio: productive seconds over its "
                      "wall time less the time it waited in its queue.")
                .Register(registry)) {}

std::vector<GoodputBuckets::Named> GoodputBuckets::List() const {
  return {
      {"queued", "queued", queued},
      {"preempted_waiting", "preempted, waiting", preempted_waiting},
      {"recovery_waiting", "waiting after a failure or rollback", recovery_waiting},
      {"startup", "start-up (launch, rendezvous, probe)", startup},
      {"checkpoint_restore", "checkpoint restore", checkpoint_restore},
      {"productive", "productive steps", productive},
      {"data_stall", "data stall", data_stall},
      {"checkpoint_stall", "checkpoint-save stall", checkpoint_stall},
      {"evaluation", "evaluation (validation passes)", evaluation},
      {"redone", "redone after a failure, rollback or preemption", redone},
      {"unaccounted", "unaccounted", unaccounted},
  };
}

void GoodputMetrics::Record(const std::string& job_id, const GoodputBuckets& b) {
  for (const GoodputBuckets::Named& bucket : b.List()) {
    seconds_.Add({{"job_id", job_id}, {"bucket", bucket.label}}).Set(bucket.seconds);
  }
  ettr_.Add({{"job_id", job_id}}).Set(b.ettr());
}

}  // namespace loom::controller
