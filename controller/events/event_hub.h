// The controller's event log as readers see it: cursors that read every
// logged event after a sequence number, in order, first from the store and
// then from the newest entries kept in memory, and wait for more.
//
// The store numbers entries 1, 2, 3, ... in commit order with no gap and
// tells the hub of each committed batch (Store::SetLoggedEventsListener),
// so a cursor that starts after the last seq a client saw delivers every
// later entry exactly once, whichever controller wrote it: what a previous
// leader committed is in the store, and what this one commits is heard.
// Live events that are not logged (steps) go to the cursors of their job
// as they come, best effort.
//
// Thread-safe. Lock order: callers' locks (the controller's) -> the hub's;
// the hub calls nothing while holding its lock, and reads the store
// without it.
#ifndef LOOM_CONTROLLER_EVENTS_EVENT_HUB_H_
#define LOOM_CONTROLLER_EVENTS_EVENT_HUB_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/store/store.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

class EventHub {
 public:
  struct Options {
    // Newest logged entries kept in memory (all jobs): a cursor within
    // them reads no database.
    size_t ring_entries = 4096;
    // Open cursors at most (each holds a streaming RPC's thread).
    int max_cursors = 256;
    // Live events waiting in one cursor at most; older ones are dropped.
    size_t live_queue = 1024;
  };

  // Registers as `store`'s logged-events listener; `store` must outlive
  // the hub, which unregisters when destroyed.
  EventHub(Store* store, Options options);
  ~EventHub();
  EventHub(const EventHub&) = delete;
  EventHub& operator=(const EventHub&) = delete;

  class Cursor {
   public:
    ~Cursor();  // frees its place
    Cursor(const Cursor&) = delete;
    Cursor& operator=(const Cursor&) = delete;

    // The logged events after the cursor's position (seq and job_id set),
    // in seq order, at most `limit`, followed by the live events that came
    // for its job; waits up to `timeout` while there are none, and returns
    // none then. The store's error if it cannot be read.
    absl::StatusOr<std::vector<loom::v1::JobEvent>> Next(absl::Duration timeout,
                                                        size_t limit = 256);
    // The last seq delivered or passed over (entries of other jobs).
    int64_t position() const { return after_; }
    // Whether the last Next reached the end of the log as this controller
    // knows it.
    bool caught_up() const { return caught_up_; }

   private:
    friend class EventHub;
    Cursor(EventHub* hub, std::string job_id, int64_t after)
        : hub_(hub), job_id_(std::move(job_id)), after_(after) {}
    EventHub* const hub_;
    const std::string job_id_;        // empty: every job
    int64_t after_;                   // only Next changes it (one reader)
    bool caught_up_ = false;
    std::deque<loom::v1::JobEvent> live_;  // guarded by hub_->mu_
    int64_t live_dropped_ = 0;             // guarded by hub_->mu_
  };

  // A cursor over one job's entries (`job_id`), or every job's (empty),
  // after `after_seq`; a negative `after_seq` starts at the end of the log
  // now. RESOURCE_EXHAUSTED when max_cursors are open.
  absl::StatusOr<std::unique_ptr<Cursor>> Subscribe(const std::string& job_id, int64_t after_seq);

  // One page of the log: entries after `after_seq` of `job_id` (all jobs
  // when empty), at most `limit`, read from the store.
  struct Page {
    std::vector<loom::v1::JobEvent> events;  // seq and job_id set
    int64_t last_seq = 0;  // the log's end when it was read
    bool more = false;     // entries of the job follow the page
  };
  absl::StatusOr<Page> Read(const std::string& job_id, int64_t after_seq, int64_t limit);

  // A live event for the cursors of `job_id` (and not for cursors over
  // every job, which read the log only); no copy is made when none.
  void PublishLive(const std::string& job_id, const loom::v1::JobEvent& event);
  // Whether any cursor follows `job_id` (so a caller can skip building a
  // live event nobody reads).
  bool Watched(const std::string& job_id);

  int open_cursors();

 private:
  void OnLogged(const std::vector<Store::LoggedEvent>& batch);
  // The entries of `c`'s job after its position from the ring, when the
  // ring holds every entry after it; false when the store must be read.
  bool FromRingLocked(Cursor& c, size_t limit, std::vector<loom::v1::JobEvent>* out);

  Store* const store_;
  const Options options_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Every logged entry with seq in (ring_after_, last_seq_], in order;
  // ring_after_ < 0 until this controller first commits one.
  std::deque<Store::LoggedEvent> ring_;
  int64_t ring_after_ = -1;
  int64_t last_seq_ = -1;
  std::multiset<std::string> watched_jobs_;  // the job of each open cursor
  std::set<Cursor*> cursors_;
};

// The event parsed from a logged entry, with seq and job_id set.
loom::v1::JobEvent ParseLoggedEvent(const Store::LoggedEvent& e);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_EVENTS_EVENT_HUB_H_
