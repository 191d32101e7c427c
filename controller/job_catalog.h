// The controller's jobs: every job's record in
// memory, in submission order, with the indexes the periodic checks read
// (the PENDING queue, the unfinished jobs, counts by state, recovery totals
// of ended jobs), and its durable copy in the Store. JobManager coordinates
// it with the worker registry, the scheduler and the recovery policy.
//
// Durable writes: Persist writes a record; a write that fails is handled
// here, not by callers: the change stands in memory, the job is marked
// unpersisted, logged once and counted (write_failures), and every
// RetryUnpersisted (each controller tick) writes it again, with every
// transition not yet stored, until the store takes it.
//
// Not thread-safe: JobManager's mutex guards it.
#ifndef LOOM_CONTROLLER_JOB_CATALOG_H_
#define LOOM_CONTROLLER_JOB_CATALOG_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "controller/jobs/job_state_machine.h"
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

// Checkpoint-then-preempt under way for the current attempt: its ranks
// were asked to save at their next step boundary and stop.
struct PreemptionInProgress {
  absl::Time since;
  absl::Time deadline;  // since + the queue's grace: then a plain stop
  std::string for_job_id;
  std::string reason;  // scheduling::PreemptionReasonName
  std::string message;
  int64_t step_at_ask = -1;  // the last step reported when asked
  bool forced = false;       // the grace ran out and a plain stop was sent
  // Not a preemption: an elastic job saving to grow (JobManager::
  // GrowElasticJobsLocked); once its ranks are gone it is re-planned.
  bool grow = false;
  int grow_to = 0;  // the gang it saw room for
  // Not a preemption either: a slow rank's node was cordoned
  // (recovery.slow_rank.action "cordon", JobManager::HandleSlowRankLocked);
  // once the ranks are gone the job is re-planned (elastic) or placed again
  // (not elastic) without it.
  std::string away_from_node;
  // Not a preemption either: a slow rank's pipeline stage is to get fewer
  // blocks (recovery.slow_rank.action "replan"); once the ranks are gone the
  // job is placed again, its stages split for the nodes' measured speeds.
  bool replan_around = false;
};

// One job: its durable part (`job`) and what the controller keeps about its
// current attempt in memory only.
struct JobRecord {
  loom::v1::Job job;
  std::optional<PendingFailure> pending_failure;  // first rank failure, unresolved
  int rendezvous_retries = 0;  // consecutive attempts placed again after one
  std::set<int> exited_ok;     // ranks that finished with exit code 0
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
  // each stage (JobManager::StageLayersForPlacementLocked).
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

// Restarts, rollbacks, loss spikes and preemptions over every job.
struct RecoveryTotals {
  int64_t restarts = 0, rollbacks = 0, spikes = 0, preemptions = 0;
};

class JobCatalog {
 public:
  // `store` and `clock` must outlive the catalog.
  JobCatalog(Store* store, const Clock* clock) : store_(store), clock_(clock) {}
  JobCatalog(const JobCatalog&) = delete;
  JobCatalog& operator=(const JobCatalog&) = delete;

  // Loads every stored job into an empty catalog (a controller start) and
  // continues the id sequence after the largest stored. Jobs found ended
  // count in the totals and are not thinned again. The store's error if it
  // cannot be read.
  absl::Status Load();
  // The same with the jobs given (a standby's warm copy of every stored job,
  // oldest first, as Store::LoadJobs orders them) instead of reading them.
  absl::Status Load(std::vector<loom::v1::Job> jobs);

  // "<name>-<seq>"; sequences never repeat (across restarts too).
  std::string NewJobId(const std::string& name);
  // A new record for `id`, last in submission order, in no state yet
  // (JOB_STATE_UNSPECIFIED): give it its first transition, then StoreNew.
  JobRecord& Add(const std::string& id);
  // Writes a record just added and given its first transition; if the
  // store fails, takes the record back out (the job was never submitted)
  // and returns UNAVAILABLE saying so.
  absl::Status StoreNew(JobRecord& rec);

  // Null when there is no such job.
  JobRecord* Find(const std::string& id);
  const JobRecord* Find(const std::string& id) const;
  // NOT_FOUND "no job with id ..." when there is no such job.
  absl::StatusOr<JobRecord*> Lookup(const std::string& id);
  // Every record by id.
  std::map<std::string, JobRecord>& records() { return records_; }
  const std::map<std::string, JobRecord>& records() const { return records_; }

