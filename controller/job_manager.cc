#include "controller/job_manager.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/jobspec.h"
#include "common/rank_exit.h"
#include "common/status_macros.h"
#include "controller/diagnosis.h"
#include "controller/job_progress.h"
#include "controller/path_policy.h"
#include "controller/planner/topology_yaml.h"
#include "controller/rank_reconciler.h"
#include "controller/scheduler.h"
#include "controller/scheduling/admission.h"

namespace loom::controller {

using loom::v1::Job;
using loom::v1::JobEvent;
using loom::v1::JobState;

// ----------------------------------------------------------------- JobManager

JobManager::JobManager(Store* store, const Clock* clock, JobManagerOptions options,
                       RecoveryMetrics* metrics, CheckpointVerifier* checkpoint_verifier)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      metrics_(metrics),
      catalog_(store, checkpoint_verifier),
      recovery_(RecoveryPolicyOptions{options_.max_rendezvous_retries}),
      jobs_(store, clock),
      workers_(clock, WorkerRegistryOptions{options_.worker_timeout, options_.pause_threshold}),
      hub_(store, [this] {
        EventHub::Options o;
        o.max_cursors = options_.max_watchers;
        return o;
      }()) {}

bool JobManager::IsAttemptRunning(JobState s) { return IsAttemptRunningState(s); }

absl::Status JobManager::Recover(const std::string& why) { return RecoverFrom(why, std::nullopt); }

absl::Status JobManager::Recover(const std::string& why, std::vector<loom::v1::Job> jobs) {
  return RecoverFrom(why, std::move(jobs));
}

absl::Status JobManager::RecoverFrom(const std::string& why,
                                     std::optional<std::vector<loom::v1::Job>> jobs) {
  std::lock_guard<std::mutex> lock(mu_);
  recovered_because_ = why;
  RETURN_IF_ERROR(jobs.has_value() ? jobs_.Load(*std::move(jobs)) : jobs_.Load());
  // Cordons still in force (slow ranks) outlive the restart.
  ASSIGN_OR_RETURN(const std::vector<Store::CordonRow> cordons,
                   store_->LoadCordons(clock_->NowUnixMillis()));
  for (const Store::CordonRow& c : cordons) {
    workers_.Cordon(c.node, absl::FromUnixMillis(c.until_unix_ms), c.reason);
  }
  for (const std::string& id : jobs_.unfinished()) {
    JobRecord& rec = *jobs_.Find(id);
    const JobState s = rec.job.state();
    if (s == loom::v1::SCHEDULED || s == loom::v1::RUNNING) {
      rec.attempt_last_step = rec.job.summary().last_step();
      // Its ranks keep training while their workers' leases run; the workers
      // re-register with them and they are re-adopted (AdoptRanksLocked), or
      // the deadline passes (CheckAdoptionsLocked).
      // Every worker whose lease outlived the controller has re-registered
      // well within G + M (see the lease comment in the header).
      rec.adopt_deadline = clock_->Now() + options_.worker_timeout + options_.lease_margin;
      rec.adopted.clear();
      rec.across_controller_restart = true;
    }
  }
  return absl::OkStatus();
}

int64_t JobManager::StoreWriteFailures() {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.write_failures();
}

int64_t JobManager::IllegalTransitions() {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.illegal_transitions();
}

const loom::v1::StateTransition& JobManager::RecordTransitionLocked(JobRecord& rec, JobState to,
                                                                  const std::string& reason) {
  if (IsQueuedJobState(to)) schedule_needed_ = true;
  if (IsTerminalJobState(to) && recently_ended_.size() < kMaxRecentlyEnded) {
    recently_ended_.push_back(rec.job.id());
  }
  return jobs_.RecordTransition(rec, to, reason);
}

void JobManager::Transition(JobRecord& rec, JobState to, const std::string& reason) {
  // Watchers hear of it from the event log once the write commits.
  RecordTransitionLocked(rec, to, reason);
  jobs_.Persist(rec, 1);
}

absl::StatusOr<Job> JobManager::Submit(loom::v1::JobSpec spec, std::string submitted_by,
                                       absl::string_view role) {
  ApplyJobSpecDefaults(&spec);
  absl::Status valid = ValidateJobSpec(spec);
  std::lock_guard<std::mutex> lock(mu_);
  if (!valid.ok()) {
    // A tensor/pipeline layout that would not even fit is worth saying so:
    // "not executable yet" alone would send the user the wrong way.
    if (valid.code() == absl::StatusCode::kUnimplemented &&
        (spec.parallelism().tensor() > 1 || spec.parallelism().pipeline() > 1)) {
      auto topology = LiveTopologyLocked(spec);
      if (topology.ok()) return ExplainUnexecutableLayout(spec, *topology, valid);
    }
    return valid;
  }
  // The queue it waits in, and its priority there, as this controller's
  // configuration defines them ("scheduling.queue: unknown queue ...").
  {
    ASSIGN_OR_RETURN(const scheduling::QueueSpec* queue,
                     queues_.ResolveQueue(spec.scheduling().queue()));
    RETURN_IF_ERROR(queues_.ResolvePriority(spec.scheduling().priority()).status());
    if (!role.empty() && !queue->AcceptsRole(role)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "scheduling.queue: queue \"", queue->name, "\" takes jobs from ",
          absl::StrJoin(queue->submit_roles, " and "), " roles only; ",
          submitted_by.empty() ? std::string("the caller") : absl::StrCat("'", submitted_by, "'"),
          " is a ", role));
    }
    spec.mutable_scheduling()->set_queue(queue->name);
  }
  PathRoots roots;
  roots.data = options_.data_roots;
  if (!options_.checkpoint_root.empty()) roots.checkpoint.push_back(options_.checkpoint_root);
  for (const std::string& r : options_.extra_checkpoint_roots) roots.checkpoint.push_back(r);
  if (!spec.init_from().job().empty() && !spec.init_from().path().empty()) {
    return absl::InvalidArgumentError(
        "init_from: give job (and step) or path, not both (the controller finds the job's "
        "checkpoint)");
  }
  RETURN_IF_ERROR(ConfineJobPaths(roots, &spec));
  RETURN_IF_ERROR(ResolveInitFromLocked(&spec));
  if (!spec.checkpoint().dir().empty()) {
    RETURN_IF_ERROR(CheckCheckpointDirFreeLocked(spec.checkpoint().dir()));
  }
  auto topology = LiveTopologyLocked(spec);
  if (!topology.ok()) return topology.status();
  auto plan = PlanAtSubmit(&spec, *topology);
  if (!plan.ok()) return plan.status();
  // A gang no cluster could place (a tensor group larger than a worker's
  // share) is refused now rather than left waiting.
  if (absl::Status shape = CheckGangShape(GangRequestOf(spec)); !shape.ok()) return shape;
  plan->set_time_unix_ms(clock_->NowUnixMillis());
  std::string id = jobs_.NewJobId(spec.name());
  if (spec.checkpoint().dir().empty() && !options_.checkpoint_root.empty()) {
    spec.mutable_checkpoint()->set_dir(absl::StrCat(options_.checkpoint_root, "/", id));
    // (Taken only if a job named <root>/<this id> as its own.)
    RETURN_IF_ERROR(CheckCheckpointDirFreeLocked(spec.checkpoint().dir()));
  }
  JobRecord& rec = jobs_.Add(id);
  rec.job.set_id(id);
  *rec.job.mutable_spec() = std::move(spec);
  *rec.job.mutable_plan() = std::move(*plan);
  rec.job.set_state(loom::v1::JOB_STATE_UNSPECIFIED);
  rec.job.set_created_unix_ms(clock_->NowUnixMillis());
  rec.job.set_submitted_by(std::move(submitted_by));
  rec.job.set_resume_step(-1);
  *rec.job.mutable_skip_batches() = rec.job.spec().skip_batches();
  // A submission is answered OK only once it is on disk (nobody watches it
  // yet, so nothing is published).
  RecordTransitionLocked(rec, loom::v1::PENDING, "submitted");
  RETURN_IF_ERROR(jobs_.StoreNew(rec));
  ScheduleLocked();
  return jobs_.Find(id)->job;
}

