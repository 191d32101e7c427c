#include "controller/events/event_hub.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace loom::controller {

loom::v1::JobEvent ParseLoggedEvent(const Store::LoggedEvent& e) {
  loom::v1::JobEvent out;
  if (!out.ParseFromString(e.payload)) {
    // Written by this code only; a payload that does not parse still keeps
    // its place in the sequence, so a reader's position moves past it.
    out.Clear();
  }
  out.set_seq(e.seq);
  out.set_job_id(e.job_id);
  return out;
}

EventHub::EventHub(Store* store, Options options) : store_(store), options_(options) {
  store_->AddLoggedEventsListener(
      this, [this](const std::vector<Store::LoggedEvent>& batch) { OnLogged(batch); });
}

EventHub::~EventHub() { store_->RemoveLoggedEventsListener(this); }

void EventHub::OnLogged(const std::vector<Store::LoggedEvent>& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Store::LoggedEvent& e : batch) {
    // Numbers are consecutive within one leadership (one writer); anything
    // else starts the ring afresh, and cursors before it read the store.
    if (ring_after_ < 0 || e.seq != last_seq_ + 1) {
      ring_.clear();
      ring_after_ = e.seq - 1;
    }
    ring_.push_back(e);
    last_seq_ = e.seq;
  }
  while (ring_.size() > options_.ring_entries) {
    ring_.pop_front();
    ring_after_ += 1;
  }
  cv_.notify_all();
}

bool EventHub::FromRingLocked(Cursor& c, size_t limit, std::vector<loom::v1::JobEvent>* out) {
  if (ring_after_ < 0 || c.after_ < ring_after_) return false;
  for (size_t i = static_cast<size_t>(c.after_ - ring_after_);
       i < ring_.size() && out->size() < limit; ++i) {
    const Store::LoggedEvent& e = ring_[i];
    c.after_ = e.seq;
    if (c.job_id_.empty() || e.job_id == c.job_id_) out->push_back(ParseLoggedEvent(e));
  }
  c.caught_up_ = c.after_ >= last_seq_;
  return true;
}

absl::StatusOr<std::unique_ptr<EventHub::Cursor>> EventHub::Subscribe(const std::string& job_id,
                                                                      int64_t after_seq) {
  if (after_seq < 0) {
    std::unique_lock<std::mutex> lock(mu_);
    if (last_seq_ >= 0) {
      after_seq = last_seq_;
    } else {
      lock.unlock();
      absl::StatusOr<int64_t> last = store_->LastEventSeq();
      if (!last.ok()) return last.status();
      after_seq = *last;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int>(cursors_.size()) >= options_.max_cursors) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the controller already serves ", cursors_.size(),
        " watch streams (its limit, --max_watchers); end one, or poll with loomctl status"));
  }
  std::unique_ptr<Cursor> c(new Cursor(this, job_id, after_seq));
  cursors_.insert(c.get());
  watched_jobs_.insert(job_id);
  return c;
}

EventHub::Cursor::~Cursor() {
  std::lock_guard<std::mutex> lock(hub_->mu_);
  hub_->cursors_.erase(this);
  auto at = hub_->watched_jobs_.find(job_id_);
  if (at != hub_->watched_jobs_.end()) hub_->watched_jobs_.erase(at);
}

void EventHub::PublishLive(const std::string& job_id, const loom::v1::JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (job_id.empty() || watched_jobs_.count(job_id) == 0) return;
  for (Cursor* c : cursors_) {
    if (c->job_id_ != job_id) continue;
    if (c->live_.size() >= options_.live_queue) {
      c->live_.pop_front();
      c->live_dropped_ += 1;
    }
    c->live_.push_back(event);
    c->live_.back().set_job_id(job_id);
  }
  cv_.notify_all();
}

absl::StatusOr<EventHub::Page> EventHub::Read(const std::string& job_id, int64_t after_seq,
                                                int64_t limit) {
  Page page;
  absl::StatusOr<int64_t> last = store_->LastEventSeq();  // first: the page ends at or after it
  if (!last.ok()) return last.status();
  page.last_seq = *last;
  absl::StatusOr<std::vector<Store::LoggedEvent>> read =
      store_->LoadEvents(job_id, after_seq, limit + 1);
  if (!read.ok()) return read.status();
  page.more = static_cast<int64_t>(read->size()) > limit;
  if (page.more) read->pop_back();
  for (const Store::LoggedEvent& e : *read) {
    page.events.push_back(ParseLoggedEvent(e));
    page.last_seq = std::max(page.last_seq, e.seq);
  }
  return page;
}

bool EventHub::Watched(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return watched_jobs_.count(job_id) > 0;
}

int EventHub::open_cursors() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(cursors_.size());
}

absl::StatusOr<std::vector<loom::v1::JobEvent>> EventHub::Cursor::Next(absl::Duration timeout,
                                                                      size_t limit) {
  const absl::Time deadline = absl::Now() + timeout;
  limit = std::max<size_t>(limit, 1);
  for (;;) {
    std::vector<loom::v1::JobEvent> out;
    {
      std::unique_lock<std::mutex> lock(hub_->mu_);
      if (hub_->FromRingLocked(*this, limit, &out)) {
        for (; !live_.empty(); live_.pop_front()) out.push_back(std::move(live_.front()));
        if (!out.empty() || !caught_up_) return out;
        const bool more = hub_->cv_.wait_until(lock, absl::ToChronoTime(deadline), [this] {
          return hub_->last_seq_ > after_ || !live_.empty();
        });
        if (!more) return out;
        continue;
      }
    }
    // The ring does not reach back to the cursor: read the store. (The end
    // is read first: whatever commits after it is in the ring or the next
    // read.)
    absl::StatusOr<int64_t> last = hub_->store_->LastEventSeq();
    if (!last.ok()) return last.status();
    absl::StatusOr<std::vector<Store::LoggedEvent>> page =
        hub_->store_->LoadEvents(job_id_, after_, static_cast<int64_t>(limit));
    if (!page.ok()) return page.status();
    if (!page->empty()) {
      for (const Store::LoggedEvent& e : *page) out.push_back(ParseLoggedEvent(e));
      after_ = page->back().seq;
      caught_up_ = false;
      return out;
    }
    // None of its job up to the end read: it is there now.
    after_ = std::max(after_, *last);
    caught_up_ = true;
    std::unique_lock<std::mutex> lock(hub_->mu_);
    if (hub_->ring_after_ >= 0 && after_ >= hub_->ring_after_) continue;  // the ring has the rest
    for (; !live_.empty(); live_.pop_front()) out.push_back(std::move(live_.front()));
    if (!out.empty()) return out;
    // Nothing committed here yet that reaches it (a controller that has
    // not written since it started): wait for a commit, then read again.
    const bool more = hub_->cv_.wait_until(lock, absl::ToChronoTime(deadline), [this] {
      return hub_->last_seq_ > after_ || !live_.empty();
    });
    if (!more) return out;
  }
}

}  // namespace loom::controller
