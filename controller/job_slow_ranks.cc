// JobManager's slow-rank handling (issue 31): the per-rank compute times of
// each step report feed the attempt's SlowRankDetector
// (controller/recovery/slow_rank_detector.h); a rank it names is recorded
// (SLOW_RANK) and handled as the job's recovery.slow_rank.action says.
// Members of JobManager (job_manager.h), called with mu_ held.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/job_manager.h"
#include "controller/scheduler.h"

namespace loom::controller {

void JobManager::ObserveRankComputeLocked(JobRecord& rec, const loom::v1::StepMetrics& m,
                                          const RecoveryOptions& recovery) {
  if (!recovery.detect_slow_ranks || m.rank_compute_seconds_size() < 2 || m.step() <= 0) return;
  if (!rec.slow_ranks || rec.slow_ranks_generation != rec.job.generation()) {
    rec.slow_ranks = std::make_unique<recovery::SlowRankDetector>(recovery.slow_ranks);
    rec.slow_ranks_generation = rec.job.generation();
  }
  const std::vector<double> seconds(m.rank_compute_seconds().begin(),
                                    m.rank_compute_seconds().end());
  for (const recovery::SlowRankFinding& f : rec.slow_ranks->Observe(m.step(), seconds)) {
    // One action per attempt: a cordon in progress already moves the job.
    HandleSlowRankLocked(rec, f, recovery);
  }
}

bool JobManager::GangFitsElsewhereLocked(const JobRecord& rec) {
  const GangRequest gang = GangRequestOf(rec.job.spec());
  std::vector<WorkerOffer> offers = workers_.Offers(gang.gpu_per_rank);
  for (WorkerOffer& offer : offers) {
    const Worker* w = workers_.Find(offer.info.id());
    for (const RankSlot& slot : w->ranks) {
      if (slot.job_id != rec.job.id()) continue;
      offer.free_slots += 1;
      if (gang.gpu_per_rank && slot.gpu >= 0) offer.free_gpus.push_back(slot.gpu);
    }
    std::sort(offer.free_gpus.begin(), offer.free_gpus.end());
  }
  return PlaceGang(gang, offers).ok();
}

void JobManager::HandleSlowRankLocked(JobRecord& rec, const recovery::SlowRankFinding& f,
                                      const RecoveryOptions& recovery) {
  const absl::Time now = clock_->Now();
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
  const bool moving = rec.preempting.has_value() || rec.pending_failure.has_value() ||
                      rec.job.state() != loom::v1::RUNNING;
  if (action == "cordon" && node.empty()) {
    action = "report";
    outcome = "; its worker is not known, so nothing is cordoned";
  } else if (action == "cordon") {
    const absl::Time until = now + absl::Seconds(recovery.cordon_seconds);
    workers_.Cordon(node, until,
                    absl::StrFormat("rank %d of job %s was %.2fx slower than its peers at step %d",
                                    f.rank, rec.job.id(), f.slowdown, f.step));
    schedule_needed_ = true;
    const bool elastic = rec.job.spec().has_elastic();
    if (moving) {
      outcome = absl::StrFormat(
          "; node %s is cordoned for %ds (no new ranks); the job is already stopping or moving",
          node, recovery.cordon_seconds);
    } else if (elastic ? ElasticGangPlansLocked(rec) : GangFitsElsewhereLocked(rec)) {
      outcome = absl::StrFormat(
          "; node %s is cordoned for %ds, and the ranks save a checkpoint at the next step "
          "boundary and stop, to %s without it (no step lost, no restart counted)",
          node, recovery.cordon_seconds,
          elastic ? "re-plan the elastic job" : "place the job again");
      PreemptionInProgress p;
      p.since = now;
      p.deadline = now + queues_.preemption_grace;
      p.reason = kCauseSlowRank;
      p.step_at_ask = rec.attempt_last_step;
      p.away_from_node = node;
      rec.preempting = std::move(p);
      rec.job.set_reason(absl::StrCat("moving off slow node ", node,
                                      ": saving a checkpoint at the next step boundary"));
      AskToSaveAndStopLocked(rec, absl::StrCat("rank ", f.rank, " is slow; its node ", node,
                                               " is cordoned: save a checkpoint, then stop"));
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
  ev.set_message(absl::StrCat(f.Describe(), where, outcome));
  AddEvent(rec, ev);
  if (metrics_ != nullptr) metrics_->RecordSlowRank(rec.job.id(), action);
}

}  // namespace loom::controller
