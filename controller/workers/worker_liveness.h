// Worker liveness and what it means for jobs: registration (a node that
// registers again lost what ran there), heartbeats (the ranks a worker
// runs reconciled against the records, starts sent and resent), leases
// that run out (the attempts with ranks there fail, or an elastic job
// re-plans), and re-adoption of running ranks after a controller restart.
//
// Leases, and why their times are ordered so. With G =
// worker_timeout and M = lease_margin:
//   * a worker kills its ranks itself when it has had no heartbeat answered
//     for G, counted from when it sent the last answered one (so its
//     deadline is never later than G after the controller last heard it),
//     unless one last heartbeat, answered within L = min(0.5 s, G/10),
//     renews the lease (this controller answers only a worker it holds
//     alive). While it has ranks, no heartbeat of its waits for an answer
//     past L after the lease's end, so the ranks die by G + 2L;
//   * the controller declares a worker dead after G of silence, failing the
//     attempts that had ranks there, and places those jobs again no sooner
//     than G + M after it last heard the worker. M covers the cut-off
//     worker's last heartbeat, SIGKILL and reaping of its ranks and the two
//     clocks' rates, so the old attempt's ranks are dead before a new
//     attempt starts;
//   * after a controller restart, workers whose lease is still running
//     re-register with their running ranks and the controller re-adopts
//     the current attempts' ranks (no restart counted). A job not wholly
//     re-adopted within G + M of the restart (every surviving worker has
//     re-registered or killed its ranks by then) restarts once, and is
//     placed again another M later, G + 2M after the restart.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_WORKERS_WORKER_LIVENESS_H_
#define LOOM_CONTROLLER_WORKERS_WORKER_LIVENESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "controller/admission/schedule_signal.h"
#include "controller/elastic/replanner.h"
#include "controller/jobs/job_table.h"
#include "controller/recovery/failure_handler.h"
#include "controller/store/store.h"
#include "controller/workers/rank_reconciler.h"
#include "controller/workers/worker_registry.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class WorkerLiveness {
 public:
  struct Options {
    absl::Duration worker_timeout = absl::Seconds(10);  // G above
    absl::Duration lease_margin = absl::Seconds(2);     // M above
    absl::Duration heartbeat_interval = absl::Milliseconds(500);
  };
  // All must outlive this; `replanner` may be null (elastic jobs that lose a
  // worker then restart like any other).
  WorkerLiveness(JobTable* jobs, WorkerRegistry* workers, const Clock* clock,
                 FailureHandler* failures, Replanner* replanner, ScheduleSignal* schedule,
                 Options options);

  // After the jobs were loaded at a controller start or takeover: attempts
  // that were running wait G + M for their ranks to be re-adopted. `why`
  // completes the READOPTED events' "re-adopted ... after ...".
  void AwaitReadoption(const std::string& why);
  // A worker registers: what ran on its node before is lost (the attempts
  // there restart), the ranks it reports running are re-adopted where they
  // are the current attempts' and were placed on its node. `*row` is what
  // the store's worker registry is to record (outside the lock).
  absl::StatusOr<loom::v1::RegisterWorkerResponse> Register(
      const loom::v1::RegisterWorkerRequest& req, Store::WorkerRow* row);
  // The first half of a heartbeat: renews the lease, stops ranks the records
  // do not want, marks attempts RUNNING, frees slots of ranks gone. Returns
  // the worker and what it runs; the scheduler may run before SendCommands.
  struct Beat {
    WorkerRegistry::Worker* worker = nullptr;
    RankReconciliation seen;
  };
  absl::StatusOr<Beat> Heartbeat(const loom::v1::HeartbeatRequest& req,
                                 loom::v1::HeartbeatResponse* resp);
  // The second half: starts due (new, or unconfirmed for three heartbeat
  // periods) and every command queued for the worker.
  void SendCommands(Beat& beat, loom::v1::HeartbeatResponse* resp);
  // A rank of rec's current attempt exited on `w`: after a controller
  // restart it is accounted for like a rank re-adopted.
  void AccountExit(JobRecord& rec, WorkerRegistry::Worker& w, int rank) { Adopt(rec, w, rank); }
  // Each tick: attempts whose re-adoption deadline passed restart.
  void CheckAdoptions();
  // Each tick: workers whose lease ran out are dead; their attempts fail (or
  // re-plan) and are placed again only after G + M.
  void CheckLeases();

 private:
  void AdoptRanks(WorkerRegistry::Worker& w, const loom::v1::RegisterWorkerRequest& req);
  // Moves `rank` of an attempt awaiting re-adoption to `w` when it was
  // placed on w's node (READOPTED once every rank is accounted for); false
  // when the attempt is not waiting for it.
  bool Adopt(JobRecord& rec, WorkerRegistry::Worker& w, int rank);
  void ForgetWorkerRanks(const std::string& worker_id);

  JobTable* const jobs_;
  WorkerRegistry* const workers_;
  const Clock* const clock_;
  FailureHandler* const failures_;
  Replanner* const replanner_;
  ScheduleSignal* const schedule_;
  const Options options_;
  std::string recovered_because_ = "the controller restarted";
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_WORKERS_WORKER_LIVENESS_H_
