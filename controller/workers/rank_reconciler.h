// A worker's heartbeat against the controller's job records: which ranks it
// runs belong to their job's current attempt (confirmed), which must be
// stopped (ranks of ended or requeued jobs, of stale attempts, or not placed
// on that worker), and which delivered starts are due to be sent again.
// WorkerLiveness::Heartbeat applies the outcome (transitions, commands) under
// its lock; these functions only read the records, except DueStarts, which
// updates the worker's unconfirmed starts.
//
// No clock, no store, no gRPC. Thread-compatible.
#ifndef LOOM_CONTROLLER_WORKERS_RANK_RECONCILER_H_
#define LOOM_CONTROLLER_WORKERS_RANK_RECONCILER_H_

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "controller/jobs/job_table.h"
#include "controller/workers/worker_registry.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

struct RankReconciliation {
  // Stops to send with this heartbeat's answer; none for a job (and
  // attempt) that already has a stop queued on the worker.
  std::vector<loom::v1::StopRank> stops;
  // (job, rank) of the current attempts' ranks placed on this worker.
  std::vector<std::pair<std::string, int>> confirmed;
  // Every (job, rank) the worker runs, and with its attempt.
  std::set<std::pair<std::string, int>> running;
  std::set<std::tuple<std::string, int, int64_t>> running_attempts;
};

// `jobs` is the controller's catalog; `worker` the heartbeating worker
// (its id, and its queued commands). A rank of a job whose attempt waits
// for re-adoption after a controller restart (adopt_deadline set) is
// neither confirmed nor stopped when it is not placed here yet.
RankReconciliation ReconcileRunningRanks(const loom::v1::HeartbeatRequest& req,
                                         const WorkerRegistry::Worker& worker,
                                         const JobTable& jobs);

// The worker's delivered, unconfirmed starts (worker->unacked): forgets
// those whose attempt ended, was replaced or whose rank now runs
// (`running_attempts`), and returns those last sent more than
// `resend_after` before `now`, marking them sent at `now`.
std::vector<loom::v1::StartRank> DueStarts(
    const std::set<std::tuple<std::string, int, int64_t>>& running_attempts, const JobTable& jobs,
    absl::Time now, absl::Duration resend_after, WorkerRegistry::Worker* worker);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_WORKERS_RANK_RECONCILER_H_
