// The rank logs the controller keeps (LogStore) as the two log RPCs use
// them: a worker appends only the logs of ranks that ran on its own node,
// and a reader gets one rank's log of one attempt (the newest by default)
// with every attempt's log listed and the node each rank ran on. The gRPC
// handlers (controller_service.cc) admit the caller and check the worker's
// identity; this class validates the request and does the rest.
//
// Thread-safe: LogStore is, and the placements come from a function that
// takes its own lock (JobManager::AttemptPlacements).
#ifndef LOOM_CONTROLLER_LOGS_RANK_LOGS_H_
#define LOOM_CONTROLLER_LOGS_RANK_LOGS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "controller/logs/log_store.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class RankLogs {
 public:
  // Generation -> rank -> node of a job's recent attempts; NOT_FOUND for an
  // unknown job (JobManager::AttemptPlacements).
  using Placements = std::map<int64_t, std::map<int, std::string>>;
  using PlacementsOf = std::function<absl::StatusOr<Placements>(const std::string& job_id)>;

  // `logs` must outlive this.
  RankLogs(LogStore* logs, PlacementsOf placements)
      : logs_(logs), placements_(std::move(placements)) {}

  // GetRankLog: INVALID_ARGUMENT naming the field for a bad request
  // (job_id, rank, generation, offset, tail_lines, max_bytes), the
  // placements' NOT_FOUND for an unknown job, NOT_FOUND "no log of rank R
  // ... yet" (naming the ranks that have logs) when there is none.
  absl::StatusOr<loom::v1::GetRankLogResponse> Get(const loom::v1::GetRankLogRequest& request);

  // SearchRankLogs: INVALID_ARGUMENT naming the field (job_id, pattern,
  // max_lines), the placements' NOT_FOUND for an unknown job.
  absl::StatusOr<loom::v1::SearchRankLogsResponse> Search(
      const loom::v1::SearchRankLogsRequest& request);

  // AppendRankLogs from the worker on `node` (the caller checked that the
  // worker is who it says): INVALID_ARGUMENT naming chunks[i].field; a chunk
  // of a rank that did not run on `node` in its attempt is dropped and
  // answered -1, so one worker cannot write another's logs.
  absl::StatusOr<loom::v1::AppendRankLogsResponse> Append(
      const loom::v1::AppendRankLogsRequest& request, const std::string& node);
  // The chunk checks Append makes, for a handler that reports them before
  // it checks who the caller is.
  static absl::Status ValidateAppend(const loom::v1::AppendRankLogsRequest& request);

  // The largest slice Get returns (below gRPC's 4 MiB message limit).
  static constexpr int64_t kMaxBytes = (4 << 20) - (64 << 10);

 private:
  LogStore* const logs_;
  const PlacementsOf placements_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_LOGS_RANK_LOGS_H_
