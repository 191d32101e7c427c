#include "controller/admission/submission.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec.h"
#include "common/status_macros.h"
#include "controller/admission/path_policy.h"
#include "controller/admission/scheduler.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/planner/topology_yaml.h"

namespace loom::controller {

using loom::v1::Job;
using loom::v1::JobState;

Submissions::Submissions(JobTable* jobs, const WorkerRegistry* workers, CheckpointCatalog* catalog,
                         const Clock* clock, const scheduling::QueueConfig* queues, Options options)
    : jobs_(jobs),
      workers_(workers),
      catalog_(catalog),
      clock_(clock),
      queues_(queues),
      options_(std::move(options)) {}
absl::StatusOr<JobRecord*> Submissions::Submit(loom::v1::JobSpec spec, const absl::Status& valid,
                                               std::string submitted_by, absl::string_view role) {
  if (!valid.ok()) {
    // A tensor/pipeline layout that would not even fit is worth saying so:
    // "not executable yet" alone would send the user the wrong way.
    if (valid.code() == absl::StatusCode::kUnimplemented &&
        (spec.parallelism().tensor() > 1 || spec.parallelism().pipeline() > 1)) {
      auto topology = LiveTopologyFor(spec);
      if (topology.ok()) return ExplainUnexecutableLayout(spec, *topology, valid);
    }
    return valid;
  }
  // The queue it waits in, and its priority there, as this controller's
  // configuration defines them ("scheduling.queue: unknown queue ...").
  {
    ASSIGN_OR_RETURN(const scheduling::QueueSpec* queue,
                     queues_->ResolveQueue(spec.scheduling().queue()));
    RETURN_IF_ERROR(queues_->ResolvePriority(spec.scheduling().priority()).status());
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
  RETURN_IF_ERROR(ResolveInitFrom(&spec));
  if (!spec.checkpoint().dir().empty()) {
    RETURN_IF_ERROR(CheckCheckpointDirFree(spec.checkpoint().dir()));
  }
  auto topology = LiveTopologyFor(spec);
  if (!topology.ok()) return topology.status();
  auto plan = PlanAtSubmit(&spec, *topology);
  if (!plan.ok()) return plan.status();
  // A gang no cluster could place (a tensor group larger than a worker's
  // share) is refused now rather than left waiting.
  if (absl::Status shape = CheckGangShape(GangRequestOf(spec)); !shape.ok()) return shape;
  plan->set_time_unix_ms(clock_->NowUnixMillis());
  std::string id = jobs_->NewJobId(spec.name());
  if (spec.checkpoint().dir().empty() && !options_.checkpoint_root.empty()) {
    spec.mutable_checkpoint()->set_dir(absl::StrCat(options_.checkpoint_root, "/", id));
    // (Taken only if a job named <root>/<this id> as its own.)
    RETURN_IF_ERROR(CheckCheckpointDirFree(spec.checkpoint().dir()));
  }
  if (absl::StartsWith(spec.init_from().path(), "s3://") && spec.checkpoint().dir().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from.path: ", spec.init_from().path(),
        " is in an object store: rank 0 downloads it into the job's checkpoint.dir, which this "
        "job has none of (set checkpoint.dir)"));
  }
  JobRecord& rec = jobs_->Add(id);
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
  jobs_->RecordTransition(rec, loom::v1::PENDING, "submitted");
  RETURN_IF_ERROR(jobs_->StoreNew(rec));
  return jobs_->Find(id);
}

absl::Status Submissions::ResolveInitFrom(loom::v1::JobSpec* spec) {
  loom::v1::InitFrom* from = spec->mutable_init_from();
  if (from->job().empty()) return absl::OkStatus();
  const JobRecord* source = jobs_->Find(from->job());
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
    return absl::InvalidArgumentError(
        absl::StrCat("init_from.job: ", from->job(), " trains ", DescribeDecoder(theirs), ", but ",
                     ModelPath(spec->model()), " is ", DescribeDecoder(mine),
                     "; a checkpoint initializes only the same model"));
  }
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> catalog = catalog_->List(from->job());
  if (!catalog.ok()) return catalog.status();
  // A checkpoint is there to start from if its directory is (committed) or
  // the object store has a copy (remote_url, unless it was found corrupt).
  const loom::v1::CheckpointInfo* chosen = nullptr;
  std::vector<std::string> committed;
  for (const loom::v1::CheckpointInfo& c : *catalog) {
    const bool local = c.status() == "committed";
    if (!local && (c.remote_url().empty() || c.status() == "corrupt")) continue;
    committed.push_back(absl::StrCat(c.step(), local ? "" : " (in the object store)"));
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
  // The fastest tier that has it: the directory, else the object store.
  from->set_path(chosen->status() == "committed" ? chosen->path() : chosen->remote_url());
  return absl::OkStatus();
}

absl::Status Submissions::CheckCheckpointDirFree(const std::string& dir) const {
  for (const auto& [id, rec] : jobs_->records()) {
    if (IsTerminalJobState(rec.job.state())) continue;
    const std::string& theirs = rec.job.spec().checkpoint().dir();
    if (theirs.empty() || !(PathIsUnder(dir, theirs) || PathIsUnder(theirs, dir))) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir: ", dir, " is in use by job ", id, " (",
                     loom::v1::JobState_Name(rec.job.state()), ", checkpoint.dir ", theirs,
                     "); two unfinished jobs would prune each other's checkpoints: choose another "
                     "directory, or leave checkpoint.dir out for one of the job's own"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LiveTopology> Submissions::LiveTopologyFor(const loom::v1::JobSpec& spec) const {
  return TopologyForSpec(spec, workers_->Infos());
}

absl::StatusOr<loom::v1::PlanResponse> Submissions::Plan(
    const loom::v1::PlanRequest& request,
    const std::function<absl::StatusOr<LiveTopology>(const loom::v1::JobSpec&)>& live_topology) {
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
    topology.description =
        absl::StrCat(parsed->name.empty() ? "the given topology" : parsed->name, " (",
                     parsed->nodes, " x ", parsed->devices_per_node, " ", parsed->device.name, ")");
  } else {
    auto live = live_topology(spec);
    if (!live.ok()) return live.status();
    topology = std::move(*live);
  }
  // Planning is pure computation (well under a second): outside the lock.
  return PlanSpec(spec, topology, top_k, request.executable_only());
}

}  // namespace loom::controller