absl::Status JobManager::ResolveInitFromLocked(loom::v1::JobSpec* spec) {
  loom::v1::InitFrom* from = spec->mutable_init_from();
  if (from->job().empty()) return absl::OkStatus();
  const JobRecord* source = jobs_.Find(from->job());
  if (source == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("init_from.job: no job \"", from->job(), "\" (loomctl list shows the ids)"));
  }
  // The weights must fit this spec's model (dropout aside).
  loom::v1::GptModel mine = EffectiveDecoder(spec->model());
  loom::v1::GptModel theirs = EffectiveDecoder(source->job.spec().model());
  mine.clear_dropout();
  theirs.clear_dropout();
  if (mine.SerializeAsString() != theirs.SerializeAsString()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from.job: ", from->job(), " trains ", DescribeDecoder(theirs), ", but ",
        ModelPath(spec->model()), " is ", DescribeDecoder(mine),
        "; a checkpoint initializes only the same model"));
  }
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> catalog = catalog_.List(from->job());
  if (!catalog.ok()) return catalog.status();
  const loom::v1::CheckpointInfo* chosen = nullptr;
  std::vector<std::string> committed;
  for (const loom::v1::CheckpointInfo& c : *catalog) {
    if (c.status() != "committed") continue;
    committed.push_back(absl::StrCat(c.step()));
    if (from->step() == 0 ? (chosen == nullptr || c.step() >= chosen->step())
                          : c.step() == from->step()) {
      chosen = &c;
    }
  }
  if (chosen == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from", from->step() == 0 ? ".job: " : ".step: ", from->job(),
        from->step() == 0 ? " has no committed checkpoint"
                          : absl::StrCat(" has no committed checkpoint at step ", from->step()),
        committed.empty() ? "" : absl::StrCat(" (committed: ", absl::StrJoin(committed, ", "), ")"),
        "; loomctl checkpoints ", from->job(), " lists them"));
  }
  from->set_step(chosen->step());
  from->set_path(chosen->path());
  return absl::OkStatus();
}

absl::Status JobManager::CheckCheckpointDirFreeLocked(const std::string& dir) const {
  for (const auto& [id, rec] : jobs_.records()) {
    if (IsTerminalJobState(rec.job.state())) continue;
    const std::string& theirs = rec.job.spec().checkpoint().dir();
    if (theirs.empty() || !(PathIsUnder(dir, theirs) || PathIsUnder(theirs, dir))) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir: ", dir, " is in use by job ", id, " (",
        loom::v1::JobState_Name(rec.job.state()), ", checkpoint.dir ", theirs,
        "); two unfinished jobs would prune each other's checkpoints: choose another "
        "directory, or leave checkpoint.dir out for one of the job's own"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Job> JobManager::Get(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(JobRecord* rec, jobs_.Lookup(job_id));
  return rec->job;
}

absl::StatusOr<std::string> JobManager::Submitter(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(JobRecord* rec, jobs_.Lookup(job_id));
  return rec->job.submitted_by();
}

absl::StatusOr<std::string> JobManager::WorkerNode(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const Worker* w = workers_.Find(worker_id);
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker \"", worker_id, "\" is not registered"));
  }
  return w->info.node();
}

absl::StatusOr<JobManager::Placements> JobManager::AttemptPlacements(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(JobRecord* rec, jobs_.Lookup(job_id));
  Placements out = rec->placements;
  const Job& job = rec->job;
  for (const auto& r : job.ranks()) out[job.generation()].emplace(r.rank(), r.node());
  return out;
}

absl::StatusOr<std::optional<absl::Time>> JobManager::EndedAt(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(JobRecord* rec, jobs_.Lookup(job_id));
  const Job& job = rec->job;
  if (!IsTerminalJobState(job.state())) return std::optional<absl::Time>();
  const int n = job.history_size();
  return std::optional<absl::Time>(
      n > 0 ? absl::FromUnixMillis(job.history(n - 1).time_unix_ms()) : absl::InfinitePast());
}

absl::StatusOr<LiveTopology> JobManager::LiveTopologyLocked(const loom::v1::JobSpec& spec) {
  return TopologyForSpec(spec, workers_.Infos());
}

absl::StatusOr<loom::v1::PlanResponse> JobManager::Plan(const loom::v1::PlanRequest& request) {
  constexpr int kMaxTopK = 50;
  if (request.top_k() < 0 || request.top_k() > kMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k: must be in [0, ", kMaxTopK, "], got ", request.top_k()));
  }
  int top_k = request.top_k() > 0 ? request.top_k() : 5;
  loom::v1::JobSpec spec = request.spec();
  ApplyJobSpecDefaults(&spec);
  // What a plan needs, not what a run needs: no schedule, up to the planner's
  // device count, and layouts Loom does not execute yet.
  RETURN_IF_ERROR(ValidatePlanSpec(spec));
  LiveTopology topology;
  if (!request.topology_yaml().empty()) {
    auto parsed = planner::ParseTopologyYaml(request.topology_yaml());
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          absl::StrCat("topology_yaml: ", parsed.status().message()));
    }
    topology.topology = *parsed;
    topology.measured = true;
    topology.description = absl::StrCat(
        parsed->name.empty() ? "the given topology" : parsed->name, " (", parsed->nodes, " x ",
        parsed->devices_per_node, " ", parsed->device.name, ")");
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    auto live = LiveTopologyLocked(spec);
    if (!live.ok()) return live.status();
    topology = std::move(*live);
  }
  // Planning is pure computation (well under a second): outside the lock.
  return PlanSpec(spec, topology, top_k, request.executable_only());
}

