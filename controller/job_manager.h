// The controller's domain logic: job lifecycle (the jobs and their durable
// copies are controller/job_catalog.h's JobCatalog), what worker
// liveness means for jobs (the registry of workers, their leases and slots
// is controller/worker_registry.h), gang scheduling of ranks onto worker
// slots (where each rank goes is controller/scheduler.h's PlaceGang),
// carrying out recovery (what a failure or a loss spike leads to is
// controller/recovery/recovery_policy.h's), and fan-out of job events to watchers.
// No gRPC types: the service adapters in controller_service.cc translate
// requests into these calls.
//
// Job lifecycle: the legal transitions are jobs/job_state_machine.h's;
// every transition is recorded with time and reason.
//
// Thread-safe: one mutex guards all state; store writes happen under it so
// that the order on disk is the order of events.
#ifndef LOOM_CONTROLLER_JOB_MANAGER_H_
#define LOOM_CONTROLLER_JOB_MANAGER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "controller/checkpoint_catalog.h"
#include "controller/events/event_hub.h"
#include "controller/events/job_watch.h"
#include "controller/job_catalog.h"
#include "controller/job_planning.h"
#include "controller/recovery/spike_detector.h"
#include "controller/recovery/recovery_metrics.h"
#include "controller/recovery/recovery_policy.h"
#include "controller/scheduling/admission.h"
#include "controller/scheduling/fair_share.h"
#include "controller/scheduling/queue_config.h"
#include "controller/store/store.h"
#include "controller/worker_registry.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

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
struct JobManagerOptions {
  // At most this many WatchJob streams at once (all jobs together); one
  // more is RESOURCE_EXHAUSTED. Each holds a queue of up to 10,000 events.
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
  // See above: what a dead worker's jobs wait beyond worker_timeout.
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
  // and data paths under data_roots (controller/path_policy.h); empty
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

class JobManager {
 public:
  // `store`, `clock`, `metrics` (may be null: no recovery metrics) and
  // `checkpoint_verifier` (may be null: Checkpoints(..., verify = true) is
  // FAILED_PRECONDITION) must outlive the manager.
  JobManager(Store* store, const Clock* clock, JobManagerOptions options,
             RecoveryMetrics* metrics = nullptr,
             CheckpointVerifier* checkpoint_verifier = nullptr);

  // Reloads jobs from the store. Jobs that were SCHEDULED or RUNNING when the
  // controller stopped keep their state and wait, for worker_timeout plus
  // lease_margin, for their workers to re-register with the ranks still running there
  // (RegisterWorkerRequest.running): those are re-adopted, and the job goes
  // on without a restart. Past that time a job not wholly re-adopted
  // restarts once from its newest checkpoint (see the lease comment above).
  // PENDING jobs stay.
  // `why` completes the re-adoption events' "re-adopted ... after ..."
  // (a failover names the controllers; cause controller_restart either way).
  absl::Status Recover(const std::string& why = "the controller restarted");
  // The same from `jobs`, every stored job oldest first (a standby's warm
  // copy, controller/leader/catalog_mirror.h), instead of reading them.
  absl::Status Recover(const std::string& why, std::vector<loom::v1::Job> jobs);

