// A job as the controller holds it: its durable part (loom.v1.Job) and what
// the controller keeps about its current attempt in memory only. Shared by
// the job table (jobs/job_table.h) and the subsystems that act on jobs
// through it; every field's owner is named beside it.
#ifndef LOOM_CONTROLLER_JOBS_JOB_RECORD_H_
#define LOOM_CONTROLLER_JOBS_JOB_RECORD_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "controller/recovery/slow_rank_detector.h"
#include "controller/recovery/spike_detector.h"
#include "controller/store/store.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

// A rank failure of the current attempt, not yet resolved.
struct PendingFailure {
  absl::Time at;
  std::string reason;
  bool rendezvous = false;  // a rank failed to join before any step
  // Why restarting cannot help, when a rank's exit code says so
  // (RecoveryPolicy::NoRestartBecause): the job fails without spending a
  // restart. Empty: the usual policy.
  std::string no_restart_because;
  // Set when the cause is known better than "a rank failed" (a rank its
  // worker killed when its lease ran out): the kCause* value.
  std::string cause_kind;
};

// Why the current attempt's ranks were asked to save at their next step
// boundary and stop, and so what follows once every rank is gone
// (preemption/preemptor.h's MoveHandler).
enum class MoveIntent {
  kPreempt,       // checkpoint-then-preempt for another job: requeued PREEMPTED
  kGrow,          // an elastic job saw room to grow: re-planned larger
  kAwayFromNode,  // a slow rank's node was cordoned: re-planned or placed without it
  kReplanAround,  // a slow rank's stage gets fewer blocks: placed again, re-split
  kDrain,         // its node is draining: re-planned or placed again without it
};

// A save-and-stop under way for the current attempt: its ranks were asked to
// save at their next step boundary and stop.
struct PreemptionInProgress {
  MoveIntent intent = MoveIntent::kPreempt;
  absl::Time since;
  absl::Time deadline;  // since + the queue's grace: then a plain stop
  std::string for_job_id;
  std::string reason;  // scheduling::PreemptionReasonName, or the move's kCause* value
  std::string message;
  int64_t step_at_ask = -1;    // the last step reported when asked
  bool forced = false;         // the grace ran out and a plain stop was sent
  int grow_to = 0;             // kGrow: the gang it saw room for
  std::string away_from_node;  // kAwayFromNode, kDrain: the node it leaves
};

// One job: its durable part (`job`) and what the controller keeps about its
// current attempt in memory only.
struct JobRecord {
  loom::v1::Job job;
  std::optional<PendingFailure> pending_failure;  // first rank failure, unresolved
  int rendezvous_retries = 0;                     // consecutive attempts placed again after one
  std::set<int> exited_ok;  // ranks that finished with exit code 0 (JobTable::RankFinished)
  std::set<int> running_seen;
  // (worker id, rank) of rank processes started and not yet known to have
  // exited. A restarted job is not placed again until this is empty, so
  // two attempts never write the same checkpoint directory at once.
  std::set<std::pair<std::string, int>> live;
  std::unique_ptr<recovery::SpikeDetector> detector;  // created on first step
  // Slow ranks of the current attempt (created on its first report with
  // per-rank compute times; slow_ranks_generation is the attempt's).
  std::unique_ptr<recovery::SlowRankDetector> slow_ranks;
  int64_t slow_ranks_generation = -1;
  // recovery.slow_rank.action "replan": node -> its measured slowdown. At
  // each placement the pipeline stages are split for the slowest node of
  // each stage (slow_ranks/stage_split.h StageLayersForPlacement).
  std::map<std::string, double> node_slowdown;
  // The blocks per stage the current attempt was started with (empty: the
  // engine's own split).
  std::vector<int> stage_layers_now;
  int unstored_transitions = 0;  // history entries a failed write left off the disk
  // Event log entries (idx up to job.events_logged) that no durable write
  // has carried yet: every write of the job carries them all, and they are
  // dropped once one that carried them is durable.
  std::vector<Store::LoggedEvent> unstored_events;
  int64_t last_spike_step = -1;
  // step -> data batch index it trained on, for the recent steps of the
  // current attempt (bounded); used to keep skip ranges replayable.
  std::map<int64_t, int64_t> step_batches;
  bool skip_widened = false;
  int64_t attempt_last_step = -1;  // last step reported by the current attempt
  // The newest in-memory snapshot step each rank's node holds (-1: none),
  // indexed by rank, as the current attempt last reported it
  // (StepMetrics.rank_snapshot_steps); empty when it keeps none.
  std::vector<int64_t> attempt_snapshot_steps;
  // The newest steps with a time split, for the bottleneck verdict
  // (diagnosis.h); bounded by DiagnosisOptions::window.
  std::deque<loom::v1::StepMetrics> recent_steps;
  // After a controller restart: the attempt waits until this time for its
  // ranks to be re-adopted (absl::InfinitePast(): not waiting).
  absl::Time adopt_deadline = absl::InfinitePast();
  std::set<int> adopted;  // ranks re-adopted (or accounted by their exit) so far
  // The attempt was running when the controller restarted: a failure of it
  // is attributed to the restart (kCauseControllerRestart).
  bool across_controller_restart = false;
  // Not placed again before this time: ranks of the previous attempt may
  // still run on a worker whose lease has not run out.
  absl::Time not_before = absl::InfinitePast();
  // Generation -> rank -> node of the recent attempts (JobManager's
  // AttemptPlacements).
  std::map<int64_t, std::map<int, std::string>> placements;
  std::optional<PreemptionInProgress> preempting;
  // Elastic jobs: when the controller last looked for room to grow.
  absl::Time grow_checked = absl::InfinitePast();
  // The current attempt was admitted into capacity reserved for another
  // gang (scheduling::Admission::opportunistic): the first to preempt.
  bool opportunistic = false;
  // The newest committed checkpoint's step this controller has heard of
  // (0: none yet, or none since it started): the work a preemption would
  // redo is attempt_last_step minus this.
  int64_t newest_checkpoint_step = 0;
};

// Where the next attempt of `rec` resumes when the current one stops
// without a save: the newest of `checkpoint_step` (its newest good
// checkpoint) and the snapshots its ranks' nodes hold, counting only nodes
// for which `node_alive` holds (a lost node's memory went with it).
inline int64_t ResumePointAfterLoss(const JobRecord& rec, int64_t checkpoint_step,
                                    const std::function<bool(const std::string&)>& node_alive) {
  int64_t resume = checkpoint_step;
  for (const loom::v1::RankAssignment& r : rec.job.ranks()) {
    if (r.rank() < 0 || r.rank() >= static_cast<int>(rec.attempt_snapshot_steps.size())) continue;
    if (!node_alive(r.node())) continue;
    resume = std::max(resume, rec.attempt_snapshot_steps[r.rank()]);
  }
  return resume;
}

// Restarts, rollbacks, loss spikes and preemptions over every job.
struct RecoveryTotals {
  int64_t restarts = 0, rollbacks = 0, spikes = 0, preemptions = 0;
};

// The controller's figures for /metrics, kept as jobs change rather than
// found by a scan of every job (JobManager::Gauges).
struct ControllerGauges {
  std::map<loom::v1::JobState, int> jobs_by_state;
  int alive_workers = 0;
  int64_t store_write_failures = 0;  // job writes that failed (each retried)
  int64_t illegal_transitions = 0;   // 0 unless the controller has a bug
  RecoveryTotals recovery;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOBS_JOB_RECORD_H_