absl::StatusOr<Job> JobManager::Rollback(const loom::v1::RollbackJobRequest& req) {
  if (req.to_step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("to_step: must be >= 0 (0 = from scratch), got ", req.to_step()));
  }
  if (req.to_step() > 1000000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("to_step: must be <= 1000000000 (the most steps a job has), got ",
                     req.to_step()));
  }
  if (absl::Status bad = ValidateSkipBatches(req.skip(), "skip"); !bad.ok()) return bad;
  std::lock_guard<std::mutex> lock(mu_);
  JobRecord* it = jobs_.Find(req.job_id());
  if (it == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job with id \"", req.job_id(), "\""));
  }
  JobRecord& rec = *it;
  if (rec.job.state() != loom::v1::RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", req.job_id(), " is ", JobState_Name(rec.job.state()),
        "; only a RUNNING job can be rolled back",
        IsTerminalJobState(rec.job.state()) ? "" : " (wait until it runs)"));
  }
  if (rec.attempt_last_step < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", req.job_id(), " has not reported a step in this attempt yet; nothing to roll "
        "back"));
  }
  if (req.to_step() > rec.attempt_last_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("to_step: ", req.to_step(), " is beyond the job's last step ",
                     rec.attempt_last_step, "; roll back to a step it has reached"));
  }
  int64_t checkpoint = NewestCheckpointLocked(rec, req.to_step());
  if (checkpoint == 0 && req.to_step() > 0) {
    // Silently starting over would throw away far more than asked for.
    int64_t oldest = -1;
    auto catalog = store_->LoadCheckpoints(rec.job.id());
    if (catalog.ok()) {
      for (const auto& c : *catalog) {
        if (access(c.path().c_str(), F_OK) == 0 && (oldest < 0 || c.step() < oldest)) {
          oldest = c.step();
        }
      }
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "to_step: no checkpoint of job ", req.job_id(), " at or before step ", req.to_step(),
        " is on disk",
        oldest > 0 ? absl::StrCat(" (the oldest kept is step ", oldest, ")") : "",
        "; pass --to-step 0 to start over from scratch",
        oldest > 0 ? absl::StrCat(", or a step >= ", oldest) : ""));
  }
  // Batches trained up to the checkpoint stay trained (RecoveryPolicy::
  // FirstUndoneBatch): a range is clipped to start at the first batch the
  // rollback undoes.
  auto clipped = RecoveryPolicy::ClipSkipRanges(req.skip(), checkpoint, rec.step_batches);
  if (!clipped.ok()) return clipped.status();
  const std::vector<loom::v1::SkipRange>& skips = *clipped;
  std::vector<std::string> described;
  for (const loom::v1::SkipRange& r : skips) {
    described.push_back(absl::StrCat("[", r.begin(), ", ", r.end(), ")"));
  }
  loom::v1::RecoveryEvent rb;
  rb.set_kind(loom::v1::RecoveryEvent::ROLLBACK);
  rb.set_cause(kCauseOperator);
  rb.set_step(rec.attempt_last_step);
  rec.job.set_operator_rollbacks(rec.job.operator_rollbacks() + 1);
  rb.set_message(absl::StrCat(
      "operator rollback", req.reason().empty() ? "" : absl::StrCat(" (", req.reason(), ")"),
      ": resume from the newest checkpoint at step <= ", req.to_step(), " (step ", checkpoint,
      checkpoint == 0 ? ", i.e. from scratch" : "", ")",
      skips.empty() ? ", no data skipped"
                    : absl::StrCat(", skip data batches ", absl::StrJoin(described, " "))));
  std::string reason = rb.message();
  RollBackLocked(rec, req.to_step(), checkpoint, skips, std::move(rb), reason);
  return rec.job;
}

std::vector<Job> JobManager::ListPage(const std::set<JobState>& states, int page_size,
                                     int64_t before_seq, bool full, int64_t* next_before_seq) {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.ListPage(states, page_size, before_seq, full, next_before_seq);
}

std::vector<Job> JobManager::List(const std::set<JobState>& states, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.List(states, limit);
}

void JobManager::StopJobRanks(JobRecord& rec, const std::string& reason,
                              const std::string& except_worker) {
  std::set<std::string> workers;
  for (const auto& r : rec.job.ranks()) workers.insert(r.worker_id());
  for (const std::string& wid : workers) {
    if (wid == except_worker) continue;
    Worker* found = workers_.FindAlive(wid);
    if (found == nullptr) continue;
    Worker& w = *found;
    // A start that was never delivered is simply withdrawn.
    auto& cmds = w.pending_commands;
    cmds.erase(std::remove_if(cmds.begin(), cmds.end(),
                              [&](const loom::v1::WorkerCommand& c) {
                                return c.has_start() && c.start().job_id() == rec.job.id();
                              }),
               cmds.end());
    loom::v1::WorkerCommand cmd;
    cmd.mutable_stop()->set_job_id(rec.job.id());
    cmd.mutable_stop()->set_reason(reason);
    cmds.push_back(std::move(cmd));
  }
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(JobRecord* found, jobs_.Lookup(job_id));
  JobRecord& rec = *found;
  if (IsTerminalJobState(rec.job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended ", JobState_Name(rec.job.state()), "; nothing to cancel"));
  }
  std::string why = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  StopJobRanks(rec, why, "");
  Transition(rec, loom::v1::CANCELLED, why);
  return rec.job;
}

std::vector<loom::v1::WorkerInfo> JobManager::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.List();
}

absl::StatusOr<std::vector<loom::v1::StepMetrics>> JobManager::StepMetrics(
    const std::string& job_id, int limit) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.Find(job_id) == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job with id \"", job_id, "\""));
    }
  }
  return store_->LoadStepMetrics(job_id, limit);
}

absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> JobManager::Checkpoints(
    const std::string& job_id, bool verify) {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
  RETURN_IF_ERROR(WorkerRegistry::ValidateRegistration(req));
  Store::WorkerRow row;
  loom::v1::RegisterWorkerResponse resp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A node registering again means its previous daemon is gone: whatever
    // ran there is lost.
    if (auto old = workers_.RemoveNode(req.node())) {
      std::set<std::string> job_ids;
      for (const auto& r : old->ranks) job_ids.insert(r.job_id);  // none if it was dead
      for (const auto& jid : job_ids) {
        // (A rank of a job this controller does not know, as a worker may
        // report at registration, has no record to update: none is made.)
        JobRecord* found = jobs_.Find(jid);
        if (found == nullptr) continue;
        JobRecord& rec = *found;
        if (!IsAttemptRunning(rec.job.state())) continue;
        std::string why = absl::StrCat("worker ", old->info.id(), " on node ", req.node(),
                                       " restarted; the ranks it ran are lost");
        ForgetWorkerRanks(old->info.id());
        FailOrRestartLocked(rec, why, kCauseWorkerLost);
      }
      ForgetWorkerRanks(old->info.id());
    }
    Worker& w = workers_.Add(req);
    const std::string& id = w.info.id();
    row = {id, req.node(), req.address(), req.zone(), req.rack(),
           absl::ToUnixMillis(w.last_heartbeat)};
    AdoptRanksLocked(w, req);
    schedule_needed_ = true;  // capacity came
    resp.set_worker_id(id);
    resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
    resp.set_lease_grace_ms(absl::ToInt64Milliseconds(options_.worker_timeout));
  }
  // The registry table is history only (workers re-register after a
  // restart), so it is written outside the lock; the worker is served
  // either way, and a failure is said.
  absl::Status put = store_->PutWorker(row);
  if (!put.ok()) {
    std::cerr << "loom-controller: could not record worker " << row.id << ": " << put
              << std::endl;
  }
  return resp;
}

void JobManager::AdoptRanksLocked(Worker& w, const loom::v1::RegisterWorkerRequest& req) {
  for (const loom::v1::RunningRank& r : req.running()) {
    JobRecord* jit = jobs_.Find(r.job_id());
    // Anything else is stopped by the next heartbeat (Heartbeat()).
    if (jit == nullptr || r.generation() != jit->job.generation()) continue;
    if (AdoptRankLocked(*jit, w, r.rank())) {
      jit->live.insert({w.info.id(), r.rank()});
      jit->running_seen.insert(r.rank());
      const int gpu =
          jit->job.spec().resources().gpus_per_rank() > 0
              ? [&] {
                  for (const auto& a : jit->job.ranks()) {
                    if (a.rank() == r.rank()) return a.gpu();
                  }
                  return -1;
                }()
              : -1;
      workers_.HoldSlot(w, {r.job_id(), r.rank(), gpu});
    }
  }
}

