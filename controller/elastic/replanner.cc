#include "controller/elastic/replanner.h"

#include <algorithm>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/admission/job_planning.h"
#include "controller/admission/scheduler.h"
#include "controller/elastic/elastic.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/progress/job_progress.h"

namespace loom::controller {

using Worker = WorkerRegistry::Worker;
using RankSlot = WorkerRegistry::RankSlot;
using loom::v1::JobState;

namespace {

// A gang the planner found an executable layout for.
struct PlannedShape {
  ElasticShape shape;
  loom::v1::JobSpec spec;
  loom::v1::JobPlan plan;
};

// The first of `candidates` the planner finds an executable layout for on
// `alive`; `tried` collects why the others did not.
static std::optional<PlannedShape> FirstThatPlans(const loom::v1::JobSpec& spec,
                                                  const std::vector<ElasticShape>& candidates,
                                                  const std::vector<loom::v1::WorkerInfo>& alive,
                                                  std::string* tried) {
  for (const ElasticShape& shape : candidates) {
    loom::v1::JobSpec candidate = SpecForShape(spec, shape);
    absl::StatusOr<LiveTopology> topology = TopologyForSpec(candidate, alive);
    absl::StatusOr<loom::v1::JobPlan> plan =
        topology.ok() ? PlanAtSubmit(&candidate, *topology) : topology.status();
    if (plan.ok() && !plan->layout().fits()) {
      plan = absl::FailedPreconditionError(plan->layout().infeasible_reason());
    }
    if (plan.ok()) {
      if (absl::Status gang = CheckGangShape(GangRequestOf(candidate)); !gang.ok()) plan = gang;
    }
    if (!plan.ok()) {
      absl::StrAppend(tried, tried->empty() ? "" : "; ", shape.ranks, " rank(s) on ", shape.workers,
                      " worker(s): ", plan.status().message());
      continue;
    }
    return PlannedShape{shape, std::move(candidate), *std::move(plan)};
  }
  return std::nullopt;
}

}  // namespace

Replanner::Replanner(JobTable* jobs, WorkerRegistry* workers, CheckpointCatalog* catalog,
                     Preemptor* preemptor, const Clock* clock, RecoveryMetrics* metrics,
                     const scheduling::QueueConfig* queues, Options options)
    : jobs_(jobs),
      workers_(workers),
      catalog_(catalog),
      preemptor_(preemptor),
      clock_(clock),
      metrics_(metrics),
      queues_(queues),
      options_(options) {}
std::vector<int> Replanner::FreeSlots(const JobRecord& rec,
                                      std::vector<loom::v1::WorkerInfo>* alive) {
  const bool gpu = rec.job.spec().resources().gpus_per_rank() > 0;
  const absl::Time now = clock_->Now();
  std::vector<int> free;
  for (const loom::v1::WorkerInfo& info : workers_->Infos()) {
    if (!info.alive()) continue;
    const Worker* w = workers_->Find(info.id());
    // A worker silent for longer than a failure takes to settle is the one
    // being lost (its lease may not have run out yet).
    if (now - w->lease_from > options_.failure_settle_time) continue;
    if (workers_->IsCordoned(info.node())) continue;  // a slow rank there (SlowRankSpec)
    int others = 0;
    for (const RankSlot& slot : w->ranks) {
      if (slot.job_id != rec.job.id() && (!gpu || slot.gpu >= 0)) ++others;
    }
    alive->push_back(info);
    free.push_back(std::max(0, (gpu ? info.gpus() : info.slots()) - others));
  }
  return free;
}

bool Replanner::Replan(JobRecord& rec, const std::string& cause, const std::string& cause_kind,
                       int max_ranks) {
  const loom::v1::JobSpec& spec = rec.job.spec();
  if (!spec.has_elastic() || IsTerminalJobState(rec.job.state())) return false;
  const int most =
      max_ranks > 0 ? std::min(max_ranks, spec.elastic().max_ranks()) : spec.elastic().max_ranks();
  if (most < spec.elastic().min_ranks()) return false;
  std::vector<loom::v1::WorkerInfo> alive;
  const std::vector<int> free = FreeSlots(rec, &alive);
  std::string tried;
  std::optional<PlannedShape> chosen = FirstThatPlans(
      spec, ElasticCandidates(free, spec.elastic().min_ranks(), most), alive, &tried);
  if (!chosen.has_value()) {
    std::cerr << "loom-controller: elastic job " << rec.job.id() << " could not be re-planned ("
              << (tried.empty() ? "fewer than elastic.min_ranks slots are free" : tried)
              << "); it waits for its gang" << std::endl;
    return false;
  }
  chosen->plan.set_time_unix_ms(clock_->NowUnixMillis());
  const std::string message = RecordReplan(
      rec, cause_kind, rec.job.plan().layout().summary(), chosen->plan.layout().summary(),
      chosen->plan.layout().step_seconds(), [&](const std::string& resume_from, int64_t lost) {
        return absl::StrFormat(
            "%s; re-planned from %d to %d rank(s) on %d worker(s) for the live cluster: %s -> %s "
            "(predicted %.3f s a step), resuming from %s (%d step(s) after it lost); no restart "
            "counted",
            cause, spec.resources().ranks(), chosen->shape.ranks, chosen->shape.workers,
            rec.job.plan().layout().summary(), chosen->plan.layout().summary(),
            chosen->plan.layout().step_seconds(), resume_from, lost);
      });
  *rec.job.mutable_spec() = std::move(chosen->spec);
  *rec.job.mutable_plan() = std::move(chosen->plan);
  jobs_->Requeue(rec, message);
  return true;
}

std::string Replanner::RecordReplan(
    JobRecord& rec, const std::string& cause_kind, const std::string& from_layout,
    const std::string& to_layout, double predicted_step_seconds,
    const std::function<std::string(const std::string& resume_from, int64_t lost)>& describe) {
  // (Or the newest in-memory snapshot a live node holds: resume.h.)
  const int64_t newest_checkpoint = catalog_->NewestGoodStep(rec.job.id(), -1);
  const int64_t checkpoint =
      ResumePointAfterLoss(rec, newest_checkpoint,
                           [this](const std::string& node) { return workers_->NodeAlive(node); });
  const int64_t lost = std::max<int64_t>(0, rec.attempt_last_step - checkpoint);
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::REPLANNED);
  ev.set_cause(cause_kind);
  ev.set_from_layout(from_layout);
  ev.set_to_layout(to_layout);
  ev.set_predicted_step_seconds(predicted_step_seconds);
  ev.set_checkpoint_step(checkpoint);
  ev.set_resume_step(-1);
  ev.set_steps_lost(lost);
  ev.set_step(std::max<int64_t>(0, rec.attempt_last_step));
  ev.set_generation(rec.job.generation() + 1);
  ev.set_message(describe(
      absl::StrCat(checkpoint > newest_checkpoint ? "the in-memory snapshot" : "the checkpoint",
                   " at step ", checkpoint),
      lost));
  const std::string message = ev.message();
  jobs_->AddEvent(rec, std::move(ev));
  if (metrics_ != nullptr) metrics_->RecordRecovery(rec.job.id(), "replan", cause_kind, lost, 0);
  rec.job.set_layout_generation(rec.job.layout_generation() + 1);
  rec.job.set_resume_step(-1);
  return message;
}

