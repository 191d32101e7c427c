// When the scheduler must run again: something changed (a job queued, a
// worker, slot or rendezvous port came, a node was cordoned) or a waiting
// job's time comes. Lets a heartbeat skip the scheduling cycle when
// nothing did. Called with the controller's lock held.
#ifndef LOOM_CONTROLLER_ADMISSION_SCHEDULE_SIGNAL_H_
#define LOOM_CONTROLLER_ADMISSION_SCHEDULE_SIGNAL_H_

#include <algorithm>

#include "absl/time/time.h"

namespace loom::controller {

class ScheduleSignal {
 public:
  // Something changed: run at the next chance.
  void Request() { needed_ = true; }
  // Run no later than `t` (a waiting job's not_before, a cordon's end).
  void RequestBy(absl::Time t) { at_ = std::min(at_, t); }
  bool Due(absl::Time now) const { return needed_ || now >= at_; }
  // A cycle starts: what it does not settle it requests again.
  void Reset() {
    needed_ = false;
    at_ = absl::InfiniteFuture();
  }

 private:
  bool needed_ = true;
  absl::Time at_ = absl::InfiniteFuture();
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_ADMISSION_SCHEDULE_SIGNAL_H_