bool JobManager::AdoptRankLocked(JobRecord& rec, Worker& w, int rank) {
  if (!IsAttemptRunning(rec.job.state()) || rec.adopt_deadline == absl::InfinitePast() ||
      rec.adopted.count(rank)) {
    return false;
  }
  loom::v1::RankAssignment* placed = nullptr;
  for (auto& a : *rec.job.mutable_ranks()) {
    if (a.rank() == rank) placed = &a;
  }
  if (placed == nullptr || placed->node() != w.info.node()) return false;
  placed->set_worker_id(w.info.id());
  rec.adopted.insert(rank);
  if (static_cast<int>(rec.adopted.size()) < rec.job.ranks_size()) return true;
  rec.adopt_deadline = absl::InfinitePast();
  // A rank failed meanwhile: the failure decides (ResolveFailuresLocked).
  if (rec.pending_failure) return true;
  rec.across_controller_restart = false;  // later failures are the attempt's own
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::READOPTED);
  ev.set_cause(kCauseControllerRestart);
  ev.set_generation(rec.job.generation());
  ev.set_step(rec.attempt_last_step);
  ev.set_message(absl::StrCat("re-adopted all ", rec.job.ranks_size(), " rank(s) of attempt ",
                              rec.job.generation(), " after ", recovered_because_,
                              "; no restart, nothing lost"));
  AddEvent(rec, ev);
  jobs_.Persist(rec, 0);
  return true;
}

void JobManager::CheckAdoptionsLocked() {
  const absl::Time now = clock_->Now();
  // (A copy: a restart below may move the job between the sets.)
  const std::vector<std::string> unfinished(jobs_.unfinished().begin(),
                                            jobs_.unfinished().end());
  for (const std::string& jid : unfinished) {
    JobRecord& rec = *jobs_.Find(jid);
    if (rec.adopt_deadline == absl::InfinitePast() || now < rec.adopt_deadline) continue;
    rec.adopt_deadline = absl::InfinitePast();
    if (!IsAttemptRunning(rec.job.state())) continue;
    // Every worker whose lease outlived the restart has re-registered by
    // now, and the others have killed their ranks; those re-adopted are
    // stopped with the attempt. The next attempt waits out the margin.
    rec.not_before = now + options_.lease_margin;
    const std::string why = absl::StrFormat(
        "the controller restarted and only %d of %d rank(s) were re-adopted within %.1fs",
        static_cast<int>(rec.adopted.size()), rec.job.ranks_size(),
        absl::ToDoubleSeconds(options_.worker_timeout + options_.lease_margin));
    rec.adopted.clear();
    FailOrRestartLocked(rec, why, kCauseControllerRestart);
  }
}

absl::StatusOr<loom::v1::HeartbeatResponse> JobManager::Heartbeat(
    const loom::v1::HeartbeatRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  auto beat = workers_.RecordHeartbeat(req.worker_id(), req.rendezvous_port());
  if (!beat.ok()) return beat.status();
  Worker& w = *beat->worker;
  // A worker whose fresh rendezvous port was used gives the next one here:
  // that may let a job waiting for it be placed.
  const bool port_came = beat->rendezvous_port_came;
  loom::v1::HeartbeatResponse resp;
  // What the worker runs against the records (rank_reconciler.h).
  RankReconciliation seen = ReconcileRunningRanks(req, w, jobs_);
  for (loom::v1::StopRank& stop : seen.stops)
    *resp.add_commands()->mutable_stop() = std::move(stop);
  for (const auto& [job_id, rank] : seen.confirmed) {
    JobRecord& rec = *jobs_.Find(job_id);
    rec.running_seen.insert(rank);
    if (rec.job.state() == loom::v1::SCHEDULED) {
      Transition(rec, loom::v1::RUNNING,
                 absl::StrCat("rank ", rank, " started on ", w.info.node()));
    }
  }
  const std::set<std::pair<std::string, int>>& running = seen.running;
  // Slots held by ranks of ended jobs that are no longer running here are free.
  const bool freed = workers_.ReleaseSlotsIf(w, [&](const RankSlot& s) {
    JobRecord* jit = jobs_.Find(s.job_id);
    bool ended = jit == nullptr || !IsAttemptRunning(jit->job.state());
    bool gone = ended && !running.count({s.job_id, s.rank});
    if (gone && jit != nullptr) jit->live.erase({w.info.id(), s.rank});
    return gone;
  });
  // Schedule first, so a start placed on this worker goes out right away.
  if (freed || port_came) schedule_needed_ = true;
  if (schedule_needed_ || clock_->Now() >= schedule_at_) ScheduleLocked();
  // Confirmed starts; starts of attempts that ended are forgotten; the
  // rest are sent again after three heartbeat periods without a sign.
  const absl::Time now = clock_->Now();
  for (loom::v1::StartRank& start :
       DueStarts(seen.running_attempts, jobs_, now, 3 * options_.heartbeat_interval, &w)) {
    *resp.add_commands()->mutable_start() = std::move(start);
  }
  for (auto& c : w.pending_commands) {
    if (c.has_start()) w.unacked[{c.start().job_id(), c.start().rank()}] = {c.start(), now};
    *resp.add_commands() = std::move(c);
  }
  w.pending_commands.clear();
  return resp;
}

absl::StatusOr<loom::v1::ReportStepMetricsResponse> JobManager::ReportEvents(
    const loom::v1::ReportStepMetricsRequest& req) {
  // The report is applied under the lock and its durable write queued
  // there, in order; it is answered only once that write is on disk, but
  // the wait is outside the lock, so that the reports of many ranks share
  // one transaction (Store's group commit) instead of one fsync each.
  AppliedReport applied = ApplyReport(req);
  if (applied.write == nullptr) return std::move(applied.response);
  absl::Status durable = store_->Wait(applied.write);
  return FinishReport(req.job_id(), req.generation(), std::move(applied), durable);
}

void JobManager::ReportEventsAsync(
    const loom::v1::ReportStepMetricsRequest& req,
    std::function<void(absl::StatusOr<loom::v1::ReportStepMetricsResponse>)> done) {
  AppliedReport applied = ApplyReport(req);
  if (applied.write == nullptr) {
    done(std::move(applied.response));
    return;
  }
  Store::Ticket write = applied.write;
  store_->WhenDurable(
      std::move(write), [this, job_id = req.job_id(), generation = req.generation(),
                         applied = std::move(applied),
                         done = std::move(done)](absl::Status durable) mutable {
        done(FinishReport(job_id, generation, std::move(applied), durable));
      });
}

JobManager::AppliedReport JobManager::ApplyReport(const loom::v1::ReportStepMetricsRequest& req) {
  AppliedReport applied;
  std::lock_guard<std::mutex> lock(mu_);
  JobRecord* it = jobs_.Find(req.job_id());
  if (it != nullptr) applied.last_step_before = it->attempt_last_step;
  applied.response = ReportEventsLocked(req, &applied.write, &applied.events_through);
  if (it != nullptr) applied.last_step_after = it->attempt_last_step;
  return applied;
}

