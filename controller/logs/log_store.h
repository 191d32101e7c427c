// The controller's copy of every rank's log, as the workers ship it
// (WorkerService.AppendRankLogs), so that `loomctl logs` reads a rank's
// log without a shell on its worker, after the worker is gone, and after a
// controller failover: the bytes live in the controller's store (the
// SQLite file, or the PostgreSQL database every controller of an
// installation shares), each append in one fenced transaction, so a log
// has every byte any controller acknowledged.
//
// One log per (job, rank, attempt), addressed by byte offset into what the
// rank wrote in that attempt. A log keeps its newest max_bytes_per_log
// bytes (whole appends are dropped from its start), so first_kept can
// grow. Appends are idempotent by offset: bytes the log already has are
// skipped, and an append past the end is not taken (the caller resends
// from the end it is told). Search finds lines across all of a job's logs
// through the store's trigram index.
//
// Thread-safe; independent of the job manager's lock.
#ifndef LOOM_CONTROLLER_LOGS_LOG_STORE_H_
#define LOOM_CONTROLLER_LOGS_LOG_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "controller/store/store.h"

namespace loom::controller {

struct LogStoreOptions {
  int64_t max_bytes_per_log = 16 << 20;    // >= 4096
};

struct LogKey {
  std::string job_id;
  int rank = 0;
  int64_t generation = 0;
  bool operator<(const LogKey& o) const {
    return std::tie(job_id, rank, generation) < std::tie(o.job_id, o.rank, o.generation);
  }
};

struct LogInfo {
  LogKey key;
  int64_t end = 0;         // bytes appended so far
  int64_t first_kept = 0;  // bytes before this were dropped
  bool complete = false;
};

class LogStore {
 public:
  // `store` must outlive the log store. INVALID_ARGUMENT for a bad
  // max_bytes_per_log.
  static absl::StatusOr<std::unique_ptr<LogStore>> Open(Store* store, LogStoreOptions options);

  // Appends `data`, which starts at `offset` of key's log, and marks the log
  // complete when `complete` (then later appends are not taken). Returns
  // the log's end afterwards: less than offset + data.size() when offset
  // was past the end (nothing taken) or the log was already complete.
  // INVALID_ARGUMENT for a job id that is not a plain name, a negative rank,
  // generation or offset; the store's error (ABORTED when this controller
  // no longer leads) if it cannot be written.
  absl::StatusOr<int64_t> Append(const LogKey& key, int64_t offset, absl::string_view data,
                                 bool complete);

  // Up to max_bytes of key's log from `offset` (clamped to
  // [first_kept, end]). NOT_FOUND when the store has no such log.
  struct Slice {
    LogInfo info;
    int64_t offset = 0;
    std::string data;
  };
  absl::StatusOr<Slice> Read(const LogKey& key, int64_t offset, int64_t max_bytes);
  // The last `lines` lines of key's log (at most max_bytes of them).
  absl::StatusOr<Slice> Tail(const LogKey& key, int lines, int64_t max_bytes);

  // Every log of `job_id`, by rank then attempt.
  absl::StatusOr<std::vector<LogInfo>> List(const std::string& job_id);
  // Jobs with logs here.
  absl::StatusOr<std::vector<std::string>> Jobs();
  // Deletes every log of `job_id` (retention).
  absl::Status Remove(const std::string& job_id);
  // Retention: deletes the logs of every job for which `expired(job_id)`
  // is true; the first error of those it met (it goes on past each).
  absl::Status RemoveExpired(const std::function<bool(const std::string& job_id)>& expired);

  // A line of a log that contains what was searched for: where it starts
  // in its log, and its text as valid UTF-8 without its line break.
  struct Line {
    LogKey key;
    int64_t offset = 0;
    std::string text;
  };
  struct Found {
    std::vector<Line> lines;  // by rank, attempt, offset
    bool truncated = false;   // more lines matched than were returned
  };
  // The lines of every log of `job_id` (all ranks, all attempts) that
  // contain `needle` (a plain string, case-sensitive), at most max_lines.
  // INVALID_ARGUMENT for an empty needle or a bad job id.
  absl::StatusOr<Found> Search(const std::string& job_id, absl::string_view needle,
                               int max_lines);

  // Brings the logs an older controller kept as files under `dir`
  // (<job>/rank-<r>/attempt-<g>/<offset>.log segments and a `complete`
  // marker) into the store, then renames `dir` to `dir`.imported so that
  // it is done once; no-op when `dir` does not exist. Returns the logs
  // brought in.
  absl::StatusOr<int> ImportFiles(const std::string& dir);

 private:
  LogStore(Store* store, LogStoreOptions options) : store_(store), options_(options) {}
  absl::StatusOr<int64_t> AppendChecked(const LogKey& key, int64_t offset, absl::string_view data,
                                        bool complete, bool start_anywhere);
  absl::StatusOr<LogInfo> InfoOf(const LogKey& key);
  // Bytes [from, from + max_bytes) of the log, clamped to what it holds.
  absl::StatusOr<Slice> ReadLocked(const LogInfo& info, int64_t from, int64_t max_bytes);

  Store* const store_;
  const LogStoreOptions options_;
};

// OK if `job_id` can name a directory (letters, digits, '-', '_', '.', not
// starting with '.'; at most 200 bytes).
absl::Status CheckLogJobId(absl::string_view job_id);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_LOGS_LOG_STORE_H_
