#include "controller/progress/goodput_board.h"

#include <utility>

#include "controller/jobs/job_state_machine.h"

namespace loom::controller {

GoodputBoard::GoodputBoard(StepsFn steps, absl::Duration max_age, size_t max_jobs)
    : steps_(std::move(steps)), max_age_(max_age), max_jobs_(max_jobs < 1 ? 1 : max_jobs) {}

loom::v1::GetGoodputResponse GoodputBoard::ToResponse(const GoodputBuckets& buckets,
                                                      int64_t step_reports, absl::Time computed) {
  loom::v1::GetGoodputResponse out;
  out.set_wall_seconds(buckets.wall);
  for (const GoodputBuckets::Named& named : buckets.List()) {
    loom::v1::GoodputBucket* b = out.add_buckets();
    b->set_name(named.label);
    b->set_description(named.description);
    b->set_seconds(named.seconds);
  }
  out.set_ettr(buckets.ettr());
  out.set_computed_unix_ms(absl::ToUnixMillis(computed));
  out.set_step_reports(step_reports);
  return out;
}

GoodputBuckets GoodputBoard::FromResponse(const loom::v1::GetGoodputResponse& response) {
  GoodputBuckets out;
  out.wall = response.wall_seconds();
  struct Field {
    const char* name;
    double GoodputBuckets::*member;
  };
  static const Field kFields[] = {
      {"queued", &GoodputBuckets::queued},
      {"preempted_waiting", &GoodputBuckets::preempted_waiting},
      {"recovery_waiting", &GoodputBuckets::recovery_waiting},
      {"startup", &GoodputBuckets::startup},
      {"checkpoint_restore", &GoodputBuckets::checkpoint_restore},
      {"productive", &GoodputBuckets::productive},
      {"data_stall", &GoodputBuckets::data_stall},
      {"checkpoint_stall", &GoodputBuckets::checkpoint_stall},
      {"evaluation", &GoodputBuckets::evaluation},
      {"redone", &GoodputBuckets::redone},
      {"unaccounted", &GoodputBuckets::unaccounted},
  };
  for (const loom::v1::GoodputBucket& b : response.buckets()) {
    for (const Field& f : kFields) {
      if (b.name() == f.name) out.*f.member = b.seconds();
    }
  }
  return out;
}

absl::StatusOr<loom::v1::GetGoodputResponse> GoodputBoard::Refresh(const loom::v1::Job& job,
                                                                   absl::Time now) {
  absl::StatusOr<std::vector<loom::v1::StepMetrics>> steps = steps_(job.id());
  if (!steps.ok()) return steps.status();
  Entry entry;
  entry.figures =
      ToResponse(ComputeGoodput(job, *steps, now), static_cast<int64_t>(steps->size()), now);
  entry.computed = now;
  entry.job_updated_unix_ms = job.updated_unix_ms();
  entry.job_ended = IsTerminalJobState(job.state());
  loom::v1::GetGoodputResponse figures = entry.figures;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(job.id());
  if (it != entries_.end() && it->second.computed > now) return it->second.figures;  // newer kept
  entries_[job.id()] = std::move(entry);
  while (entries_.size() > max_jobs_) {
    auto oldest = entries_.begin();
    for (auto e = entries_.begin(); e != entries_.end(); ++e) {
      if (e->second.computed < oldest->second.computed) oldest = e;
    }
    entries_.erase(oldest);
  }
  return figures;
}

absl::StatusOr<loom::v1::GetGoodputResponse> GoodputBoard::Get(const loom::v1::Job& job,
                                                               absl::Time now) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(job.id());
    if (it != entries_.end()) {
      const Entry& e = it->second;
      const bool final = e.job_ended && e.job_updated_unix_ms == job.updated_unix_ms();
      // Figures from no step reports are not reused while the job goes on:
      // reading none again costs nothing, and its first reports change
      // them most (a job whose start was computed would otherwise show no
      // productive time for up to `max_age` after it has trained).
      const bool empty = !e.job_ended && e.figures.step_reports() == 0;
      if (final || (!empty && now - e.computed < max_age_)) return e.figures;
    }
  }
  return Refresh(job, now);
}

size_t GoodputBoard::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace loom::controller
