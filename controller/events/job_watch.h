// One job's watch stream (WatchJob): the job's logged events after a
// sequence number, in order, its steps live, and the end of the stream
// after the job's last transition.
//
// Not thread-safe: one stream, one reader.
#ifndef LOOM_CONTROLLER_EVENTS_JOB_WATCH_H_
#define LOOM_CONTROLLER_EVENTS_JOB_WATCH_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/events/event_hub.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

class JobWatch {
 public:
  // The job as it stands now (the controller's copy).
  using JobLookup = std::function<absl::StatusOr<loom::v1::Job>()>;
  struct Options {
    // Sent once the logged history is read (before the last transition of
    // a job that has ended): the newest steps, oldest first.
    std::vector<loom::v1::StepMetrics> replay_steps;
    // When the job has ended and its last transition is not among the
    // events the stream reads (it started after it): the stream's one event
    // repeats that transition (seq 0) when true, and carries only the job
    // when false (a client resuming after it saw it).
    bool repeat_last_transition = true;
  };

  JobWatch(std::unique_ptr<EventHub::Cursor> cursor, JobLookup lookup, Options options);

  // The next events, each with the job attached as it stands when they are
  // sent; waits up to `timeout` while there are none (and returns none).
  // The store's error if the log cannot be read.
  absl::StatusOr<std::vector<loom::v1::JobEvent>> Next(absl::Duration timeout);
  // The stream's last event has been returned.
  bool ended() const { return ended_; }

 private:
  // Moves `batch` to `out` up to and including a transition that ends the
  // job (then ended_), with the step replay before that transition.
  void Take(std::vector<loom::v1::JobEvent> batch, std::vector<loom::v1::JobEvent>* out);
  void Replay(std::vector<loom::v1::JobEvent>* out);

  std::unique_ptr<EventHub::Cursor> cursor_;
  JobLookup lookup_;
  Options options_;
  bool replayed_ = false;
  bool ended_ = false;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_EVENTS_JOB_WATCH_H_