absl::StatusOr<loom::v1::ReportStepMetricsResponse> JobManager::FinishReport(
    const std::string& job_id, int64_t generation, AppliedReport applied,
    const absl::Status& durable) {
  if (durable.ok()) {
    if (applied.events_through > 0) {
      // Its event log entries are stored: no later write need carry them.
      std::lock_guard<std::mutex> lock(mu_);
      if (JobRecord* rec = jobs_.Find(job_id)) JobCatalog::EventsStored(*rec, applied.events_through);
    }
    return std::move(applied.response);
  }
  {
    // The report's steps are not on disk. The worker retries an
    // UNAVAILABLE report: unless a later report moved on, let that retry
    // apply its steps again (instead of skipping them as already seen), and
    // have the job row written again.
    std::lock_guard<std::mutex> lock(mu_);
    JobRecord* it = jobs_.Find(job_id);
    if (it != nullptr) {
      JobRecord& rec = *it;
      if (rec.job.generation() == generation && rec.attempt_last_step == applied.last_step_after) {
        rec.attempt_last_step = applied.last_step_before;
      }
      jobs_.MarkUnpersisted(rec.job.id());
    }
  }
  return absl::UnavailableError(absl::StrCat("could not record metrics: ", durable.message()));
}

absl::StatusOr<loom::v1::ReportStepMetricsResponse> JobManager::ReportEventsLocked(
    const loom::v1::ReportStepMetricsRequest& req, Store::Ticket* write, int64_t* events_through) {
  if (workers_.Find(req.worker_id()) == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker \"", req.worker_id(), "\" is not registered"));
  }
  JobRecord* it = jobs_.Find(req.job_id());
  if (it == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job with id \"", req.job_id(), "\""));
  }
  JobRecord& rec = *it;
  if (absl::Status valid = ValidateCheckpointEvents(req); !valid.ok()) return valid;
  loom::v1::ReportStepMetricsResponse resp;
  if (req.generation() < rec.job.generation()) return RefuseStaleReportLocked(rec, req);
  if (req.generation() != rec.job.generation()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation: ", req.generation(), " is newer than job ", req.job_id(),
        "'s current attempt ", rec.job.generation()));
  }
  if (rec.job.state() != loom::v1::SCHEDULED && rec.job.state() != loom::v1::RUNNING) {
    // Ended, or between attempts: these are the last words of stopped ranks.
    resp.set_stop(true);
    return resp;
  }
  // Only a worker the current attempt placed ranks on reports for it (by
  // node: a worker that re-registered after a controller restart reports
  // under its new id before its ranks are re-adopted).
  const std::string& node = workers_.Find(req.worker_id())->info.node();
  if (std::none_of(rec.job.ranks().begin(), rec.job.ranks().end(),
                   [&](const loom::v1::RankAssignment& a) { return a.node() == node; })) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", req.worker_id(), " (node '", node, "') holds no rank of attempt ",
        rec.job.generation(), " of job ", req.job_id(), " and may not report for it"));
  }
  RecoveryOptions recovery = RecoveryPolicy::EffectiveRecovery(rec.job.spec().recovery());
  if (!rec.detector && recovery.detect_spikes) {
    rec.detector = std::make_unique<recovery::SpikeDetector>(recovery.detector);
  }
  // (A rank's reports from before its first step, such as corrupt
  // checkpoints found while choosing where to resume, do not make it RUNNING.)
  const bool has_step = std::any_of(req.events().begin(), req.events().end(),
                                    [](const loom::v1::RankEvent& e) { return e.has_step(); });
  if (rec.job.state() == loom::v1::SCHEDULED && has_step) {
    Transition(rec, loom::v1::RUNNING, "first step reported");
  }
  std::vector<loom::v1::StepMetrics> steps;
  for (const auto& ev : req.events()) {
    JobEvent out;
    out.set_time_unix_ms(clock_->NowUnixMillis());
    // A retried report (its answer was lost, or the controller restarted
    // after applying it): the attempt's steps only go forward.
    if (ev.has_step() && ev.step().step() > 0 && ev.step().step() <= rec.attempt_last_step) {
      continue;
    }
    if (ev.has_step()) {
      loom::v1::StepMetrics m = ev.step();
      if (m.time_unix_ms() == 0) m.set_time_unix_ms(out.time_unix_ms());
      m.set_generation(rec.job.generation());
      m.set_layout_generation(rec.job.layout_generation());
      ApplyStepReport(m, out.time_unix_ms(), &rec);
      ObserveRankComputeLocked(rec, m, recovery);
      // Per-rank times are for the detector and live watchers; the stored
      // series stays one row per step whatever the world size.
      steps.push_back(m);
      steps.back().clear_rank_compute_seconds();
      if (rec.detector && m.step() > 0) {
        recovery::SpikeVerdict verdict = rec.detector->Observe(m.step(), m.loss(), m.grad_norm());
        if (verdict.spike) {
          *out.mutable_step() = m;
          hub_.PublishLive(rec.job.id(), out);
          // The steps up to the spike, then the rollback's own writes.
          *write = store_->Enqueue(nullptr, 0, steps, rec.job.id());
          HandleSpikeLocked(rec, verdict, m.data_batch());
          resp.set_stop(true);
          return resp;
        }
      }
      *out.mutable_step() = std::move(m);
    } else if (ev.has_checkpoint()) {
      ASSIGN_OR_RETURN(std::optional<loom::v1::CheckpointInfo> committed,
                       ApplyCheckpointEventLocked(rec, ev.checkpoint(), out.time_unix_ms()));
      if (!committed.has_value()) continue;
      *out.mutable_checkpoint() = *std::move(committed);
      jobs_.RecordEvent(rec, out);
      continue;  // watchers hear of it from the log
    } else {
      continue;
    }
    hub_.PublishLive(rec.job.id(), out);  // steps are live only
  }
  rec.job.set_updated_unix_ms(clock_->NowUnixMillis());
  // (The job's unstored transitions were stored by the Transition above, or
  // are kept for the retry of a write that failed.)
  *write = store_->Enqueue(&rec.job, 0, steps, rec.job.id(), rec.unstored_events);
  *events_through = JobCatalog::NewestUnstoredEvent(rec);
  return resp;
}

absl::Status JobManager::RefuseStaleReportLocked(JobRecord& rec,
                                                 const loom::v1::ReportStepMetricsRequest& req) {
  // A fenced attempt's report: refused, and its ranks are stopped. Its
  // checkpoints were committed while it was current (a new attempt starts
  // only once the old one's ranks are gone or fenced) and are on disk,
  // where the next attempt resumes from, so the catalog records them.
  for (const auto& ev : req.events()) {
    if (!ev.has_checkpoint() || ev.checkpoint().status() == "failed") continue;
    if (ev.checkpoint().status() == kCheckpointCorrupt) continue;  // its load was stale too
    loom::v1::CheckpointInfo info = ev.checkpoint();
    info.set_generation(req.generation());
    info.set_time_unix_ms(clock_->NowUnixMillis());
    absl::Status cs = catalog_.RecordCommitted(rec.job.id(), info);
    if (!cs.ok()) {
      return absl::UnavailableError(absl::StrCat("could not record checkpoint: ", cs.message()));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "stale attempt: the report is from attempt ", req.generation(), " of ", req.job_id(),
      ", which now runs attempt ", rec.job.generation(), "; its ranks must stop"));
}

