// Each queue's usage, decayed over time: queues share by weight
// over their decayed usage, with a configurable half-life.
//
// The decayed usage is an exponentially weighted moving average of what
// the queue held, in slots and GPUs: after an interval dt during which the
// queue held u,
//     U <- U * 2^(-dt / half_life) + u * (1 - 2^(-dt / half_life)),
// so a queue that has held u for a long time has U = u, and U halves every
// half-life once the queue goes idle. (Kueue's admission fair sharing decays
// consumed usage the same way with usageHalfLifeTime.) The admission order
// across queues uses U / weight, so a queue that used much lately yields to
// one that used little, and one cycle's admissions count at once.
//
// Time comes in as a value: Observe(now, ...) on every scheduling cycle;
// tests and the benchmark pass a fake clock's time. Thread-compatible: the
// owner (the job manager, under its lock) serialises calls.
#ifndef LOOM_CONTROLLER_SCHEDULING_FAIR_SHARE_H_
#define LOOM_CONTROLLER_SCHEDULING_FAIR_SHARE_H_

#include <map>
#include <string>

#include "absl/time/time.h"
#include "controller/scheduling/resources.h"

namespace loom::scheduling {

struct DecayedUsage {
  double slots = 0;
  double gpus = 0;
};

class FairShare {
 public:
  // half_life > 0.
  explicit FairShare(absl::Duration half_life);

  // The queues' usage from `now` on (queues not named hold nothing). The
  // interval since the previous call is accounted at the usage that call
  // gave; the first call only records. A `now` earlier than the previous
  // one is treated as no time passing.
  void Observe(absl::Time now, const std::map<std::string, Resources>& usage);

  // U for `queue` as of the last Observe; zero for a queue never seen.
  DecayedUsage Usage(const std::string& queue) const;

  // A reloaded configuration's half-life; the decayed values are kept.
  void set_half_life(absl::Duration half_life) { half_life_ = half_life; }
  absl::Duration half_life() const { return half_life_; }

 private:
  struct Entry {
    DecayedUsage decayed;
    Resources current;  // held since last_
  };
  absl::Duration half_life_;
  absl::Time last_ = absl::InfinitePast();
  std::map<std::string, Entry> queues_;
};

}  // namespace loom::scheduling

#endif  // LOOM_CONTROLLER_SCHEDULING_FAIR_SHARE_H_