  // Appends the transition to `rec`'s history (time now), sets its state
  // and reason and the indexes; in memory only (Persist writes it). A
  // transition the state machine (jobs/job_state_machine.h) does not allow
  // is a controller bug: it is recorded all the same, so that the history
  // stays whole, logged and counted (illegal_transitions).
  const loom::v1::StateTransition& RecordTransition(JobRecord& rec, loom::v1::JobState to,
                                                    const std::string& reason);
  // Gives `event` (a transition, recovery event or committed checkpoint;
  // its `job` is not kept) the job's next event log number and keeps it on
  // the record until a write carries it to the log, in the transaction
  // that writes the job as it stands then. RecordTransition calls it.
  void RecordEvent(JobRecord& rec, loom::v1::JobEvent event);
  // The entries a write that carried `rec.unstored_events` up to idx
  // `through` stored: dropped from the record (later ones stay).
  static void EventsStored(JobRecord& rec, int64_t through);
  // The idx of the newest entry a write of `rec` would carry now (0: none).
  static int64_t NewestUnstoredEvent(const JobRecord& rec);
  // Jobs stored before the event log existed (events_logged 0, with a
  // history): their transitions and recovery events are given numbers now,
  // in time order, and written with the jobs at the next RetryUnpersisted
  // (one transaction for all, not counted as a failed write). Called by
  // Load; returns how many jobs it changed.
  int BackfillEventLog();

  // Writes `rec` (its updated time set now) with its `new_transitions`
  // newest history entries added since the last write and its unstored
  // event log entries; see the file comment for a failed write.
  void Persist(JobRecord& rec, int new_transitions);
  // A write of `id` outside Persist failed (a step report's transaction):
  // counted, and the job written again by RetryUnpersisted.
  void MarkUnpersisted(const std::string& id);
  // Writes every job whose newest state is not stored (each in line first,
  // so that they share transactions, then waited for).
  void RetryUnpersisted();
  int64_t write_failures() const { return write_failures_; }
  int64_t illegal_transitions() const { return illegal_transitions_; }

  // PENDING and PREEMPTED jobs by submission position: the scheduler's queue.
  const std::set<std::pair<size_t, std::string>>& pending() const { return pending_; }
  // Jobs not ended.
  const std::set<std::string>& unfinished() const { return unfinished_; }
  const std::map<loom::v1::JobState, int>& state_counts() const { return state_counts_; }
  RecoveryTotals Totals() const;
  // Jobs that ended since the last call, whose step series are to be
  // thinned.
  std::vector<std::string> TakeEndedToThin();

  // Jobs in `states` (all when empty), newest first; at most `limit` (all
  // when <= 0).
  std::vector<loom::v1::Job> List(const std::set<loom::v1::JobState>& states, int limit) const;
  // One page of them: those with a sequence below `before_seq` (0: from the
  // newest), at most `page_size`; `full` false: the fields a listing shows
  // (no spec beyond name, schedule and resources; no plan, history or
  // events). *next_before_seq: where the next page starts, 0 at the end.
  std::vector<loom::v1::Job> ListPage(const std::set<loom::v1::JobState>& states, int page_size,
                                      int64_t before_seq, bool full,
                                      int64_t* next_before_seq) const;

 private:
  // Keeps pending_, unfinished_, state_counts_ and finished_totals_ in step
  // with a job moving from `from` to `to` (JOB_STATE_UNSPECIFIED: new, or
  // forgotten).
  void Index(const std::string& id, loom::v1::JobState from, loom::v1::JobState to);
  // What follows a write of `rec` that carried its events up to `through`:
  // on success the carried entries and transitions are dropped and the job
  // is stored again; on failure it is counted and kept for a retry.
  void AfterWrite(JobRecord& rec, const absl::Status& s, int64_t through);
  void Remove(const std::string& id);

  Store* const store_;
  const Clock* const clock_;
  std::map<std::string, JobRecord> records_;  // by id
  std::vector<std::string> order_;            // ids in submission order
  std::map<std::string, size_t> position_;    // id -> position in order_
  std::set<std::pair<size_t, std::string>> pending_;
  std::set<std::string> unfinished_;
  std::map<loom::v1::JobState, int> state_counts_;
  RecoveryTotals finished_totals_;        // of jobs that have ended
  std::vector<std::string> to_thin_;      // ended jobs whose series to thin
  std::set<std::string> unpersisted_;     // jobs whose newest state is not on disk
  std::set<std::string> backfilled_;      // jobs whose log entries BackfillEventLog added
  int64_t write_failures_ = 0;
  int64_t illegal_transitions_ = 0;
  int64_t next_seq_ = 1;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOB_CATALOG_H_