  // --- client API
  // Applies defaults, validates, plans (job_planning.h: parallelism.auto
  // chooses the degrees, an explicit layout is evaluated) against the live
  // workers, stores as PENDING with the plan. INVALID_ARGUMENT /
  // UNIMPLEMENTED from validation; INVALID_ARGUMENT naming the parallelism
  // field when the layout does not fit the registered workers.
  // `submitted_by` is recorded in the job (access.h: who may change it).
  // `role` ("user", "admin"; empty: not checked) must be one the job's
  // queue takes (QueueSpec::submit_roles), else PERMISSION_DENIED naming
  // scheduling.queue.
  absl::StatusOr<loom::v1::Job> Submit(loom::v1::JobSpec spec, std::string submitted_by = "",
                                       absl::string_view role = "");
  // Plans a spec (defaults applied, validated; layouts that do not execute
  // yet are allowed) on the topology given as YAML, or else on the live
  // workers. INVALID_ARGUMENT for a bad spec, topology or top_k;
  // FAILED_PRECONDITION when nothing fits.
  absl::StatusOr<loom::v1::PlanResponse> Plan(const loom::v1::PlanRequest& request);
  // Operator rollback of a RUNNING job (FAILED_PRECONDITION otherwise): stops
  // its ranks and resumes from the newest good checkpoint <= to_step, adding
  // the skip ranges, exactly as the automatic spike rollback does; the
  // ROLLBACK event has cause "operator". INVALID_ARGUMENT for to_step < 0 or
  // beyond the last reported step, or a skip range that is empty, negative,
  // or wholly before the resume point; FAILED_PRECONDITION also when no
  // checkpoint at or before to_step > 0 is on disk (to_step 0 = scratch).
  absl::StatusOr<loom::v1::Job> Rollback(const loom::v1::RollbackJobRequest& request);
  absl::StatusOr<loom::v1::Job> Get(const std::string& job_id);
  // The job's submitted_by; NOT_FOUND for an unknown job.
  absl::StatusOr<std::string> Submitter(const std::string& job_id);
  // The node a registered worker runs on; NOT_FOUND for an unknown one.
  absl::StatusOr<std::string> WorkerNode(const std::string& worker_id);
  // Where each rank of the job's attempts was placed: attempt -> rank ->
  // node, for the attempts this controller placed or re-adopted (the newest
  // kMaxPlacementsKept) and the current one. NOT_FOUND for an unknown job.
  // (Who may ship which rank's log: the service's AppendRankLogs.)
  using Placements = std::map<int64_t, std::map<int, std::string>>;
  absl::StatusOr<Placements> AttemptPlacements(const std::string& job_id);
  // When the job ended (its last transition), or nullopt while it is
  // unfinished. NOT_FOUND for an unknown job.
  absl::StatusOr<std::optional<absl::Time>> EndedAt(const std::string& job_id);
  static constexpr size_t kMaxPlacementsKept = 16;
  std::vector<loom::v1::Job> List(const std::set<loom::v1::JobState>& states, int limit);
  // One page of jobs, newest first, submitted before job sequence
  // `before_seq` (0 = from the newest); summaries unless `full` (see
  // ListJobsRequest). `*next_before_seq` is where the next page starts, 0
  // when there is none.
  std::vector<loom::v1::Job> ListPage(const std::set<loom::v1::JobState>& states, int page_size,
                                      int64_t before_seq, bool full, int64_t* next_before_seq);
  // CANCELLED; tells workers to stop its ranks. FAILED_PRECONDITION if the
  // job already ended.
  absl::StatusOr<loom::v1::Job> Cancel(const std::string& job_id, const std::string& reason);
  std::vector<loom::v1::WorkerInfo> ListWorkers();
  absl::StatusOr<std::vector<loom::v1::StepMetrics>> StepMetrics(const std::string& job_id,
                                                                 int limit);

  // The job's checkpoint catalog, each entry with its status: committed,
  // pruned, corrupt or missing (checkpoint_catalog.h). With `verify`, every
  // checkpoint still on disk is re-read and checked against its manifest
  // first (slow; not under the manager's lock), and one that fails is
  // marked corrupt. NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> Checkpoints(const std::string& job_id,
                                                                    bool verify = false);

  // Opens a watch of the job's events (see WatchJobRequest: a resume after
  // `after_seq` when given, else the history first when `include_history`,
  // else from now on). NOT_FOUND for an unknown job; RESOURCE_EXHAUSTED
  // when --max_watchers streams are open.
  absl::StatusOr<std::unique_ptr<JobWatch>> Watch(const std::string& job_id, bool include_history,
                                                  std::optional<int64_t> after_seq = std::nullopt);
  // The event log's readers (every job's events: WatchEvents, ListEvents).
  EventHub& events() { return hub_; }

