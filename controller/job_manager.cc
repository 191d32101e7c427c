#include "controller/job_manager.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/jobspec.h"
#include "common/rank_exit.h"
#include "common/status_macros.h"
#include "controller/jobs/job_state_machine.h"

namespace loom::controller {

using loom::v1::Job;
using loom::v1::JobState;

// Collects the jobs that end, for the controller's goodput series.
class JobManager::EndedJobs : public JobTableListener {
 public:
  static constexpr size_t kMaxRecentlyEnded = 10000;
  void OnTransition(const JobRecord& rec, JobState to) override {
    if (IsTerminalJobState(to) && ids.size() < kMaxRecentlyEnded) ids.push_back(rec.job.id());
  }
  std::vector<std::string> ids;
};

JobManager::JobManager(Store* store, const Clock* clock, JobManagerOptions options,
                       RecoveryMetrics* metrics, CheckpointVerifier* checkpoint_verifier)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      catalog_(store, checkpoint_verifier),
      hub_(store,
           [this] {
             EventHub::Options o;
             o.max_cursors = options_.max_watchers;
             return o;
           }()),
      workers_(clock, WorkerRegistryOptions{options_.worker_timeout, options_.pause_threshold}),
      jobs_(store, clock, &ranks_),
      ended_(std::make_unique<EndedJobs>()),
      preemptor_(&jobs_, &ranks_, &catalog_, clock, metrics, &queues_),
      replanner_(&jobs_, &workers_, &catalog_, &preemptor_, clock, metrics, &queues_,
                 Replanner::Options{options_.failure_settle_time}),
      slow_ranks_(&jobs_, &workers_, store, &preemptor_, &replanner_, clock, metrics, &schedule_),
      failures_(
          &jobs_, &ranks_, &workers_, &catalog_, clock, metrics, &replanner_,
          FailureHandler::Options{options_.failure_settle_time, options_.max_rendezvous_retries}),
      rollbacks_(&jobs_, &catalog_, store, metrics),
      liveness_(&jobs_, &workers_, clock, &failures_, &replanner_, &schedule_,
                WorkerLiveness::Options{options_.worker_timeout, options_.lease_margin,
                                        options_.heartbeat_interval}),
      admitter_(&jobs_, &workers_, &catalog_, clock, &queues_, &preemptor_, &replanner_,
                &schedule_),
      submissions_(&jobs_, &workers_, &catalog_, clock, &queues_,
                   Submissions::Options{options_.checkpoint_root, options_.extra_checkpoint_roots,
                                        options_.data_roots}),
      reports_(&jobs_, &workers_, &catalog_, store, &hub_, clock, metrics, &rollbacks_,
               &slow_ranks_),
      drains_(&jobs_, &workers_, &preemptor_, &replanner_, &catalog_, store, &schedule_, clock) {
  preemptor_.SetMoveHandler(MoveIntent::kGrow, &replanner_);
  preemptor_.SetMoveHandler(MoveIntent::kDrain, &drains_);
  preemptor_.SetMoveHandler(MoveIntent::kAwayFromNode, &replanner_);
  preemptor_.SetMoveHandler(MoveIntent::kReplanAround, &slow_ranks_);
  jobs_.AddListener(&admitter_);
  jobs_.AddListener(ended_.get());
}

JobManager::~JobManager() = default;

absl::Status JobManager::Recover(const std::string& why,
                                 std::optional<std::vector<loom::v1::Job>> jobs) {
  WatchedLock lock(mu_, __func__);
  RETURN_IF_ERROR(jobs.has_value() ? jobs_.Load(*std::move(jobs)) : jobs_.Load());
  // Cordons still in force (slow ranks) outlive the restart.
  ASSIGN_OR_RETURN(const std::vector<Store::CordonRow> cordons,
                   store_->LoadCordons(clock_->NowUnixMillis()));
  for (const Store::CordonRow& c : cordons) {
    workers_.Cordon(c.node, WorkerRegistry::CordonEndFromUnixMillis(c.until_unix_ms), c.reason);
  }
  liveness_.AwaitReadoption(why);
  return absl::OkStatus();
}

absl::StatusOr<Job> JobManager::Submit(loom::v1::JobSpec spec, std::string submitted_by,
                                       absl::string_view role) {
  ApplyJobSpecDefaults(&spec);
  const absl::Status valid = ValidateJobSpec(spec);
  WatchedLock lock(mu_, __func__);
  ASSIGN_OR_RETURN(JobRecord * rec,
                   submissions_.Submit(std::move(spec), valid, std::move(submitted_by), role));
  const std::string id = rec->job.id();
  admitter_.Schedule();
  return jobs_.Find(id)->job;
}

absl::StatusOr<loom::v1::PlanResponse> JobManager::Plan(const loom::v1::PlanRequest& request) {
  return Submissions::Plan(request, [this](const loom::v1::JobSpec& spec) {
    WatchedLock lock(mu_, __func__);
    return submissions_.LiveTopologyFor(spec);
  });
}

absl::StatusOr<Job> JobManager::Rollback(const loom::v1::RollbackJobRequest& req) {
  RETURN_IF_ERROR(Rollbacks::ValidateRequest(req));
  WatchedLock lock(mu_, __func__);
  ASSIGN_OR_RETURN(JobRecord * rec, jobs_.Lookup(req.job_id()));
  RETURN_IF_ERROR(rollbacks_.Operator(*rec, req));
  return rec->job;
}

absl::StatusOr<loom::v1::CordonNodeResponse> JobManager::Cordon(
    const loom::v1::CordonNodeRequest& r, const std::string& by) {
  WatchedLock lock(mu_, __func__);
  return drains_.Cordon(r, by);
}

absl::StatusOr<loom::v1::CordonNodeResponse> JobManager::Uncordon(
    const loom::v1::UncordonNodeRequest& r, const std::string& by) {
  WatchedLock lock(mu_, __func__);
  return drains_.Uncordon(r, by);
}

absl::StatusOr<loom::v1::DrainNodeResponse> JobManager::Drain(const loom::v1::DrainNodeRequest& r,
                                                              const std::string& by) {
  WatchedLock lock(mu_, __func__);
  return drains_.Drain(r, by);
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  WatchedLock lock(mu_, __func__);
  ASSIGN_OR_RETURN(JobRecord * rec, jobs_.Lookup(job_id));
  if (IsTerminalJobState(rec->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended ", JobState_Name(rec->job.state()), "; nothing to cancel"));
  }
  jobs_.Stop(*rec, loom::v1::CANCELLED,
             reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason));
  return rec->job;
}

absl::StatusOr<Job> JobManager::Get(const std::string& job_id) {
  WatchedLock lock(mu_, __func__);
  ASSIGN_OR_RETURN(JobRecord * rec, jobs_.Lookup(job_id));
  return rec->job;
}

absl::StatusOr<std::string> JobManager::Submitter(const std::string& job_id) {
  WatchedLock lock(mu_, __func__);
  ASSIGN_OR_RETURN(JobRecord * rec, jobs_.Lookup(job_id));
  return rec->job.submitted_by();
}

absl::StatusOr<std::string> JobManager::WorkerNode(const std::string& worker_id) {
  WatchedLock lock(mu_, __func__);
  const WorkerRegistry::Worker* w = workers_.Find(worker_id);
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker \"", worker_id, "\" is not registered"));
  }
  return w->info.node();
}