absl::StatusOr<std::optional<loom::v1::CheckpointInfo>> JobManager::ApplyCheckpointEventLocked(
    JobRecord& rec, const loom::v1::CheckpointInfo& reported, int64_t now_unix_ms) {
  if (reported.status() == "failed") {
    // A save that failed never enters the catalog; the rank stops with the
    // error next, and the failure handling restarts from the newest good
    // checkpoint. The event tells watchers why.
    loom::v1::RecoveryEvent failed;
    failed.set_time_unix_ms(now_unix_ms);
    failed.set_kind(loom::v1::RecoveryEvent::CHECKPOINT_FAILED);
    failed.set_step(reported.step());
    failed.set_cause(kCauseCheckpointFailed);
    failed.set_message(
        absl::StrCat("checkpoint at step ", reported.step(), " failed: ", reported.error()));
    failed.set_generation(rec.job.generation());
    AddEvent(rec, failed);
    if (metrics_ != nullptr) metrics_->RecordCheckpointFailure(rec.job.id());
    return std::nullopt;
  }
  if (reported.status() == kCheckpointCorrupt) {
    RETURN_IF_ERROR(RecordCorruptCheckpointLocked(rec, reported));
    return std::nullopt;
  }
  loom::v1::CheckpointInfo info = reported;
  info.set_generation(rec.job.generation());
  info.set_time_unix_ms(now_unix_ms);
  absl::Status cs = catalog_.RecordCommitted(rec.job.id(), info);
  info.set_status(kCheckpointCommitted);
  if (!cs.ok()) {
    return absl::UnavailableError(absl::StrCat("could not record checkpoint: ", cs.message()));
  }
  loom::v1::JobSummary* sum = rec.job.mutable_summary();
  sum->set_checkpoints_written(sum->checkpoints_written() + 1);
  sum->set_last_checkpoint(info.path());
  rec.newest_checkpoint_step = info.step();
  if (metrics_ != nullptr) metrics_->RecordCheckpoint(rec.job.id(), info);
  return info;
}

absl::Status JobManager::ReportRankExit(const loom::v1::ReportRankExitRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker* found = workers_.Find(req.worker_id());
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker \"", req.worker_id(), "\" is not registered"));
  }
  ASSIGN_OR_RETURN(JobRecord* job_record, jobs_.Lookup(req.job_id()));
  Worker& w = *found;
  workers_.RankExited(w, req.job_id(), req.rank());
  JobRecord& rec = *job_record;
  rec.live.erase({req.worker_id(), req.rank()});
  if (req.generation() < rec.job.generation()) {
    // Its slot is free (above), and the attempt can end nothing.
    ScheduleLocked();
    return absl::FailedPreconditionError(absl::StrCat(
        "stale attempt: rank ", req.rank(), " exited from attempt ", req.generation(), " of ",
        req.job_id(), ", which now runs attempt ", rec.job.generation()));
  }
  bool current = IsAttemptRunning(rec.job.state()) && req.generation() == rec.job.generation();
  // After a controller restart, a rank that ended while the controller was
  // away is reported by its worker under its new id: accounted for, like a
  // running rank re-adopted.
  if (current) AdoptRankLocked(rec, w, req.rank());
  if (current) {
    // Only a rank this worker was given can end the attempt.
    bool placed = false;
    for (const auto& a : rec.job.ranks()) {
      placed |= a.rank() == req.rank() && a.worker_id() == req.worker_id();
    }
    if (!placed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", req.rank(), " of ", req.job_id(), " is not placed on worker ", req.worker_id()));
    }
  }
  if (current && (rec.preempting || req.exit_code() == kRankExitSavedAndStopped) &&
      !rec.pending_failure) {
    // Checkpoint-then-preempt: every exit of a preempted attempt is part of
    // the preemption (a rank may end it by finishing training, by saving and
    // stopping, or by the plain stop after the grace). Ranks that saved and
    // stopped while no preemption was known (across a controller restart)
    // are taken as one too. Once every rank is gone the job goes back to
    // its queue, unless all of them finished training.
    if (!rec.preempting) {
      PreemptionInProgress p;
      p.since = clock_->Now();
      p.deadline = absl::InfiniteFuture();
      p.message = "its ranks saved and stopped while the controller was away";
      p.step_at_ask = rec.attempt_last_step;
      rec.preempting = std::move(p);
    }
    if (req.exit_code() == 0 && req.signal() == 0) rec.exited_ok.insert(req.rank());
    if (static_cast<int>(rec.exited_ok.size()) == rec.job.ranks_size()) {
      rec.preempting.reset();
      Transition(rec, loom::v1::SUCCEEDED,
                 absl::StrCat("all ", rec.job.ranks_size(),
                              " ranks finished training before the preemption took effect"));
    } else if (rec.live.empty()) {
      FinishPreemptionLocked(rec);
    }
    ScheduleLocked();
    return absl::OkStatus();
  }
  if (current) {
    if (req.exit_code() == 0 && req.signal() == 0) {
      rec.exited_ok.insert(req.rank());
      if (static_cast<int>(rec.exited_ok.size()) == rec.job.ranks_size()) {
        Transition(rec, loom::v1::SUCCEEDED,
                   absl::StrCat("all ", rec.job.ranks_size(), " ranks finished training"));
      }
    } else {
      std::string how = req.signal() != 0
                            ? absl::StrCat("was killed by signal ", req.signal())
                            : absl::StrCat("exited with code ", req.exit_code());
      std::string why = absl::StrCat("rank ", req.rank(), " on ", w.info.node(), " ", how,
                                     req.reason().empty() ? "" : ": ", req.reason());
      if (!rec.pending_failure) {
        // The other ranks cannot go on without this one: stop them now, and
        // decide the job's reason once the failure has settled.
        // A rank that could not join its groups before any step: nothing
        // was computed (see JobManagerOptions::max_rendezvous_retries).
        const bool rendezvous = RecoveryPolicy::IsRendezvousFailure(
            req.exit_code(), req.signal(), rec.attempt_last_step);
        rec.pending_failure = PendingFailure{clock_->Now(), why, rendezvous, "", ""};
        StopJobRanks(rec, why, "");
      }
      // Rank 0's reason says which checkpoints failed which check, or which
      // save found the volume full; the other ranks' (often first) only that
      // rank 0 failed.
      if (std::string because = RecoveryPolicy::NoRestartBecause(req.exit_code(), req.signal());
          !because.empty()) {
        rec.pending_failure->no_restart_because = std::move(because);
        rec.pending_failure->reason = why;
      }
      if (req.lease_expired() && rec.pending_failure->cause_kind.empty()) {
        // Its worker lost the controller (a peer that failed first lost
        // this rank): during a re-adoption after a controller restart that
        // is the restart's doing.
        rec.pending_failure->cause_kind =
            RecoveryPolicy::LeaseExpiredCauseKind(rec.across_controller_restart);
        if (!absl::StrContains(rec.pending_failure->reason, "lease")) {
          absl::StrAppend(&rec.pending_failure->reason, "; rank ", req.rank(), " on ",
                          w.info.node(), " was killed when its worker's lease ran out");
        }
      }
    }
  }
  ScheduleLocked();
  return absl::OkStatus();
}

// --------------------------------------------------------------- scheduling

void JobManager::Tick() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.RetryUnpersisted();
    CheckAdoptionsLocked();
    CheckLivenessLocked();
    ResolveFailuresLocked();
    CheckPreemptionsLocked();
    GrowElasticJobsLocked();
    ScheduleLocked();
  }
  ThinFinishedStepSeries();
}