  // --- worker API
  absl::StatusOr<loom::v1::RegisterWorkerResponse> RegisterWorker(
      const loom::v1::RegisterWorkerRequest& request);
  // NOT_FOUND for an unknown or dead worker (it must register again).
  absl::StatusOr<loom::v1::HeartbeatResponse> Heartbeat(
      const loom::v1::HeartbeatRequest& request);
  // A rank's events: steps, committed and failed saves, and checkpoints
  // found corrupt at load (marked in the catalog, an event).
  // INVALID_ARGUMENT, before anything is recorded, for a checkpoint event
  // with a status other than committed / failed / corrupt, or a corrupt one
  // without path, step or failed_check.
  // Rank-originated reports carry the attempt's generation (its epoch):
  // FAILED_PRECONDITION for one older than the job's current attempt (the
  // worker then stops those ranks). Step reports are idempotent: a step the
  // current attempt already reported (a retry) is not applied again.
  // NOT_FOUND for an unknown worker (it retries after registering again).
  absl::StatusOr<loom::v1::ReportStepMetricsResponse> ReportEvents(
      const loom::v1::ReportStepMetricsRequest& request);
  // ReportEvents without waiting: the report is applied before it returns,
  // and `done` gets what ReportEvents would return once its write is
  // durable, on the store's committer thread (Store::WhenDurable), or at
  // once when there is nothing to write. `done` must not call back into
  // the store's waits.
  void ReportEventsAsync(
      const loom::v1::ReportStepMetricsRequest& request,
      std::function<void(absl::StatusOr<loom::v1::ReportStepMetricsResponse>)> done);
  // A stale attempt's exit still frees its slot, then answers
  // FAILED_PRECONDITION.
  absl::Status ReportRankExit(const loom::v1::ReportRankExitRequest& request);

  // The shared cluster's queues (controller/scheduling/queue_config.h),
  // replaced whole (the controller's --queues, again on SIGHUP). Submit
  // refuses a job whose scheduling.queue or scheduling.priority the
  // configuration does not define; jobs already queued keep theirs.
  void SetQueueConfig(scheduling::QueueConfig config);
  scheduling::QueueConfig queue_config();
  // The queues as the ListQueues RPC answers: the configuration, and per
  // queue what its placed jobs hold and how many jobs wait or run in it.
  loom::v1::ListQueuesResponse ListQueues();

  // Declares timed-out workers dead (failing their jobs) and starts pending
  // jobs whose gang fits. Called periodically by the controller's loop and
  // after events that free or add capacity.
  void Tick();

  // Counts for /metrics. Kept as jobs change state: no scan of all jobs.
  std::map<loom::v1::JobState, int> JobCountsByState();
  int AliveWorkers();
  // Durable writes of job records that failed (each retried until it lands).
  int64_t StoreWriteFailures();
  // Transitions outside the state machine (jobs/job_state_machine.h): 0
  // unless the controller has a bug.
  int64_t IllegalTransitions();
  // Sums over all jobs, for /metrics (monotonic: jobs are never deleted).
  // Finished jobs' part is kept as they end; only unfinished jobs are read.
  using RecoveryTotals = loom::controller::RecoveryTotals;
  RecoveryTotals RecoveryCounts();
  // Jobs that ended since the last call (at most kMaxRecentlyEnded kept
  // between calls), for the controller's goodput series.
  std::vector<std::string> TakeRecentlyEnded();
  static constexpr size_t kMaxRecentlyEnded = 10000;

