#include "controller/events/job_watch.h"

#include <optional>
#include <utility>

#include "controller/jobs/job_state_machine.h"

namespace loom::controller {

JobWatch::JobWatch(std::unique_ptr<EventHub::Cursor> cursor, JobLookup lookup, Options options)
    : cursor_(std::move(cursor)), lookup_(std::move(lookup)), options_(std::move(options)) {
  replayed_ = options_.replay_steps.empty();
}

void JobWatch::Replay(std::vector<loom::v1::JobEvent>* out) {
  if (replayed_) return;
  replayed_ = true;
  for (loom::v1::StepMetrics& m : options_.replay_steps) {
    loom::v1::JobEvent e;
    e.set_time_unix_ms(m.time_unix_ms());
    *e.mutable_step() = std::move(m);
    out->push_back(std::move(e));
  }
  options_.replay_steps.clear();
}

void JobWatch::Take(std::vector<loom::v1::JobEvent> batch, std::vector<loom::v1::JobEvent>* out) {
  for (loom::v1::JobEvent& e : batch) {
    if (ended_) return;  // nothing follows the last transition
    const bool last = e.has_transition() && IsTerminalJobState(e.transition().to());
    if (last) Replay(out);
    out->push_back(std::move(e));
    ended_ = last;
  }
}

absl::StatusOr<std::vector<loom::v1::JobEvent>> JobWatch::Next(absl::Duration timeout) {
  std::vector<loom::v1::JobEvent> out;
  if (ended_) return out;
  absl::StatusOr<std::vector<loom::v1::JobEvent>> batch = cursor_->Next(timeout);
  if (!batch.ok()) return batch.status();
  Take(*std::move(batch), &out);
  // The job is read once a call (a copy under the controller's lock): to
  // see whether it ended, and to go with the events.
  std::optional<absl::StatusOr<loom::v1::Job>> job;
  if (!ended_ && cursor_->caught_up()) {
    Replay(&out);
    job = lookup_();
    if (!job->ok()) return job->status();
    if (IsTerminalJobState((*job)->state())) {
      // Ended: its last transition committed before the job's state could
      // be read as ended, so it is in the log by now; read to the end.
      for (;;) {
        absl::StatusOr<std::vector<loom::v1::JobEvent>> rest = cursor_->Next(absl::ZeroDuration());
        if (!rest.ok()) return rest.status();
        if (rest->empty() || ended_) break;
        Take(*std::move(rest), &out);
      }
      if (!ended_) {
        // The stream started after it.
        loom::v1::JobEvent e;
        const loom::v1::Job& ended = **job;
        e.set_time_unix_ms(ended.updated_unix_ms());
        e.set_job_id(ended.id());
        if (options_.repeat_last_transition && ended.history_size() > 0) {
          *e.mutable_transition() = ended.history(ended.history_size() - 1);
        }
        out.push_back(std::move(e));
        ended_ = true;
      }
    }
  }
  if (out.empty()) return out;
  if (!job.has_value()) job = lookup_();
  if (!job->ok()) return job->status();
  for (loom::v1::JobEvent& e : out) {
    *e.mutable_job() = **job;
    e.set_job_id((*job)->id());
  }
  return out;
}

}  // namespace loom::controller
