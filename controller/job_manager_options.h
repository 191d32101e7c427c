// What loom-controller's job manager is configured with (its flags,
// controller/controller_flags.h); each subsystem is given its part.
#ifndef LOOM_CONTROLLER_JOB_MANAGER_OPTIONS_H_
#define LOOM_CONTROLLER_JOB_MANAGER_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace loom::controller {

struct JobManagerOptions {
  // At most this many event streams (WatchJob, WatchEvents) at once, all
  // jobs together; one more is RESOURCE_EXHAUSTED.
  int max_watchers = 256;
  // A finished job's step series is thinned to at most this many rows
  // (evenly spaced, the first and last kept) once it ends, so charts of old
  // jobs stay whole while the store does not grow with every step ever
  // trained; 0 keeps every step.
  int64_t finished_steps_kept = 20000;
  // A finished job keeps its newest this many event log entries other than
  // transitions (recovery events, checkpoints) once it ends; every
  // transition is kept. 0 keeps every entry.
  int64_t finished_events_kept = 10000;
  // A worker whose last heartbeat is older than this is declared dead; it
  // is also the lease grace workers are told (RegisterWorkerResponse).
  absl::Duration worker_timeout = absl::Seconds(10);
  // What a dead worker's jobs wait beyond worker_timeout (the lease order:
  // workers/worker_liveness.h).
  absl::Duration lease_margin = absl::Seconds(2);
  // Ticks further apart than this mean the controller itself was not
  // running (its host or VM frozen, the process stopped): the excess is not
  // counted as its workers' silence (WorkerRegistryOptions::pause_threshold).
  // It only delays declaring workers dead, so the lease order above holds.
  // InfiniteDuration: off (tests that step a fake clock between ticks).
  absl::Duration pause_threshold = absl::InfiniteDuration();
  // What workers are told to use as their heartbeat period.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // Root for default checkpoint directories: <dir>/<job id>. A spec's own
  // checkpoint.dir must lie beneath it or one of extra_checkpoint_roots,
  // and data paths under data_roots (controller/admission/path_policy.h); empty
  // data_roots leave data unconfined. No two unfinished jobs share a
  // checkpoint directory (nor one inside another's).
  std::string checkpoint_root;
  std::vector<std::string> extra_checkpoint_roots;
  std::vector<std::string> data_roots;
  // When a rank fails, the job waits this long before it is marked FAILED,
  // so that a worker that died (and took the rank's peers with it) can be
  // named as the cause instead of the peer's "connection closed" error.
  absl::Duration failure_settle_time = absl::Seconds(1);
  // An attempt whose rank could not join the job's process groups before any
  // step (exit code kRankExitRendezvousFailed, common/rank_exit.h) lost no
  // work: it is placed again this many times in a row without counting a
  // restart, then the failure takes the usual restart-or-fail path.
  int max_rendezvous_retries = 3;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOB_MANAGER_OPTIONS_H_
