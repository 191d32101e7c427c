// The controller's domain logic as one thread-safe API over its subsystems,
// which it composes and serializes with one lock. Each subsystem owns one
// concern and acts on jobs only through the job table (jobs/job_table.h):
//   admission/    submission, scheduling cycles, placement, queues
//   preemption/   checkpoint-then-preempt and every save-and-stop move
//   recovery/     rank failures and restarts; spike and operator rollbacks
//   elastic/      re-planning elastic jobs onto the live cluster
//   slow_ranks/   slow ranks: report, cordon, re-split the pipeline
//   drains/       operators' cordons and drains of nodes
//   workers/      registration, heartbeats, leases, re-adoption
//   progress/     step reports, checkpoint events, goodput
//   events/       the event log's readers (watchers)
// No gRPC types: controller/service/ translates requests into these calls.
// Every call takes the lock; store writes happen under it, so that the
// order on disk is the order of events (step reports wait for theirs
// outside it).
#ifndef LOOM_CONTROLLER_JOB_MANAGER_H_
#define LOOM_CONTROLLER_JOB_MANAGER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/watched_mutex.h"
#include "controller/admission/admitter.h"
#include "controller/admission/submission.h"
#include "controller/drains/drains.h"
#include "controller/events/event_hub.h"
#include "controller/events/job_watch.h"
#include "controller/job_manager_options.h"
#include "controller/progress/step_reports.h"
#include "controller/recovery/failure_handler.h"
#include "controller/recovery/rollbacks.h"
#include "controller/workers/worker_liveness.h"
#include "controller/workers/worker_rank_commands.h"

namespace loom::controller {

class JobManager {
 public:
  // All must outlive the manager; `metrics` and `checkpoint_verifier` may be
  // null (then Checkpoints(..., verify = true) is FAILED_PRECONDITION).
  JobManager(Store* store, const Clock* clock, JobManagerOptions options,
             RecoveryMetrics* metrics = nullptr, CheckpointVerifier* checkpoint_verifier = nullptr);
  ~JobManager();

  // Loads the jobs (from the store, or `jobs`: a standby's warm copy) and the
  // cordons; running attempts wait to be re-adopted (`why`: WorkerLiveness).
  absl::Status Recover(const std::string& why = "the controller restarted",
                       std::optional<std::vector<loom::v1::Job>> jobs = std::nullopt);

  // --- client API. Submit: admission/submission.h (`role` empty: unchecked).
  absl::StatusOr<loom::v1::Job> Submit(loom::v1::JobSpec spec, std::string submitted_by = "",
                                       absl::string_view role = "");
  absl::StatusOr<loom::v1::PlanResponse> Plan(const loom::v1::PlanRequest& request);
  // recovery/rollbacks.h (Rollbacks::Operator).
  absl::StatusOr<loom::v1::Job> Rollback(const loom::v1::RollbackJobRequest& request);
  // CANCELLED, its ranks stopped; FAILED_PRECONDITION if it already ended.
  absl::StatusOr<loom::v1::Job> Cancel(const std::string& job_id, const std::string& reason);
  // NOT_FOUND for an unknown job (or worker) in each of these.
  absl::StatusOr<loom::v1::Job> Get(const std::string& job_id);
  absl::StatusOr<std::string> Submitter(const std::string& job_id);
  absl::StatusOr<std::string> WorkerNode(const std::string& worker_id);
  // attempt -> rank -> node of the recent attempts (Admitter::kMaxPlacementsKept).
  using Placements = std::map<int64_t, std::map<int, std::string>>;
  absl::StatusOr<Placements> AttemptPlacements(const std::string& job_id);
  // When the job ended (its last transition); nullopt while unfinished.
  absl::StatusOr<std::optional<absl::Time>> EndedAt(const std::string& job_id);
  std::vector<loom::v1::Job> List(const std::set<loom::v1::JobState>& states, int limit);
  std::vector<loom::v1::Job> ListPage(const JobFilter& filter, int page_size, int64_t before_seq,
                                      bool full, int64_t* next_before_seq);
  std::vector<loom::v1::WorkerInfo> ListWorkers();
  // drains/drains.h; `by`: who asked ("user 'ada'").
  using NodeReply = absl::StatusOr<loom::v1::CordonNodeResponse>;
  NodeReply Cordon(const loom::v1::CordonNodeRequest& r, const std::string& by);
  NodeReply Uncordon(const loom::v1::UncordonNodeRequest& r, const std::string& by);
  absl::StatusOr<loom::v1::DrainNodeResponse> Drain(const loom::v1::DrainNodeRequest& r,
                                                    const std::string& by);
  absl::StatusOr<std::vector<loom::v1::StepMetrics>> StepMetrics(const std::string& job_id,
                                                                 int limit);
  // The job's checkpoints; `verify` re-reads each on disk first (unlocked).
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> Checkpoints(const std::string& job_id,
                                                                    bool verify = false);
  // WatchJobRequest's stream; RESOURCE_EXHAUSTED past max_watchers streams.
  absl::StatusOr<std::unique_ptr<JobWatch>> Watch(const std::string& job_id, bool include_history,
                                                  std::optional<int64_t> after_seq = std::nullopt);
  // The event log's readers (every job's events: WatchEvents, ListEvents).
  EventHub& events() { return hub_; }
  Store* store() { return store_; }  // for readers that take no lock (step series)