bool Replanner::ShrinkWaiting(const scheduling::ClusterSnapshot& snapshot,
                              const scheduling::Decisions& decisions) {
  // Slots about to come back (ranks saving or exiting): look again then.
  for (const scheduling::RunningJob& r : snapshot.running) {
    if (r.saving) return false;
  }
  // Only when the one job waiting for capacity is an elastic gang that does
  // not fit: a smaller gang then takes room nobody else is waiting for (no
  // reservation is bypassed, no earlier gang overtaken).
  JobRecord* candidate = nullptr;
  for (const scheduling::Waiting& w : decisions.waiting) {
    if (w.reason == scheduling::WaitReason::kOverQuota ||
        w.reason == scheduling::WaitReason::kUnknownQueue) {
      continue;
    }
    JobRecord* rec = jobs_->Find(w.job_id);
    const bool shrinkable =
        rec != nullptr && w.reason == scheduling::WaitReason::kGangDoesNotFit &&
        rec->job.spec().has_elastic() && rec->live.empty() &&
        rec->job.spec().resources().ranks() > rec->job.spec().elastic().min_ranks();
    if (!shrinkable || candidate != nullptr) return false;
    candidate = rec;
  }
  if (candidate == nullptr) return false;
  JobRecord& rec = *candidate;
  const bool preempted = rec.job.state() == loom::v1::PREEMPTED;
  const std::string why =
      absl::StrCat(preempted ? "preempted, and its whole gang of " : "its gang of ",
                   rec.job.spec().resources().ranks(), " rank(s) does not fit the free slots");
  return Replan(rec, why, preempted ? kCausePreemption : kCauseCapacityShort,
                rec.job.spec().resources().ranks() - 1);
}

