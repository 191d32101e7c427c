// JobManager's elastic re-planning (issue 31): an elastic job that lost a
// worker is re-planned for the slots the live cluster can give it now
// (controller/elastic.h), instead of waiting for its whole gang. Members of
// JobManager (job_manager.h), called with mu_ held.
#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/elastic.h"
#include "controller/job_manager.h"
#include "controller/job_planning.h"
#include "controller/scheduler.h"

namespace loom::controller {

bool JobManager::ReplanLocked(JobRecord& rec, const std::string& cause,
                              const std::string& cause_kind) {
  const loom::v1::JobSpec& spec = rec.job.spec();
  if (!spec.has_elastic() || IsTerminalJobState(rec.job.state())) return false;
  const bool gpu = spec.resources().gpus_per_rank() > 0;
  // What each alive worker could give the job: its slots (GPUs for a GPU
  // job) less what other jobs' ranks hold there.
  std::vector<loom::v1::WorkerInfo> alive;
  std::vector<int> free;
  const absl::Time now = clock_->Now();
  for (const loom::v1::WorkerInfo& info : workers_.Infos()) {
    if (!info.alive()) continue;
    const Worker* w = workers_.Find(info.id());
    // A worker silent for longer than a failure takes to settle is the one
    // being lost (its lease may not have run out yet).
    if (now - w->lease_from > options_.failure_settle_time) continue;
    int others = 0;
    for (const RankSlot& slot : w->ranks) {
      if (slot.job_id != rec.job.id() && (!gpu || slot.gpu >= 0)) ++others;
    }
    alive.push_back(info);
    free.push_back(std::max(0, (gpu ? info.gpus() : info.slots()) - others));
  }
  std::string tried;
  for (const ElasticShape& shape :
       ElasticCandidates(free, spec.elastic().min_ranks(), spec.elastic().max_ranks())) {
    loom::v1::JobSpec candidate = SpecForShape(spec, shape);
    absl::StatusOr<LiveTopology> topology = TopologyForSpec(candidate, alive);
    if (!topology.ok()) continue;
    absl::StatusOr<loom::v1::JobPlan> plan = PlanAtSubmit(&candidate, *topology);
    if (plan.ok() && !plan->layout().fits()) {
      plan = absl::FailedPreconditionError("does not fit");
    }
    if (plan.ok()) {
      if (absl::Status shape_ok = CheckGangShape(GangRequestOf(candidate)); !shape_ok.ok()) {
        plan = shape_ok;
      }
    }
    if (!plan.ok()) {
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", shape.ranks, " rank(s) on ", shape.workers,
                      " worker(s): ", plan.status().message());
      continue;
    }
    plan->set_time_unix_ms(clock_->NowUnixMillis());
    const int64_t checkpoint = NewestCheckpointLocked(rec, -1);
    const int64_t lost = std::max<int64_t>(0, rec.attempt_last_step - checkpoint);
    loom::v1::RecoveryEvent ev;
    ev.set_kind(loom::v1::RecoveryEvent::REPLANNED);
    ev.set_cause(cause_kind);
    ev.set_from_layout(rec.job.plan().layout().summary());
    ev.set_to_layout(plan->layout().summary());
    ev.set_predicted_step_seconds(plan->layout().step_seconds());
    ev.set_checkpoint_step(checkpoint);
    ev.set_resume_step(-1);
    ev.set_steps_lost(lost);
    ev.set_step(std::max<int64_t>(0, rec.attempt_last_step));
    ev.set_generation(rec.job.generation() + 1);
    ev.set_message(absl::StrFormat(
        "%s; re-planned from %d to %d rank(s) on %d worker(s) for the live cluster: %s -> %s "
        "(predicted %.3f s a step), resuming from the checkpoint at step %d (%d step(s) after it "
        "lost); no restart counted",
        cause, spec.resources().ranks(), shape.ranks, shape.workers, ev.from_layout(),
        ev.to_layout(), ev.predicted_step_seconds(), checkpoint, lost));
    AddEvent(rec, ev);
    if (metrics_ != nullptr) metrics_->RecordRecovery(rec.job.id(), "replan", cause_kind, lost, 0);
    rec.job.set_layout_generation(rec.job.layout_generation() + 1);
    rec.job.set_resume_step(-1);
    *rec.job.mutable_spec() = std::move(candidate);
    *rec.job.mutable_plan() = *std::move(plan);
    RequeueLocked(rec, ev.message());
    return true;
  }
  std::cerr << "loom-controller: elastic job " << rec.job.id() << " could not be re-planned ("
            << (tried.empty() ? "fewer than elastic.min_ranks slots are free" : tried)
            << "); it waits for its gang" << std::endl;
  return false;
}

}  // namespace loom::controller