 private:
  using Worker = WorkerRegistry::Worker;
  using RankSlot = WorkerRegistry::RankSlot;
  // All private helpers require mu_ held.
  // Applies, writes (JobCatalog::Persist: a failed write is handled there)
  // and publishes a state change.
  void Transition(JobRecord& rec, loom::v1::JobState to, const std::string& reason);
  // The in-memory part of Transition (JobCatalog::RecordTransition), and a
  // job queued makes the scheduler run.
  const loom::v1::StateTransition& RecordTransitionLocked(JobRecord& rec, loom::v1::JobState to,
                                                          const std::string& reason);
  void StopJobRanks(JobRecord& rec, const std::string& reason,
                    const std::string& except_worker);
  // Strict FIFO over PENDING jobs: places the first one PlaceGang can hold
  // on the alive workers' free slots (and GPUs); the first that cannot wait
  // with the scheduler's reason, and so does every job behind it. Reads the
  // pending jobs only (JobCatalog::pending), and nothing when there are none.
  void ScheduleLocked();
  // A report applied under mu_, its durable write (if any) not yet waited
  // for, and the job's step cursor before and after it.
  struct AppliedReport {
    absl::StatusOr<loom::v1::ReportStepMetricsResponse> response;
    Store::Ticket write;
    int64_t last_step_before = -1;
    int64_t last_step_after = -1;
    int64_t events_through = 0;  // the newest event log entry the write carries
  };
  AppliedReport ApplyReport(const loom::v1::ReportStepMetricsRequest& request);
  // The answer once the write is durable or failed (`durable`); a failed
  // write lets the worker's retry apply the steps again.
  absl::StatusOr<loom::v1::ReportStepMetricsResponse> FinishReport(const std::string& job_id,
                                                                   int64_t generation,
                                                                   AppliedReport applied,
                                                                   const absl::Status& durable);
  // A ReportEvents under mu_; the durable write it queued (if any) goes to
  // `write`, which the caller waits for after releasing mu_.
  // A report of an older attempt: records the checkpoints it committed
  // while it was current, and answers FAILED_PRECONDITION (its ranks stop).
  absl::Status RefuseStaleReportLocked(JobRecord& rec,
                                       const loom::v1::ReportStepMetricsRequest& req);
  // A checkpoint event of the current attempt: a failed save becomes a
  // CHECKPOINT_FAILED event, a corrupt one is marked in the catalog (both
  // nullopt); a committed one enters the catalog and the job's summary and
  // is returned as recorded. UNAVAILABLE if the catalog cannot record it.
  absl::StatusOr<std::optional<loom::v1::CheckpointInfo>> ApplyCheckpointEventLocked(
      JobRecord& rec, const loom::v1::CheckpointInfo& reported, int64_t now_unix_ms);
  // Applies a report; its durable write is put in line in *write, carrying
  // the job's event log entries up to *events_through.
  absl::StatusOr<loom::v1::ReportStepMetricsResponse> ReportEventsLocked(
      const loom::v1::ReportStepMetricsRequest& request, Store::Ticket* write,
      int64_t* events_through);
  // Thins finished jobs' step series (finished_steps_kept) and event log
  // entries (finished_events_kept), outside mu_.
  void ThinFinishedStepSeries();
  void CheckLivenessLocked();
  // Re-adopts the ranks a registering worker reports, where they are the
  // current attempt's and were placed on its node.
  void AdoptRanksLocked(Worker& w, const loom::v1::RegisterWorkerRequest& req);
  // Moves `rank` of an attempt awaiting re-adoption to worker `w` when it
  // was placed on w's node (recording READOPTED once every rank is
  // accounted for); false when the attempt is not waiting for it.
  bool AdoptRankLocked(JobRecord& rec, Worker& w, int rank);
  // Restarts attempts whose re-adoption deadline passed.
  void CheckAdoptionsLocked();
  void ResolveFailuresLocked();
  // A failure ends the attempt: restart from the newest checkpoint while
  // restarts are left, else FAILED.
  // `cause_kind` is one of the kCause* values of recovery_metrics.h.
  void FailOrRestartLocked(JobRecord& rec, const std::string& cause,
                           const std::string& cause_kind);
  // A job whose attempt a restart would not help (`because`): FAILED with
  // `cause` and a GAVE_UP event saying both, no restart spent.
  void FailWithoutRestartLocked(JobRecord& rec, const std::string& cause,
                                const std::string& because);
  // INVALID_ARGUMENT naming the field for a checkpoint event whose status a
  // rank cannot send, or a corrupt one without path, step or failed_check.
  static absl::Status ValidateCheckpointEvents(const loom::v1::ReportStepMetricsRequest& req);
  // A rank's report that a checkpoint failed verification at load (valid):
  // marks it corrupt in the catalog and records a CHECKPOINT_CORRUPT event.
  // UNAVAILABLE if the store failed.
  absl::Status RecordCorruptCheckpointLocked(JobRecord& rec,
                                             const loom::v1::CheckpointInfo& report);
  // A confirmed loss spike: rolls back as RecoveryPolicy::DecideSpikeRollback
  // decides, or fails the job once max_rollbacks are spent.
  void HandleSpikeLocked(JobRecord& rec, const recovery::SpikeVerdict& verdict,
                         int64_t data_batch);
  // The shared tail of spike and operator rollbacks: sets the resume step,
  // adds `skips`, records `event` (kind, step, cause, message filled in by
  // the caller) with the resume point and the steps lost, and requeues.
  void RollBackLocked(JobRecord& rec, int64_t resume_step, int64_t checkpoint_step,
                      const std::vector<loom::v1::SkipRange>& skips,
                      loom::v1::RecoveryEvent event, const std::string& reason);
  // Step of the newest checkpoint of the job still on disk and not known to
  // be corrupt at or before `max_step` (-1 = any); 0 when there is none.
  int64_t NewestCheckpointLocked(const JobRecord& rec, int64_t max_step);
  // The live cluster as the planner sees it, for `spec`'s gang.
  absl::StatusOr<LiveTopology> LiveTopologyLocked(const loom::v1::JobSpec& spec);
  // FAILED_PRECONDITION naming checkpoint.dir if an unfinished job's
  // checkpoint directory is `dir`, or holds it, or lies inside it.
  absl::Status CheckCheckpointDirFreeLocked(const std::string& dir) const;
  // init_from.job (and step) -> init_from.path: that job's committed
  // checkpoint at the step (0: its newest), whose model must be this
  // spec's. INVALID_ARGUMENT naming the field otherwise.
  absl::Status ResolveInitFromLocked(loom::v1::JobSpec* spec);
  // Ends the current attempt: stops its ranks, resets per-attempt state,
  // bumps the generation, and puts the job back to PENDING.
  // `to` is PENDING, or PREEMPTED for a preempted job.
  void RequeueLocked(JobRecord& rec, const std::string& reason,
                     loom::v1::JobState to = loom::v1::PENDING);
  // Checkpoint-then-preempt (job_scheduling.cc). PreemptLocked carries out
  // one of the policy's preemptions: the victim's ranks are asked to save
  // at their next step boundary and stop (StopRank.checkpoint_first); a
  // victim not yet training is requeued at once. CheckPreemptionsLocked
  // (each tick) sends a plain stop to victims whose grace ran out.
  // FinishPreemptionLocked, once every rank of the victim has exited,
  // records PREEMPTED (the checkpoint it resumes from, the steps lost) and
  // requeues it as PREEMPTED: no restart is counted.
  void PreemptLocked(JobRecord& rec, const scheduling::Preemption& preemption);
  // StopRank{checkpoint_first} to the workers of rec's current attempt.
  void AskToSaveAndStopLocked(const JobRecord& rec, const std::string& reason);
  // A save-and-stop that is no preemption (an elastic job growing, a job
  // moving off a slow node or re-splitting its stages): records it in
  // rec.preempting (the queues' grace applies), sets the job's reason
  // ("<doing>: saving a checkpoint ...") and asks the ranks with
  // `stop_reason`. The caller marks what follows in the returned record.
  PreemptionInProgress& SaveAndStopToMoveLocked(JobRecord& rec, const std::string& cause_kind,
                                                const std::string& doing,
                                                const std::string& stop_reason);
  // Elastic jobs (job_elastic.cc): re-plans `rec` for the slots the live
  // cluster can give it now (elastic.h; the planner's best executable
  // layout for the largest gang that plans), records REPLANNED and requeues
  // it under the new layout without counting a restart. False (nothing
  // changed) when the job is not elastic or no gang of at least
  // elastic.min_ranks plans.
  // `max_ranks` > 0 caps the gang below elastic.max_ranks.
  bool ReplanLocked(JobRecord& rec, const std::string& cause, const std::string& cause_kind,
                    int max_ranks = 0);
  // Records a REPLANNED event (`cause_kind`, the layouts, the predicted
  // step; resuming from the newest checkpoint, the steps after it lost;
  // `describe(checkpoint, lost)` is its message), counts it, bumps the
  // layout generation and resumes from the newest checkpoint. Returns the
  // message (for the requeue that follows).
  std::string RecordReplanLocked(
      JobRecord& rec, const std::string& cause_kind, const std::string& from_layout,
      const std::string& to_layout, double predicted_step_seconds,
      const std::function<std::string(int64_t checkpoint, int64_t lost)>& describe);
  // After a scheduling cycle: when the only job waiting for capacity is an
  // elastic gang that does not fit (a preemption took part of its room, or
  // workers are gone) and no slots are about to come back, it is re-planned
  // for a smaller gang that fits the free slots (at least
  // elastic.min_ranks); it grows back later (GrowElasticJobsLocked).
  void ShrinkWaitingElasticJobLocked(const scheduling::ClusterSnapshot& snapshot,
                                     const scheduling::Decisions& decisions);
  // Each tick: a running elastic job below elastic.max_ranks, running for
  // at least the queues' min_run_time, while no job waits, with room on the
  // live cluster for a larger gang that plans, is asked to save at its next
  // step boundary and stop (as a preemption's victim is); once its ranks are
  // gone it is re-planned for the larger gang (FinishPreemptionLocked).
  void GrowElasticJobsLocked();
  // What each alive, heartbeating worker could give `rec` (its slots, or
  // GPUs for a GPU job, less what other jobs hold), and those workers.
  std::vector<int> ElasticFreeSlotsLocked(const JobRecord& rec,
                                          std::vector<loom::v1::WorkerInfo>* alive);
  // Whether an elastic gang of at least elastic.min_ranks plans on what
  // the live cluster could give `rec` now (ElasticFreeSlotsLocked).
  bool ElasticGangPlansLocked(const JobRecord& rec);
  // Slow ranks (job_slow_ranks.cc). A step report with per-rank compute
  // times feeds the attempt's detector; each rank it names gets a
  // SLOW_RANK event and recovery.slow_rank.action: "report" stops there;
  // "cordon" cordons the rank's node and, when the job can run without it
  // (an elastic gang that plans, or room elsewhere for its gang), asks the
  // ranks to save at their next step boundary and stop, after which
  // FinishPreemptionLocked re-plans or places it again. Nothing is lost.
  void ObserveRankComputeLocked(JobRecord& rec, const loom::v1::StepMetrics& m,
                                const RecoveryOptions& recovery);
  void HandleSlowRankLocked(JobRecord& rec, const recovery::SlowRankFinding& finding,
                            const RecoveryOptions& recovery);
  // The blocks per pipeline stage for rec's ranks placed as `node_stage`
  // says ((node, stage) per rank), each stage's cost scaled by the slowest
  // rec.node_slowdown of its nodes (SplitLayers); empty when the job has no
  // pipeline stages or none of its stages is on a slow node.
  std::vector<int> StageLayersForPlacementLocked(
      const JobRecord& rec, const std::vector<std::pair<std::string, int>>& node_stage);
  // (node, pipeline stage) of each of rec's ranks as placed now.
  static std::vector<std::pair<std::string, int>> NodeStagesOf(const JobRecord& rec);
  // "stages 3+1 blocks": `split`, or the engine's own split when empty.
  static std::string StageSplitText(const JobRecord& rec, const std::vector<int>& split);
  // Whether rec's gang, as it is, could be placed with its own slots free
  // (the cordoned nodes left out, as Offers does).
  bool GangFitsElsewhereLocked(const JobRecord& rec);
  void CheckPreemptionsLocked();
  void FinishPreemptionLocked(JobRecord& rec);
  void AddEvent(JobRecord& rec, loom::v1::RecoveryEvent event);
  void ForgetWorkerRanks(const std::string& worker_id);
  static bool IsAttemptRunning(loom::v1::JobState s);