bool Replanner::GangPlans(const JobRecord& rec) {
  const loom::v1::JobSpec& spec = rec.job.spec();
  if (!spec.has_elastic()) return false;
  std::vector<loom::v1::WorkerInfo> alive;
  const std::vector<int> free = FreeSlots(rec, &alive);
  std::string tried;
  return FirstThatPlans(
             spec, ElasticCandidates(free, spec.elastic().min_ranks(), spec.elastic().max_ranks()),
             alive, &tried)
      .has_value();
}

void Replanner::Grow() {
  // Free room goes to the jobs waiting for it first.
  if (!jobs_->pending().empty()) return;
  const absl::Time now = clock_->Now();
  for (const std::string& jid : jobs_->unfinished()) {
    JobRecord& rec = *jobs_->Find(jid);
    const loom::v1::JobSpec& spec = rec.job.spec();
    if (!spec.has_elastic() || rec.job.state() != loom::v1::RUNNING || rec.preempting ||
        rec.pending_failure || rec.attempt_last_step < 0 ||
        spec.resources().ranks() >= spec.elastic().max_ranks()) {
      continue;
    }
    // Not again before the queues' minimum run time (no thrash), and the
    // planner asked at most every 5 s.
    const absl::Time started = LastTransitionTo(rec.job, loom::v1::SCHEDULED).value_or(now);
    if (now - started < queues_->min_run_time || now - rec.grow_checked < absl::Seconds(5)) {
      continue;
    }
    rec.grow_checked = now;
    std::vector<loom::v1::WorkerInfo> alive;
    const std::vector<int> free = FreeSlots(rec, &alive);
    std::string tried;
    const std::optional<PlannedShape> larger = FirstThatPlans(
        spec, ElasticCandidates(free, spec.resources().ranks() + 1, spec.elastic().max_ranks()),
        alive, &tried);
    if (!larger.has_value()) continue;
    PreemptionInProgress& p = preemptor_->SaveAndStopToMove(
        rec, MoveIntent::kGrow, kCauseCapacityReturned,
        absl::StrCat("growing to ", larger->shape.ranks, " rank(s)"),
        absl::StrCat("room for ", larger->shape.ranks,
                     " rank(s): save a checkpoint, then stop to grow"));
    p.grow_to = larger->shape.ranks;
  }
}

void Replanner::FinishMove(JobRecord& rec, const PreemptionInProgress& move) {
  const absl::Time now = clock_->Now();
  if (move.intent == MoveIntent::kAwayFromNode) {
    // Moving off a slow rank's cordoned node: re-planned without it
    // (elastic), or placed again as it was on the other workers.
    const std::string why = absl::StrFormat(
        "a slow rank's node %s is cordoned; the ranks saved and stopped %.1fs after the request",
        move.away_from_node, absl::ToDoubleSeconds(now - move.since));
    if (!Replan(rec, why, kCauseSlowRank)) {
      rec.job.set_resume_step(-1);
      jobs_->Requeue(rec, why + "; placed again without it");
    }
    return;
  }
  // An elastic job saved to grow: re-plan it for what the cluster has now
  // (its own slots included); if that no longer plans, it goes back as it was.
  const std::string why = absl::StrFormat(
      "room for %d rank(s) came back; the ranks saved and stopped %.1fs after the request",
      move.grow_to, absl::ToDoubleSeconds(now - move.since));
  if (!Replan(rec, why, kCauseCapacityReturned)) {
    jobs_->Requeue(rec, why + "; the larger gang no longer plans: resuming as it was");
  }
}

}  // namespace loom::controller