absl::StatusOr<JobManager::Placements> JobManager::AttemptPlacements(const std::string& job_id) {
  WatchedLock lock(mu_, __func__);
  ASSIGN_OR_RETURN(JobRecord * rec, jobs_.Lookup(job_id));
  Placements out = rec->placements;
  const Job& job = rec->job;
  for (const auto& r : job.ranks()) out[job.generation()].emplace(r.rank(), r.node());
  return out;
}

absl::StatusOr<std::optional<absl::Time>> JobManager::EndedAt(const std::string& job_id) {
  WatchedLock lock(mu_, __func__);
  ASSIGN_OR_RETURN(JobRecord * rec, jobs_.Lookup(job_id));
  const Job& job = rec->job;
  if (!IsTerminalJobState(job.state())) return std::optional<absl::Time>();
  const int n = job.history_size();
  return std::optional<absl::Time>(n > 0 ? absl::FromUnixMillis(job.history(n - 1).time_unix_ms())
                                         : absl::InfinitePast());
}

std::vector<Job> JobManager::ListPage(const JobFilter& filter, int page_size, int64_t before_seq,
                                      bool full, int64_t* next_before_seq) {
  WatchedLock lock(mu_, __func__);
  return jobs_.ListPage(filter, page_size, before_seq, full, next_before_seq);
}

std::vector<Job> JobManager::List(const std::set<JobState>& states, int limit) {
  WatchedLock lock(mu_, __func__);
  return jobs_.List(states, limit);
}

std::vector<loom::v1::WorkerInfo> JobManager::ListWorkers() {
  WatchedLock lock(mu_, __func__);
  return workers_.List();
}

absl::StatusOr<std::vector<loom::v1::StepMetrics>> JobManager::StepMetrics(
    const std::string& job_id, int limit) {
  {
    WatchedLock lock(mu_, __func__);
    if (jobs_.Find(job_id) == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job with id \"", job_id, "\""));
    }
  }
  return store_->LoadStepMetrics(job_id, limit);
}

absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> JobManager::Checkpoints(
    const std::string& job_id, bool verify) {
  {
    WatchedLock lock(mu_, __func__);
    if (jobs_.Find(job_id) == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job with id \"", job_id, "\""));
    }
  }
  return verify ? catalog_.Verify(job_id) : catalog_.List(job_id);
}

absl::StatusOr<std::unique_ptr<JobWatch>> JobManager::Watch(const std::string& job_id,
                                                            bool include_history,
                                                            std::optional<int64_t> after_seq) {
  {
    WatchedLock lock(mu_, __func__);
    RETURN_IF_ERROR(jobs_.Lookup(job_id).status());
  }
  JobWatch::Options o;
  int64_t after = -1;  // from now on
  if (after_seq.has_value()) {
    if (*after_seq < 0) return absl::InvalidArgumentError("after_seq: must be >= 0");
    after = *after_seq;
    o.repeat_last_transition = false;
  } else if (include_history) {
    after = 0;
    if (auto steps = store_->LoadStepMetrics(job_id, 200); steps.ok()) {
      o.replay_steps = *std::move(steps);
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<EventHub::Cursor> cursor, hub_.Subscribe(job_id, after));
  return std::make_unique<JobWatch>(
      std::move(cursor), [this, job_id] { return Get(job_id); }, std::move(o));
}

// ------------------------------------------------------------------ workers

absl::StatusOr<loom::v1::RegisterWorkerResponse> JobManager::RegisterWorker(
    const loom::v1::RegisterWorkerRequest& req) {
  Store::WorkerRow row;
  absl::StatusOr<loom::v1::RegisterWorkerResponse> resp;
  {
    WatchedLock lock(mu_, __func__);
    resp = liveness_.Register(req, &row);
    if (resp.ok()) drains_.Registered(req.node(), resp->worker_id());
  }
  if (!resp.ok()) return resp;
  // The registry table is history only (workers re-register after a
  // restart), so it is written outside the lock; the worker is served
  // either way, and a failure is said.
  if (absl::Status put = store_->PutWorker(row); !put.ok()) {
    std::cerr << "loom-controller: could not record worker " << row.id << ": " << put << std::endl;
  }
  return resp;
}

absl::StatusOr<loom::v1::HeartbeatResponse> JobManager::Heartbeat(
    const loom::v1::HeartbeatRequest& req) {
  WatchedLock lock(mu_, __func__);
  loom::v1::HeartbeatResponse resp;
  ASSIGN_OR_RETURN(WorkerLiveness::Beat beat, liveness_.Heartbeat(req, &resp));
  // A node going away is drained before anything more is placed there.
  if (req.has_notice()) {
    drains_.Notice(beat.worker->info, req.notice());
  } else {
    drains_.NoNotice(beat.worker->info.id());
  }
  // Schedule first, so a start placed on this worker goes out right away.
  admitter_.ScheduleIfDue();
  liveness_.SendCommands(beat, &resp);
  return resp;
}

absl::StatusOr<loom::v1::ReportStepMetricsResponse> JobManager::ReportEvents(
    const loom::v1::ReportStepMetricsRequest& req) {
  // Applied under the lock with its durable write queued there, in order;
  // answered once that write is on disk, but waited for outside the lock,
  // so that many ranks' reports share one transaction (group commit).
  StepReports::Applied applied;
  {
    WatchedLock lock(mu_, __func__);
    applied = reports_.Apply(req);
  }
  if (applied.write == nullptr) return std::move(applied.response);
  const absl::Status durable = store_->Wait(applied.write);
  if (durable.ok() && applied.events_through == 0) return std::move(applied.response);
  WatchedLock lock(mu_, __func__);
  return reports_.Finish(req.job_id(), req.generation(), std::move(applied), durable);
}

void JobManager::ReportEventsAsync(
    const loom::v1::ReportStepMetricsRequest& req,
    std::function<void(absl::StatusOr<loom::v1::ReportStepMetricsResponse>)> done) {
  StepReports::Applied applied;
  {
    WatchedLock lock(mu_, __func__);
    applied = reports_.Apply(req);
  }
  if (applied.write == nullptr) {
    done(std::move(applied.response));
    return;
  }
  Store::Ticket write = applied.write;
  store_->WhenDurable(std::move(write), [this, job_id = req.job_id(), generation = req.generation(),
                                         applied = std::move(applied),
                                         done = std::move(done)](absl::Status durable) mutable {
    absl::StatusOr<loom::v1::ReportStepMetricsResponse> answer;
    if (durable.ok() && applied.events_through == 0) {
      answer = std::move(applied.response);
    } else {
      WatchedLock lock(mu_, __func__);
      answer = reports_.Finish(job_id, generation, std::move(applied), durable);
    }
    done(std::move(answer));
  });
}

absl::Status JobManager::ReportRankExit(const loom::v1::ReportRankExitRequest& req) {
  WatchedLock lock(mu_, __func__);
  WorkerRegistry::Worker* w = workers_.Find(req.worker_id());
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker \"", req.worker_id(), "\" is not registered"));
  }
  ASSIGN_OR_RETURN(JobRecord * found, jobs_.Lookup(req.job_id()));
  JobRecord& rec = *found;
  workers_.RankExited(*w, req.job_id(), req.rank());
  rec.live.erase({req.worker_id(), req.rank()});
  if (req.generation() < rec.job.generation()) {
    // Its slot is free (above), and the attempt can end nothing.
    admitter_.Schedule();
    return absl::FailedPreconditionError(
        absl::StrCat("stale attempt: rank ", req.rank(), " exited from attempt ", req.generation(),
                     " of ", req.job_id(), ", which now runs attempt ", rec.job.generation()));
  }
  if (IsAttemptRunningState(rec.job.state()) && req.generation() == rec.job.generation()) {
    // After a controller restart, a rank that ended while the controller was
    // away is reported by its worker under its new id: accounted for, like a
    // running rank re-adopted.
    liveness_.AccountExit(rec, *w, req.rank());
    // Only a rank this worker was given can end the attempt.
    const bool placed = std::any_of(
        rec.job.ranks().begin(), rec.job.ranks().end(), [&](const loom::v1::RankAssignment& a) {
          return a.rank() == req.rank() && a.worker_id() == req.worker_id();
        });
    if (!placed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", req.rank(), " of ", req.job_id(), " is not placed on worker ", req.worker_id()));
    }
    if (!preemptor_.OnRankExit(rec, req)) failures_.OnRankExit(rec, req, w->info.node());
  }
  admitter_.Schedule();
  if (jobs_.Unpersisted(rec.job.id())) {
    // Acknowledged means stored: a controller that takes over must know of
    // this exit. The worker keeps it and sends it again (handling it twice
    // changes nothing); the store write is retried meanwhile.
    return absl::UnavailableError(
        absl::StrCat("the exit of rank ", req.rank(), " of ", req.job_id(),
                     " is not stored yet (the controller's store write failed); send it again"));
  }
  return absl::OkStatus();
}