  std::vector<std::string> recently_ended_;  // TakeRecentlyEnded
  Store* const store_;
  const Clock* const clock_;
  const JobManagerOptions options_;
  RecoveryMetrics* const metrics_;  // may be null
  CheckpointCatalog catalog_;        // over store_
  const RecoveryPolicy recovery_;    // what a failure or a spike leads to

  // Recover, reading the jobs from the store when `jobs` is empty.
  absl::Status RecoverFrom(const std::string& why, std::optional<std::vector<loom::v1::Job>> jobs);

  std::mutex mu_;
  JobCatalog jobs_;  // over store_; not thread-safe itself: guarded by mu_
  std::string recovered_because_ = "the controller restarted";  // Recover's why; mu_
  // What lets a heartbeat skip the scheduler: nothing changed since it last
  // ran (no job queued, no worker or slot or rendezvous port came) and no
  // waiting job's time (not_before) has come.
  bool schedule_needed_ = true;
  absl::Time schedule_at_ = absl::InfiniteFuture();
  WorkerRegistry workers_;  // not thread-safe itself: guarded by mu_
  scheduling::QueueConfig queues_ = scheduling::DefaultQueueConfig();
  // Over queues_; rebuilt by SetQueueConfig, not every scheduling cycle.
  scheduling::AdmissionPolicy policy_{scheduling::DefaultQueueConfig()};
  // The queues' decayed usage, observed every scheduling cycle.
  scheduling::FairShare fair_share_{absl::Hours(1)};
  // The log's readers: hears the store's commits; thread-safe itself.
  EventHub hub_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOB_MANAGER_H_