void JobManager::ThinFinishedStepSeries() {
  std::vector<std::string> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
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

void JobManager::ResolveFailuresLocked() {
  absl::Time now = clock_->Now();
  const std::vector<std::string> unfinished(jobs_.unfinished().begin(),
                                            jobs_.unfinished().end());
  for (const std::string& jid : unfinished) {
    JobRecord& rec = *jobs_.Find(jid);
    if (!rec.pending_failure || IsTerminalJobState(rec.job.state())) continue;
    if (now - rec.pending_failure->at < options_.failure_settle_time) continue;
    // Re-adopting after a controller restart: the other workers' backlogs
    // (the checkpoints their ranks committed while the controller was
    // away, their exits) are still coming; decide once every rank is
    // accounted for, or at the deadline (CheckAdoptionsLocked).
    if (rec.adopt_deadline != absl::InfinitePast() &&
        static_cast<int>(rec.adopted.size()) < rec.job.ranks_size()) {
      continue;
    }
    // A worker of this job that went silent is the likelier root cause than
    // a rank that lost its peer.
    std::string cause;
    std::set<std::string> seen;
    for (const auto& r : rec.job.ranks()) {
      if (!seen.insert(r.worker_id()).second) continue;
      const Worker* w = workers_.Find(r.worker_id());
      if (w == nullptr) continue;
      // Counted as its lease counts it (the controller's own pauses left out).
      absl::Duration silent = now - w->lease_from;
      if (!w->info.alive() || silent > options_.failure_settle_time) {
        cause = absl::StrFormat("worker %s on node %s stopped heartbeating (silent for %.1fs); ",
                                r.worker_id(), r.node(), absl::ToDoubleSeconds(silent));
        break;
      }
    }
    PendingFailure& failure = *rec.pending_failure;
    SettledFailure settled;
    settled.worker_went_silent = !cause.empty();
    settled.across_controller_restart = rec.across_controller_restart;
    settled.cause_kind = failure.cause_kind;
    settled.rendezvous = failure.rendezvous;
    settled.rendezvous_retries = rec.rendezvous_retries;
    settled.no_restart_because = failure.no_restart_because;
    const FailureDecision decision = recovery_.DecideFailure(settled);
    // Still awaiting re-adoption after a controller restart: the restart
    // is named as the root cause (RecoveryPolicy::DecideFailure).
    if (decision.blame_controller_restart) {
      cause = "the controller restarted while the attempt ran; ";
      failure.cause_kind = decision.cause_kind;
    }
    std::string why = cause.empty() ? failure.reason
                                    : absl::StrCat(cause, "then ", failure.reason);
    if (decision.action == FailureDecision::kPlaceAgain) {
      rec.rendezvous_retries += 1;
      RequeueLocked(rec, absl::StrCat(why, "; no step had run, so the attempt is placed again "
                                           "(rendezvous retry ",
                                      rec.rendezvous_retries, "/",
                                      options_.max_rendezvous_retries,
                                      ", no restart counted)"));
      continue;
    }
    if (decision.action == FailureDecision::kFailWithoutRestart) {
      FailWithoutRestartLocked(rec, why, failure.no_restart_because);
      continue;
    }
    // A worker of an elastic job went silent: it goes on without it.
    if (settled.worker_went_silent && ReplanLocked(rec, why, kCauseWorkerLost)) continue;
    FailOrRestartLocked(rec, why, decision.cause_kind);
  }
}

void JobManager::AddEvent(JobRecord& rec, loom::v1::RecoveryEvent event) {
  event.set_time_unix_ms(clock_->NowUnixMillis());
  *rec.job.add_events() = event;
  JobEvent e;
  e.set_time_unix_ms(event.time_unix_ms());
  *e.mutable_recovery() = std::move(event);
  jobs_.RecordEvent(rec, e);
}

void JobManager::ForgetWorkerRanks(const std::string& worker_id) {
  for (auto& [jid, rec] : jobs_.records()) {
    for (auto it = rec.live.begin(); it != rec.live.end();) {
      it = it->first == worker_id ? rec.live.erase(it) : std::next(it);
    }
  }
}

void JobManager::RequeueLocked(JobRecord& rec, const std::string& reason, JobState to) {
  StopJobRanks(rec, reason, "");
  rec.pending_failure.reset();
  rec.preempting.reset();
  rec.opportunistic = false;
  rec.exited_ok.clear();
  rec.running_seen.clear();
  rec.attempt_last_step = -1;
  rec.adopt_deadline = absl::InfinitePast();
  rec.adopted.clear();
  rec.across_controller_restart = false;
  rec.job.clear_ranks();
  rec.job.set_generation(rec.job.generation() + 1);
  Transition(rec, to, reason);
}

int64_t JobManager::NewestCheckpointLocked(const JobRecord& rec, int64_t max_step) {
  absl::StatusOr<int64_t> newest = catalog_.NewestGood(rec.job.id(), max_step);
  return newest.ok() ? *newest : 0;
}

absl::Status JobManager::ValidateCheckpointEvents(const loom::v1::ReportStepMetricsRequest& req) {
  for (int i = 0; i < req.events_size(); ++i) {
    if (!req.events(i).has_checkpoint()) continue;
    const loom::v1::CheckpointInfo& c = req.events(i).checkpoint();
    const std::string field = absl::StrCat("events[", i, "].checkpoint");
    if (c.status() != "" && c.status() != kCheckpointCommitted && c.status() != "failed" &&
        c.status() != kCheckpointCorrupt) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".status: \"", c.status(), "\" is not committed, failed or corrupt"));
    }
    if (c.status() == kCheckpointCorrupt &&
        (c.path().empty() || c.step() < 0 || c.failed_check().empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": a corrupt checkpoint needs its path, a step >= 0 and its "
                              "failed_check"));
    }
  }
  return absl::OkStatus();
}

absl::Status JobManager::RecordCorruptCheckpointLocked(JobRecord& rec,
                                                       const loom::v1::CheckpointInfo& report) {
  loom::v1::CheckpointInfo info = report;
  info.set_time_unix_ms(clock_->NowUnixMillis());
  absl::Status s = catalog_.MarkCorrupt(rec.job.id(), info);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("could not record checkpoint: ", s.message()));
  }
  loom::v1::RecoveryEvent corrupt;
  corrupt.set_kind(loom::v1::RecoveryEvent::CHECKPOINT_CORRUPT);
  corrupt.set_step(report.step());
  corrupt.set_generation(rec.job.generation());
  corrupt.set_message(absl::StrCat("checkpoint at step ", report.step(), " is corrupt: ",
                                   report.corrupt_file(), " failed its ", report.failed_check(),
                                   " check (", report.error(), ")"));
  AddEvent(rec, std::move(corrupt));
  return absl::OkStatus();
}

void JobManager::FailWithoutRestartLocked(JobRecord& rec, const std::string& cause,
                                          const std::string& because) {
  loom::v1::RecoveryEvent gave_up;
  gave_up.set_kind(loom::v1::RecoveryEvent::GAVE_UP);
  gave_up.set_message(
      absl::StrCat(because, ", so a restart cannot help (no restart spent): ", cause));
  AddEvent(rec, gave_up);
  StopJobRanks(rec, cause, "");
  Transition(rec, loom::v1::FAILED, cause);
}