void JobManager::SetQueueConfig(scheduling::QueueConfig config) {
  WatchedLock lock(mu_, __func__);
  queues_ = std::move(config);
  admitter_.QueueConfigChanged();
}

scheduling::QueueConfig JobManager::queue_config() {
  WatchedLock lock(mu_, __func__);
  return queues_;
}

loom::v1::ListQueuesResponse JobManager::ListQueues() {
  WatchedLock lock(mu_, __func__);
  return admitter_.ListQueues();
}

// ------------------------------------------------------------ periodic checks

void JobManager::Tick() {
  {
    WatchedLock lock(mu_, __func__);
    jobs_.RetryUnpersisted();
    liveness_.CheckAdoptions();
    liveness_.CheckLeases();
    failures_.ResolveSettled();
    preemptor_.CheckGraces();
    drains_.Tick();
    replanner_.Grow();
    admitter_.Schedule();
  }
  ThinFinishedJobs();
}

void JobManager::ThinFinishedJobs() {
  std::vector<std::string> jobs;
  {
    WatchedLock lock(mu_, __func__);
    jobs = jobs_.TakeEndedToThin();
  }
  for (const std::string& id : jobs) {
    if (options_.finished_events_kept > 0) {
      absl::StatusOr<int64_t> pruned = store_->PruneEvents(id, options_.finished_events_kept);
      if (!pruned.ok()) {
        std::cerr << "loom-controller: could not prune the event log of " << id << ": "
                  << pruned.status() << std::endl;
      }
    }
    if (options_.finished_steps_kept <= 0) continue;
    absl::StatusOr<int64_t> deleted =
        store_->ThinStepMetrics(id, std::max<int64_t>(2, options_.finished_steps_kept));
    if (!deleted.ok()) {
      // Only space is at stake; the rows stay and the next controller start
      // does not retry (the job ended before it).
      std::cerr << "loom-controller: could not thin the step series of " << id << ": "
                << deleted.status() << std::endl;
    }
  }
}

ControllerGauges JobManager::Gauges() {
  WatchedLock lock(mu_, __func__);
  ControllerGauges g;
  g.jobs_by_state = jobs_.state_counts();
  g.alive_workers = workers_.alive_count();
  g.store_write_failures = jobs_.write_failures();
  g.illegal_transitions = jobs_.illegal_transitions();
  g.recovery = jobs_.Totals();
  return g;
}

std::vector<std::string> JobManager::TakeRecentlyEnded() {
  WatchedLock lock(mu_, __func__);
  std::vector<std::string> out;
  out.swap(ended_->ids);
  return out;
}

}  // namespace loom::controller
