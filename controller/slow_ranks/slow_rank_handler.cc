#include "controller/slow_ranks/slow_rank_handler.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/jobspec_model.h"
#include "controller/admission/scheduler.h"
#include "controller/slow_ranks/stage_split.h"

namespace loom::controller {

using Worker = WorkerRegistry::Worker;
using RankSlot = WorkerRegistry::RankSlot;
using loom::v1::JobState;

SlowRankHandler::SlowRankHandler(JobTable* jobs, WorkerRegistry* workers, Store* store,
                                 Preemptor* preemptor, Replanner* replanner, const Clock* clock,
                                 RecoveryMetrics* metrics, ScheduleSignal* schedule)
    : jobs_(jobs),
      workers_(workers),
      store_(store),
      preemptor_(preemptor),
      replanner_(replanner),
      clock_(clock),
      metrics_(metrics),
      schedule_(schedule) {}
void SlowRankHandler::Observe(JobRecord& rec, const loom::v1::StepMetrics& m,
                              const RecoveryOptions& recovery) {
  if (!recovery.detect_slow_ranks || m.rank_compute_seconds_size() < 2 || m.step() <= 0) return;
  if (!rec.slow_ranks || rec.slow_ranks_generation != rec.job.generation()) {
    rec.slow_ranks = std::make_unique<recovery::SlowRankDetector>(recovery.slow_ranks);
    rec.slow_ranks_generation = rec.job.generation();
  }
  std::vector<double> seconds(m.rank_compute_seconds().begin(), m.rank_compute_seconds().end());
  // Pipeline stages do different amounts of work (their blocks, the LM head
  // on the last): each rank's time is scaled to the average stage's work,
  // so that only a rank slow for its work stands out.
  const int stages = rec.job.spec().parallelism().pipeline();
  if (stages > 1) {
    const std::vector<int> split =
        rec.stage_layers_now.empty() ? EvenSplit(rec.job.spec()) : rec.stage_layers_now;
    if (static_cast<int>(split.size()) == stages) {
      const double extra = LastStageExtraBlocks(rec.job.spec());
      std::vector<double> work(stages);
      double mean = 0;
      for (int s = 0; s < stages; ++s) {
        work[s] = split[s] + (s == stages - 1 ? extra : 0.0);
        mean += work[s] / stages;
      }
      for (const loom::v1::RankAssignment& a : rec.job.ranks()) {
        if (a.rank() >= 0 && a.rank() < static_cast<int>(seconds.size()) && a.pp() >= 0 &&
            a.pp() < stages) {
          seconds[a.rank()] *= mean / work[a.pp()];
        }
      }
    }
  }
  for (const recovery::SlowRankFinding& f :
       rec.slow_ranks->Observe(m.step(), m.time_unix_ms() / 1000.0, seconds)) {
    // One action per attempt: a cordon in progress already moves the job.
    Handle(rec, f, recovery);
  }
}

bool SlowRankHandler::GangFitsElsewhere(const JobRecord& rec) {
  const GangRequest gang = GangRequestOf(rec.job.spec());
  std::vector<WorkerOffer> offers = workers_->Offers(gang.gpu_per_rank);
  for (WorkerOffer& offer : offers) {
    const Worker* w = workers_->Find(offer.info.id());
    for (const RankSlot& slot : w->ranks) {
      if (slot.job_id != rec.job.id()) continue;
      offer.free_slots += 1;
      if (gang.gpu_per_rank && slot.gpu >= 0) offer.free_gpus.push_back(slot.gpu);
    }
    std::sort(offer.free_gpus.begin(), offer.free_gpus.end());
  }
  return PlaceGang(gang, offers).ok();
}

void SlowRankHandler::Handle(JobRecord& rec, const recovery::SlowRankFinding& f,
                             const RecoveryOptions& recovery) {
  const absl::Time now_time = clock_->Now();
  std::string worker_id, node;
  for (const loom::v1::RankAssignment& a : rec.job.ranks()) {
    if (a.rank() == f.rank) {
      worker_id = a.worker_id();
      node = a.node();
    }
  }
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::SLOW_RANK);
  ev.set_cause(kCauseSlowRank);
  ev.set_step(f.step);
  ev.set_signal("compute_seconds");
  ev.set_value(f.seconds);
  ev.set_baseline(f.peer_seconds);
  ev.set_score(f.z);
  ev.set_slowdown(f.slowdown);
  ev.set_rank(f.rank);
  ev.set_worker_id(worker_id);
  ev.set_generation(rec.job.generation());
  const std::string where =
      node.empty() ? std::string() : absl::StrCat(" on worker ", worker_id, " (node ", node, ")");
  std::string action = recovery.slow_rank_action;
  std::string outcome;
  std::string fallback;  // why another action than the spec's was taken
  const bool moving = rec.preempting.has_value() || rec.pending_failure.has_value() ||
                      rec.job.state() != loom::v1::RUNNING;
  if (action == "replan" && !node.empty() && rec.job.spec().parallelism().pipeline() > 1 &&
      !moving) {
    const std::vector<int> now =
        rec.stage_layers_now.empty() ? EvenSplit(rec.job.spec()) : rec.stage_layers_now;
    double& recorded = rec.node_slowdown[node];
    recorded = std::max(recorded, f.slowdown);
    const std::vector<int> after = StageLayersForPlacement(rec, NodeStagesOf(rec));
    if (after.empty() || after == now) {
      outcome = absl::StrFormat(
          "; re-planning around it cannot help: the split for its measured speed is the one in "
          "force (%s)",
          DescribeSplit(now));
    } else {
      outcome = absl::StrFormat(
          "; the ranks save a checkpoint at the next step boundary and stop, and the job resumes "
          "with its pipeline re-split for node %s's speed: %s -> %s (no step lost, no restart "
          "counted)",
          node, DescribeSplit(now), DescribeSplit(after));
      preemptor_->SaveAndStopToMove(
          rec, MoveIntent::kReplanAround, kCauseSlowRank,
          absl::StrCat("re-splitting its pipeline around slow node ", node),
          absl::StrCat("rank ", f.rank,
                       " is slow: save a checkpoint, then "
                       "stop to re-split the pipeline"));
    }
  } else if (action == "replan" && !moving) {
    action = "cordon";
    fallback = "; the layout has no pipeline stages to re-split, so it cordons instead";
  }
  if (action == "replan") {
    if (moving) outcome = "; the job is already stopping or moving";
  } else if (action == "cordon" && node.empty()) {
    action = "report";
    outcome = "; its worker is not known, so nothing is cordoned";
  } else if (action == "cordon") {
    const absl::Time until = now_time + absl::Seconds(recovery.cordon_seconds);
    const std::string reason =
        absl::StrFormat("rank %d of job %s was %.2fx slower than its peers at step %d", f.rank,
                        rec.job.id(), f.slowdown, f.step);
    // Kept across a controller restart; a failed write only shortens it to
    // this controller's life. A longer cordon in force (an operator's) stays.
    const WorkerRegistry::CordonEntry held = workers_->Cordon(node, until, reason);
    if (absl::Status s = store_->PutCordon(
            {node, WorkerRegistry::CordonEndToUnixMillis(held.until), held.reason});
        !s.ok()) {
      std::cerr << "loom-controller: could not record the cordon of " << node << ": " << s
                << std::endl;
    }
    schedule_->Request();
    const bool elastic = rec.job.spec().has_elastic();
    if (moving) {
      outcome = absl::StrFormat(
          "; node %s is cordoned for %ds (no new ranks); the job is already stopping or moving",
          node, recovery.cordon_seconds);
    } else if (elastic ? replanner_ != nullptr && replanner_->GangPlans(rec)
                       : GangFitsElsewhere(rec)) {
      outcome = absl::StrFormat(
          "; node %s is cordoned for %ds, and the ranks save a checkpoint at the next step "
          "boundary and stop, to %s without it (no step lost, no restart counted)",
          node, recovery.cordon_seconds,
          elastic ? "re-plan the elastic job" : "place the job again");
      preemptor_
          ->SaveAndStopToMove(rec, MoveIntent::kAwayFromNode, kCauseSlowRank,
                              absl::StrCat("moving off slow node ", node),
                              absl::StrCat("rank ", f.rank, " is slow; its node ", node,
                                           " is cordoned: save a checkpoint, then stop"))
          .away_from_node = node;
    } else {
      outcome = absl::StrFormat(
          "; node %s is cordoned for %ds (no new ranks), but %s, so the job keeps running there",
          node, recovery.cordon_seconds,
          elastic ? "no gang of at least elastic.min_ranks plans without it"
                  : "its gang does not fit elsewhere");
    }
  } else {
    outcome = "; recovery.slow_rank.action is \"report\": nothing else is done";
  }
  ev.set_message(absl::StrCat(
      f.Describe(),
      rec.job.spec().parallelism().pipeline() > 1 ? " (times scaled to equal work per stage)" : "",
      where, fallback, outcome));
  jobs_->AddEvent(rec, ev);
  if (metrics_ != nullptr) metrics_->RecordSlowRank(rec.job.id(), action);
}

void SlowRankHandler::FinishMove(JobRecord& rec, const PreemptionInProgress&) {
  // A slow rank's stage gets fewer blocks: placed again, its stages split
  // for its nodes' speeds there (StageLayersForPlacement).
  const std::vector<int> split = StageLayersForPlacement(rec, NodeStagesOf(rec));
  const std::string summary = rec.job.plan().layout().summary();
  const std::string from = absl::StrCat(summary, " | ", StageSplitText(rec, rec.stage_layers_now));
  const std::string to = absl::StrCat(summary, " | ", StageSplitText(rec, split));
  const std::string message = replanner_->RecordReplan(
      rec, kCauseSlowRank, from, to, rec.job.plan().layout().step_seconds(),
      [&](const std::string& resume_from, int64_t lost) {
        return absl::StrFormat(
            "re-split the pipeline around a slow rank: %s -> %s (for these nodes; split again "
            "for the nodes it is placed on), resuming from %s (%d step(s) after it lost); no "
            "restart counted",
            from, to, resume_from, lost);
      });
  jobs_->Requeue(rec, message);
}

}  // namespace loom::controller