void JobManager::FailOrRestartLocked(JobRecord& rec, const std::string& cause,
                                     const std::string& cause_kind) {
  if (IsTerminalJobState(rec.job.state())) return;
  RecoveryOptions o = RecoveryPolicy::EffectiveRecovery(rec.job.spec().recovery());
  if (!RecoveryPolicy::RestartsLeft(rec.job.restarts(), o)) {
    if (o.max_restarts > 0) {
      loom::v1::RecoveryEvent gave_up;
      gave_up.set_kind(loom::v1::RecoveryEvent::GAVE_UP);
      gave_up.set_message(absl::StrCat("no restarts left (max_restarts ", o.max_restarts,
                                       "): ", cause));
      AddEvent(rec, gave_up);
    }
    StopJobRanks(rec, cause, "");
    std::string why = o.max_restarts > 0
                          ? absl::StrCat(cause, " (after ", rec.job.restarts(), " restart(s))")
                          : cause;
    Transition(rec, loom::v1::FAILED, why);
    return;
  }
  rec.job.set_restarts(rec.job.restarts() + 1);
  rec.job.set_resume_step(-1);
  int64_t checkpoint = NewestCheckpointLocked(rec, -1);
  int64_t lost = std::max<int64_t>(0, rec.attempt_last_step - checkpoint);
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::RESTART);
  ev.set_message(cause);
  ev.set_cause(cause_kind);
  ev.set_resume_step(-1);
  ev.set_checkpoint_step(checkpoint);
  ev.set_steps_lost(lost);
  ev.set_generation(rec.job.generation() + 1);
  AddEvent(rec, ev);
  if (metrics_ != nullptr) metrics_->RecordRecovery(rec.job.id(), "restart", cause_kind, lost, 0);
  RequeueLocked(rec, absl::StrCat("restart ", rec.job.restarts(), "/", o.max_restarts,
                                  " from the newest checkpoint after: ", cause));
}

void JobManager::HandleSpikeLocked(JobRecord& rec, const recovery::SpikeVerdict& v,
                                   int64_t data_batch) {
  RecoveryOptions o = RecoveryPolicy::EffectiveRecovery(rec.job.spec().recovery());
  loom::v1::RecoveryEvent spike;
  spike.set_kind(loom::v1::RecoveryEvent::SPIKE);
  spike.set_step(v.step);
  spike.set_signal(v.signal);
  spike.set_value(v.value);
  spike.set_baseline(v.baseline);
  spike.set_score(v.score);
  spike.set_message(v.Describe());
  AddEvent(rec, spike);
  SpikeFacts facts;
  facts.step = v.step;
  facts.data_batch = data_batch;
  facts.rollbacks = rec.job.rollbacks();
  facts.last_spike_step = rec.last_spike_step;
  facts.skip_widened = rec.skip_widened;
  facts.step_batches = &rec.step_batches;
  const SpikeRollback decision = RecoveryPolicy::DecideSpikeRollback(
      o, facts, [&](int64_t max_step) { return NewestCheckpointLocked(rec, max_step); });
  if (decision.give_up) {
    std::string why = absl::StrCat("loss spike not cured after ", rec.job.rollbacks(),
                                   " rollback(s) (max_rollbacks ", o.max_rollbacks,
                                   "): ", v.Describe());
    loom::v1::RecoveryEvent gave_up;
    gave_up.set_kind(loom::v1::RecoveryEvent::GAVE_UP);
    gave_up.set_step(v.step);
    gave_up.set_message(why);
    AddEvent(rec, gave_up);
    StopJobRanks(rec, why, "");
    Transition(rec, loom::v1::FAILED, why);
    return;
  }
  if (decision.widen_skip) rec.skip_widened = true;
  const int64_t resume = decision.resume_step;
  const loom::v1::SkipRange& skip = decision.skip;
  rec.job.set_rollbacks(rec.job.rollbacks() + 1);
  rec.last_spike_step = v.step;
  loom::v1::RecoveryEvent rb;
  rb.set_kind(loom::v1::RecoveryEvent::ROLLBACK);
  rb.set_cause(kCauseLossSpike);
  rb.set_step(v.step);
  rb.set_message(absl::StrFormat(
      "rollback %d/%d: resume from the newest checkpoint at step <= %d, skip data batches "
      "[%d, %d)",
      rec.job.rollbacks(), o.max_rollbacks, resume, skip.begin(), skip.end()));
  std::string reason = absl::StrCat("loss spike at step ", v.step, "; ", rb.message());
  RollBackLocked(rec, resume, resume, {skip}, std::move(rb), reason);
}

void JobManager::RollBackLocked(JobRecord& rec, int64_t resume_step, int64_t checkpoint_step,
                                const std::vector<loom::v1::SkipRange>& skips,
                                loom::v1::RecoveryEvent event, const std::string& reason) {
  int64_t lost = std::max<int64_t>(0, rec.attempt_last_step - checkpoint_step);
  int64_t skipped = 0;
  rec.job.set_resume_step(resume_step);
  for (const auto& r : skips) {
    *rec.job.add_skip_batches() = r;
    skipped += r.end() - r.begin();
  }
  // Steps after the checkpoint are trained again: they leave the baseline.
  if (rec.detector) rec.detector->Truncate(checkpoint_step);
  event.set_resume_step(resume_step);
  event.set_checkpoint_step(checkpoint_step);
  event.set_steps_lost(lost);
  if (!skips.empty()) *event.mutable_skip() = skips.front();
  event.set_generation(rec.job.generation() + 1);
  std::string cause = event.cause();
  AddEvent(rec, std::move(event));
  if (metrics_ != nullptr) metrics_->RecordRecovery(rec.job.id(), "rollback", cause, lost, skipped);
  RequeueLocked(rec, reason);
}

void JobManager::CheckLivenessLocked() {
  for (const WorkerRegistry::DepartedWorker& w : workers_.ExpireLeases()) {
    const std::string& id = w.info.id();
    std::map<std::string, std::vector<int>> lost;
    for (const auto& r : w.ranks) lost[r.job_id].push_back(r.rank);
    for (auto& [jid, ranks] : lost) {
      JobRecord* found = jobs_.Find(jid);
      if (found == nullptr) continue;  // a job this controller never knew
      JobRecord& rec = *found;
      // Its ranks may run until the worker's lease runs out.
      rec.not_before = std::max(rec.not_before,
                                w.last_heartbeat + options_.worker_timeout + options_.lease_margin);
      // Only the current attempt can fail; a requeued job merely stops
      // waiting for ranks that died with the worker.
      if (!IsAttemptRunning(rec.job.state())) continue;
      std::string why = absl::StrFormat(
          "worker %s on node %s stopped heartbeating (silent for %.1fs, timeout %.1fs%s); "
          "lost rank(s) %s",
          id, w.info.node(), absl::ToDoubleSeconds(w.silent),
          absl::ToDoubleSeconds(options_.worker_timeout),
          w.paused > absl::ZeroDuration()
              ? absl::StrFormat(", %.1fs of it while the controller itself was paused",
                                absl::ToDoubleSeconds(w.paused))
              : "",
          absl::StrJoin(ranks, ","));
      ForgetWorkerRanks(id);
      // An elastic job goes on with what the cluster has left.
      if (ReplanLocked(rec, why, kCauseWorkerLost)) continue;
      FailOrRestartLocked(rec, why, kCauseWorkerLost);
    }
    ForgetWorkerRanks(id);
  }
}

std::map<JobState, int> JobManager::JobCountsByState() {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.state_counts();
}

JobManager::RecoveryTotals JobManager::RecoveryCounts() {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.Totals();
}

std::vector<std::string> JobManager::TakeRecentlyEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.swap(recently_ended_);
  return out;
}

int JobManager::AliveWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.alive_count();
}

}  // namespace loom::controller
