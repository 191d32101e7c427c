// The controller's copy of every rank's log, as the workers ship it
// (WorkerService.AppendRankLogs), so that `loomctl logs` reads a rank's
// log without a shell on its worker, and after the worker is gone.
//
// One log per (job, rank, attempt), addressed by byte offset into what the
// rank wrote in that attempt. On disk, under `dir`:
//   <job>/rank-<r>/attempt-<g>/<offset, 16 digits>.log   segments, in order
//   <job>/rank-<r>/attempt-<g>/complete                  the rank exited
// A log keeps its newest max_bytes_per_log bytes (whole segments of a
// quarter of that are dropped from its start), so first_kept can grow.
// Appends are idempotent by offset: bytes the store already has are
// skipped, and an append past the end is not taken (the caller resends
// from the end it is told). A controller restart loses nothing written:
// the files are the state.
//
// Thread-safe; independent of the job manager's lock.
#ifndef LOOM_CONTROLLER_LOG_STORE_H_
#define LOOM_CONTROLLER_LOG_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::controller {

struct LogStoreOptions {
  std::string dir;                         // created if missing
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
  // Creates options.dir; INVALID_ARGUMENT for a bad max_bytes_per_log.
  static absl::StatusOr<std::unique_ptr<LogStore>> Open(LogStoreOptions options);

  // Appends `data`, which starts at `offset` of key's log, and marks the log
  // complete when `complete` (then later appends are not taken). Returns
  // the log's end afterwards: less than offset + data.size() when offset
  // was past the end (nothing taken) or the log was already complete.
  // INVALID_ARGUMENT for a job id that is not a plain name, a negative rank,
  // generation or offset.
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
  std::vector<LogInfo> List(const std::string& job_id);
  // Jobs with logs here.
  std::vector<std::string> Jobs();
  // Deletes every log of `job_id` (retention).
  absl::Status Remove(const std::string& job_id);

 private:
  struct Segment {
    int64_t base = 0;
    int64_t size = 0;
  };
  struct Log {
    std::vector<Segment> segments;  // ascending base, contiguous
    bool complete = false;
    int64_t end() const { return segments.empty() ? 0 : segments.back().base + segments.back().size; }
  };
  explicit LogStore(LogStoreOptions options) : options_(std::move(options)) {}
  std::string LogDir(const LogKey& key) const;
  std::string SegmentPath(const LogKey& key, int64_t base) const;
  // The log's state, loaded from disk on first use; nullptr when it has
  // none and `create` is false.
  Log* FindLocked(const LogKey& key, bool create);
  LogInfo InfoLocked(const LogKey& key, const Log& log) const;
  absl::StatusOr<Slice> ReadLocked(const LogKey& key, const Log& log, int64_t offset,
                                   int64_t max_bytes);

  const LogStoreOptions options_;
  std::mutex mu_;
  std::map<LogKey, Log> logs_;  // guarded by mu_; a cache of what is on disk
};

// OK if `job_id` can name a directory (letters, digits, '-', '_', '.', not
// starting with '.'; at most 200 bytes).
absl::Status CheckLogJobId(absl::string_view job_id);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_LOG_STORE_H_