  // --- worker API (workers/worker_liveness.h, progress/step_reports.h)
  absl::StatusOr<loom::v1::RegisterWorkerResponse> RegisterWorker(
      const loom::v1::RegisterWorkerRequest& request);
  absl::StatusOr<loom::v1::HeartbeatResponse> Heartbeat(const loom::v1::HeartbeatRequest& request);
  absl::StatusOr<loom::v1::ReportStepMetricsResponse> ReportEvents(
      const loom::v1::ReportStepMetricsRequest& request);
  // Applied before it returns; `done` gets the answer once the write is
  // durable (Store::WhenDurable's thread: it must not wait on the store).
  void ReportEventsAsync(
      const loom::v1::ReportStepMetricsRequest& request,
      std::function<void(absl::StatusOr<loom::v1::ReportStepMetricsResponse>)> done);
  // A stale attempt's exit still frees its slot, then FAILED_PRECONDITION.
  absl::Status ReportRankExit(const loom::v1::ReportRankExitRequest& request);

  // The queues (--queues, again on SIGHUP); queued jobs keep theirs.
  void SetQueueConfig(scheduling::QueueConfig config);
  scheduling::QueueConfig queue_config();
  loom::v1::ListQueuesResponse ListQueues();
  // The periodic checks, in order (the controller's loop calls it).
  void Tick();
  ControllerGauges Gauges();  // for /metrics (jobs/job_record.h)
  // Jobs ended since the last call (at most 10,000): goodput.
  std::vector<std::string> TakeRecentlyEnded();

 private:
  class EndedJobs;          // a JobTableListener collecting TakeRecentlyEnded's jobs
  void ThinFinishedJobs();  // finished_steps_kept, finished_events_kept; outside mu_

  Store* const store_;
  const Clock* const clock_;
  const JobManagerOptions options_;
  CheckpointCatalog catalog_;
  EventHub hub_;
  WatchedMutex mu_{"loom-controller: the controller lock"};  // guards everything below
  scheduling::QueueConfig queues_ = scheduling::DefaultQueueConfig();
  ScheduleSignal schedule_;
  WorkerRegistry workers_;
  WorkerRankCommands ranks_{&workers_};
  JobTable jobs_;
  std::unique_ptr<EndedJobs> ended_;
  Preemptor preemptor_;
  Replanner replanner_;
  SlowRankHandler slow_ranks_;
  FailureHandler failures_;
  Rollbacks rollbacks_;
  WorkerLiveness liveness_;
  Admitter admitter_;
  Submissions submissions_;
  StepReports reports_;
  Drains drains_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOB_MANAGER_H_
