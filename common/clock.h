// Injectable wall clock, so that tests control time (liveness timeouts,
// transition timestamps) instead of sleeping.
#ifndef LOOM_COMMON_CLOCK_H_
#define LOOM_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  int64_t NowUnixMillis() const { return absl::ToUnixMillis(Now()); }
};

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  static RealClock* Get() {
    static RealClock clock;
    return &clock;
  }
};

// A clock that only moves when told. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1700000000))
      : now_ns_(absl::ToUnixNanos(start)) {}
  absl::Time Now() const override { return absl::FromUnixNanos(now_ns_.load()); }
  void Advance(absl::Duration d) { now_ns_ += absl::ToInt64Nanoseconds(d); }

 private:
  std::atomic<int64_t> now_ns_;
};

}  // namespace loom

#endif  // LOOM_COMMON_CLOCK_H_
