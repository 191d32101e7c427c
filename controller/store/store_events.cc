// Store: the event log (table job_events, migration 4): appends and reads.
#include <limits>

#include "controller/store/store.h"

namespace loom::controller {
namespace {

using store::Int;
using store::Text;

}  // namespace

void Store::AddLoggedEventsListener(const void* key, LoggedEventsListener listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  events_listeners_[key] = std::move(listener);
}

void Store::RemoveLoggedEventsListener(const void* key) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  events_listeners_.erase(key);
}

absl::Status Store::AppendEvents(const std::vector<LoggedEvent>& events) {
  return Wait(Enqueue(nullptr, 0, {}, "", events));
}

absl::StatusOr<std::vector<Store::LoggedEvent>> Store::LoadEvents(const std::string& job_id,
                                                                  int64_t after_seq,
                                                                  int64_t limit) {
  const int64_t most = limit > 0 ? limit : std::numeric_limits<int64_t>::max();
  WatchedLock lock(mu_, __func__);
  auto r = job_id.empty()
               ? conn_->Run("SELECT seq, job_id, idx, kind, time_unix_ms, payload FROM job_events "
                            "WHERE seq > ? ORDER BY seq LIMIT ?;",
                            {Int(after_seq), Int(most)})
               : conn_->Run("SELECT seq, job_id, idx, kind, time_unix_ms, payload FROM job_events "
                            "WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?;",
                            {Text(job_id), Int(after_seq), Int(most)});
  if (!r.ok()) return r.status();
  std::vector<LoggedEvent> events;
  events.reserve(r->rows.size());
  for (const auto& row : r->rows) {
    LoggedEvent e;
    e.seq = row[0].i;
    e.job_id = row[1].s;
    e.idx = row[2].i;
    e.kind = static_cast<int32_t>(row[3].i);
    e.time_unix_ms = row[4].i;
    e.payload = row[5].s;
    events.push_back(std::move(e));
  }
  return events;
}

absl::StatusOr<int64_t> Store::PruneEvents(const std::string& job_id, int64_t keep) {
  if (keep < 1) return absl::InvalidArgumentError("keep: must be >= 1");
  int64_t deleted = 0;
  WatchedLock lock(mu_, __func__);
  absl::Status s = WriteTransactionLocked([&]() -> absl::Status {
    auto r = conn_->Run(
        "DELETE FROM job_events WHERE job_id = ? AND kind <> ? AND seq < (SELECT COALESCE(MIN(seq), 0) "
        "FROM (SELECT seq FROM job_events WHERE job_id = ? AND kind <> ? ORDER BY seq DESC "
        "LIMIT ?) AS newest);",
        {Text(job_id), Int(kLoggedTransition), Text(job_id), Int(kLoggedTransition), Int(keep)});
    if (!r.ok()) return r.status();
    deleted = r->affected;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return deleted;
}

absl::StatusOr<int64_t> Store::LastEventSeq() {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run("SELECT COALESCE(MAX(seq), 0) FROM job_events;", {});
  if (!r.ok()) return r.status();
  return r->rows[0][0].i;
}

}  // namespace loom::controller
