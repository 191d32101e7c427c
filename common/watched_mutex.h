// WatchedMutex: a mutex that says when one holder kept it too long.
//
// Everything serialized behind one lock (the controller's RPCs and its tick)
// stalls while any holder keeps it, and from the outside a stall looks the
// same whatever caused it. A WatchedLock names its holder; when it keeps the
// mutex longer than the mutex's `slow` threshold, one line on stderr says
// who held it, for how long, and how long it had waited to get it:
//
//   loom-controller: Tick held the controller lock for 812.4 ms (waited 0.1 ms)
//
// At most one line a second; the holds not said are counted in the next
// line. slow_holds() counts every slow hold. Plain lock()/unlock() (for
// std::lock_guard or std::condition_variable_any) are watched too, under
// the holder name "a holder".
//
// Thread-safe. The cost per hold is two steady_clock reads.
#ifndef LOOM_COMMON_WATCHED_MUTEX_H_
#define LOOM_COMMON_WATCHED_MUTEX_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace loom {

class WatchedMutex {
 public:
  // `name` goes into the line as written ("loom-controller: the controller
  // lock" gives "loom-controller: Tick held the controller lock ...": the
  // text before ": " prefixes the line, the rest names the lock).
  explicit WatchedMutex(std::string name,
                        std::chrono::milliseconds slow = std::chrono::milliseconds(200))
      : name_(std::move(name)), slow_(slow) {}
  WatchedMutex(const WatchedMutex&) = delete;
  WatchedMutex& operator=(const WatchedMutex&) = delete;

  void lock() { Lock("a holder"); }
  void unlock() { Unlock(); }

  // Holds longer than `slow` since construction.
  int64_t slow_holds() const { return slow_holds_.load(std::memory_order_relaxed); }

 private:
  friend class WatchedLock;
  using SteadyClock = std::chrono::steady_clock;

  void Lock(const char* holder) {
    const auto asked = SteadyClock::now();
    mu_.lock();
    acquired_ = SteadyClock::now();
    waited_ = acquired_ - asked;
    holder_ = holder;
  }

  void Unlock() {
    const auto now = SteadyClock::now();
    const auto held = now - acquired_;
    const char* holder = holder_;
    const auto waited = waited_;
    bool say = false;
    int64_t unsaid = 0;
    if (held > slow_) {
      slow_holds_.fetch_add(1, std::memory_order_relaxed);
      // Still under mu_: the rate limit's state needs no lock of its own.
      if (now - last_said_ >= std::chrono::seconds(1)) {
        say = true;
        unsaid = unsaid_;
        unsaid_ = 0;
        last_said_ = now;
      } else {
        ++unsaid_;
      }
    }
    mu_.unlock();
    if (!say) return;
    using Ms = std::chrono::duration<double, std::milli>;
    const size_t colon = name_.find(": ");
    const std::string prefix = colon == std::string::npos ? "" : name_.substr(0, colon + 2);
    const std::string lock = colon == std::string::npos ? name_ : name_.substr(colon + 2);
    std::fprintf(stderr, "%s%s held %s for %.1f ms (waited %.1f ms)%s\n", prefix.c_str(), holder,
                 lock.c_str(), Ms(held).count(), Ms(waited).count(),
                 unsaid > 0 ? (" (+" + std::to_string(unsaid) +
                               " slow hold(s) in the second before, not said)")
                                  .c_str()
                            : "");
  }

  const std::string name_;
  const SteadyClock::duration slow_;
  std::mutex mu_;
  // Guarded by mu_: the current holder and its times, and the rate limit.
  SteadyClock::time_point acquired_;
  SteadyClock::duration waited_{};
  const char* holder_ = "";
  SteadyClock::time_point last_said_;
  int64_t unsaid_ = 0;
  std::atomic<int64_t> slow_holds_{0};
};

// Holds a WatchedMutex for its scope, as `holder` (a string that outlives
// the hold, typically __func__).
class WatchedLock {
 public:
  WatchedLock(WatchedMutex& mu, const char* holder) : mu_(mu) { mu_.Lock(holder); }
  ~WatchedLock() { mu_.Unlock(); }
  WatchedLock(const WatchedLock&) = delete;
  WatchedLock& operator=(const WatchedLock&) = delete;

 private:
  WatchedMutex& mu_;
};

}  // namespace loom

#endif  // LOOM_COMMON_WATCHED_MUTEX_H_
