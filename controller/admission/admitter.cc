#include "controller/admission/admitter.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rank_exit.h"
#include "controller/admission/scheduler.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/progress/job_progress.h"
#include "controller/slow_ranks/stage_split.h"

namespace loom::controller {

using Worker = WorkerRegistry::Worker;
using RankSlot = WorkerRegistry::RankSlot;
using loom::v1::JobState;

namespace {

// The catalog's checkpoints without a remote copy that rank 0 is asked to
// upload (StartRank.pending_uploads): the newest 64, a bound on the
// message; what an outage kept back beyond them stays on the fast tier.
constexpr int kMaxPendingUploads = 64;

// Whether the policy may preempt the job: it says so (default true) and it
// has a checkpoint directory to save into, so a preemption loses nothing.
bool IsPreemptible(const loom::v1::JobSpec& spec) {
  const bool allowed = !spec.scheduling().has_preemptible() || spec.scheduling().preemptible();
  return allowed && !spec.checkpoint().dir().empty();
}

}  // namespace

Admitter::Admitter(JobTable* jobs, WorkerRegistry* workers, CheckpointCatalog* catalog,
                   const Clock* clock, const scheduling::QueueConfig* queues, Preemptor* preemptor,
                   Replanner* replanner, ScheduleSignal* schedule)
    : jobs_(jobs),
      workers_(workers),
      catalog_(catalog),
      clock_(clock),
      queues_(queues),
      preemptor_(preemptor),
      replanner_(replanner),
      schedule_(schedule),
      policy_(*queues) {}

void Admitter::OnTransition(const JobRecord&, JobState to) {
  if (IsQueuedJobState(to)) schedule_->Request();
}
void Admitter::Schedule() {
  schedule_->Reset();
  if (jobs_->pending().empty()) return;
  const absl::Time now = clock_->Now();

  // The cluster as the scheduling policy sees it (controller/scheduling/):
  // what each alive worker has free, what each placed job holds (a job
  // saving for a preemption still holds its slots), and the jobs waiting.
  scheduling::ClusterSnapshot snapshot;
  std::map<std::string, std::map<std::string, scheduling::Resources>> held;  // job -> worker
  for (const loom::v1::WorkerInfo& info : workers_->Infos()) {
    if (!info.alive()) continue;
    const Worker* w = workers_->Find(info.id());
    scheduling::WorkerFree free{info.id(), {info.slots(), std::max(0, info.gpus())}};
    for (const RankSlot& slot : w->ranks) {
      scheduling::Resources& h = held[slot.job_id][info.id()];
      h.slots += 1;
      free.free.slots -= 1;
      if (slot.gpu >= 0) {
        h.gpus += 1;
        free.free.gpus -= 1;
      }
    }
    free.free.slots = std::max<int64_t>(0, free.free.slots);
    free.free.gpus = std::max<int64_t>(0, free.free.gpus);
    if (const std::optional<absl::Time> until = workers_->CordonedUntil(info.node())) {
      // Cordoned (a slow rank there): nothing new goes on it until then.
      free.free = {0, 0};
      schedule_->RequestBy(*until);
    }
    snapshot.workers.push_back(std::move(free));
  }
  auto queue_of = [](const loom::v1::JobSpec& spec) {
    const std::string& name = spec.scheduling().queue();
    return name.empty() ? std::string(scheduling::kDefaultQueue) : name;
  };
  auto priority_of = [this](const loom::v1::JobSpec& spec) {
    absl::StatusOr<int> priority = queues_->ResolvePriority(spec.scheduling().priority());
    return priority.ok() ? *priority : 0;  // a class removed on reload: 0
  };
  for (const auto& [job_id, workers] : held) {
    const JobRecord* rec = jobs_->Find(job_id);
    scheduling::RunningJob r;
    r.id = job_id;
    r.opportunistic = rec != nullptr && rec->opportunistic;
    r.start_time = now;
    if (rec != nullptr && IsAttemptRunningState(rec->job.state())) {
      const loom::v1::JobSpec& spec = rec->job.spec();
      r.queue = queue_of(spec);
      r.priority = priority_of(spec);
      r.preemptible = IsPreemptible(spec);
      r.start_time = LastTransitionTo(rec->job, loom::v1::SCHEDULED).value_or(now);
      r.last_preempted =
          LastTransitionTo(rec->job, loom::v1::PREEMPTED).value_or(absl::InfinitePast());
      if (spec.scheduling().max_runtime_seconds() > 0) {
        r.expected_end = r.start_time + absl::Seconds(spec.scheduling().max_runtime_seconds());
      } else if (const absl::Duration left = EstimatedRemainingRuntime(rec->job);
                 left != absl::InfiniteDuration()) {
        r.expected_end = now + left;
      }
      r.steps_since_checkpoint =
          std::max<int64_t>(0, rec->attempt_last_step - rec->newest_checkpoint_step);
      if (rec->preempting) {
        r.saving = true;
        r.preempted_for = rec->preempting->for_job_id;
      }
    } else {
      // Ranks of an ended or requeued attempt still exiting: their slots
      // free themselves; nothing to preempt.
      r.queue = rec != nullptr ? queue_of(rec->job.spec()) : std::string(scheduling::kDefaultQueue);
      r.preemptible = false;
      r.saving = true;
    }
    for (const auto& [worker_id, amount] : workers) r.placement.push_back({worker_id, amount});
    snapshot.running.push_back(std::move(r));
  }
  // A job waiting for its previous attempt's ranks (below) keeps its claim:
  // no job of lower priority is admitted ahead of it meanwhile.
  const JobRecord* held_back = nullptr;
  for (const auto& [position, jid] : jobs_->pending()) {
    JobRecord& rec = *jobs_->Find(jid);
    if (!IsQueuedJobState(rec.job.state())) continue;
    // A restarted job whose previous attempt may still run keeps its place
    // at the head: the jobs behind it wait as they did under FIFO.
    if (!rec.live.empty()) {
      rec.job.set_reason(absl::StrCat("waiting for ", rec.live.size(),
                                      " rank(s) of the previous attempt to exit"));
      held_back = &rec;
      break;
    }
    if (now < rec.not_before) {
      schedule_->RequestBy(rec.not_before);
      rec.job.set_reason(absl::StrFormat(
          "waiting %.1fs more for the previous attempt's ranks to be fenced (a lost worker's "
          "lease)",
          absl::ToDoubleSeconds(rec.not_before - now)));
      held_back = &rec;
      break;
    }
    const loom::v1::JobSpec& spec = rec.job.spec();
    const GangRequest gang = GangRequestOf(spec);
    scheduling::PendingJob p;
    p.id = jid;
    p.queue = queue_of(spec);
    p.priority = priority_of(spec);
    for (int ranks : RanksPerWorker(gang)) {
      p.gang.per_worker.push_back({ranks, gang.gpu_per_rank ? int64_t{ranks} : int64_t{0}});
    }
    p.submit_time =
        rec.job.history_size() > 0 ? absl::FromUnixMillis(rec.job.history(0).time_unix_ms()) : now;
    p.expected_runtime = spec.scheduling().max_runtime_seconds() > 0
                             ? absl::Seconds(spec.scheduling().max_runtime_seconds())
                             : EstimatedRemainingRuntime(rec.job);
    p.preemptible = IsPreemptible(spec);
    snapshot.pending.push_back(std::move(p));
  }
  if (held_back != nullptr) {
    // E.g. a preemptor whose first start failed its rendezvous, placed
    // again once those ranks exit: the job it preempted, ahead of it in
    // submission order, does not take the slots back meanwhile.
    const int claim = priority_of(held_back->job.spec());
    auto lower =
        std::remove_if(snapshot.pending.begin(), snapshot.pending.end(),
                       [&](const scheduling::PendingJob& p) { return p.priority < claim; });
    for (auto it = lower; it != snapshot.pending.end(); ++it) {
      jobs_->Find(it->id)->job.set_reason(
          absl::StrCat("waiting behind job ", held_back->job.id(), " (priority ", claim,
                       "), which waits for its previous attempt's ranks"));
    }
    snapshot.pending.erase(lower, snapshot.pending.end());
  }
  if (snapshot.pending.empty()) return;

  fair_share_.set_half_life(queues_->fair_share_half_life);
  fair_share_.Observe(now, scheduling::QueueUsage(snapshot));
  const scheduling::Decisions decisions = policy_.Decide(snapshot, fair_share_, now);

  for (const scheduling::Preemption& preemption : decisions.preemptions) {
    if (JobRecord* victim = jobs_->Find(preemption.victim_id);
        victim != nullptr && preemptor_ != nullptr) {
      preemptor_->Preempt(*victim, preemption);
    }
  }

  // The placement's own words for a gang that does not fit (which resource
  // is short, and where), once per gang shape this cycle.
  std::map<std::tuple<int, int, int, int, bool>, std::string> shortage;
  for (const scheduling::Waiting& w : decisions.waiting) {
    JobRecord& rec = *jobs_->Find(w.job_id);
    rec.job.set_queue_position(w.position);
    rec.job.set_wait_reason(scheduling::WaitReasonName(w.reason));
    std::string why = w.message;
    if (w.reason == scheduling::WaitReason::kGangDoesNotFit) {
      const GangRequest gang = GangRequestOf(rec.job.spec());
      const auto shape = std::make_tuple(gang.workers, gang.layout.data, gang.layout.tensor,
                                         gang.layout.pipeline, gang.gpu_per_rank);
      auto it = shortage.find(shape);
      if (it == shortage.end()) {
        auto placement = PlaceGang(gang, workers_->Offers(gang.gpu_per_rank));
        it = shortage
                 .emplace(shape,
                          placement.ok() ? w.message : std::string(placement.status().message()))
                 .first;
      }
      why = it->second;
    }
    if (rec.job.reason() != why) rec.job.set_reason(why);
  }
  bool all_placed = true;  // every admission of this cycle started its ranks
  for (const scheduling::Admission& admission : decisions.admissions) {
    const std::string& jid = admission.job_id;
    JobRecord& rec = *jobs_->Find(jid);
    // Where the ranks go is the scheduler's (controller/admission/scheduler.h): the
    // planner's placement over the workers the policy chose.
    const GangRequest gang = GangRequestOf(rec.job.spec());
    std::set<std::string> chosen;
    for (const scheduling::WorkerShare& share : admission.placement) chosen.insert(share.worker_id);
    std::vector<WorkerOffer> offers;
    for (WorkerOffer& offer : workers_->Offers(gang.gpu_per_rank)) {
      if (chosen.count(offer.info.id()) > 0) offers.push_back(std::move(offer));
    }
    auto placement = PlaceGang(gang, offers);
    if (!placement.ok()) {
      const std::string why(placement.status().message());
      if (rec.job.reason() != why) rec.job.set_reason(why);
      schedule_->Request();  // the policy's view and the placement's differ: look again
      all_placed = false;
      continue;
    }
    // Rank 0's worker hosts the rendezvous.
    Worker* head = workers_->Find(placement->workers[placement->ranks[0].worker].id());
    if (head->rendezvous_port == 0) {
      rec.job.set_reason("waiting for a rendezvous port from worker " + head->info.id());
      all_placed = false;
      continue;
    }
    int master_port = head->rendezvous_port;
    head->rendezvous_port = 0;  // used; the worker reports a fresh one next heartbeat
    const int n_ranks = gang.layout.world_size();
    rec.job.clear_ranks();
    // After a slow-rank re-plan: the stages split for these nodes' speeds.
    {
      std::vector<std::pair<std::string, int>> node_stage;
      for (const PlacedRank& p : placement->ranks) {
        node_stage.push_back({placement->workers[p.worker].node(), p.at.pp});
      }
      rec.stage_layers_now = StageLayersForPlacement(rec, node_stage);
    }
    // What retention must keep for other jobs (their init_from).
    const std::map<int64_t, std::string> holds = jobs_->CheckpointHolds(jid);
    for (const PlacedRank& p : placement->ranks) {
      Worker* w = workers_->Find(placement->workers[p.worker].id());
      const int rank = p.rank;
      const int gpu = p.gpu;
      auto* a = rec.job.add_ranks();
      a->set_rank(rank);
      a->set_worker_id(w->info.id());
      a->set_node(w->info.node());
      a->set_dp(p.at.dp);
      a->set_pp(p.at.pp);
      a->set_tp(p.at.tp);
      a->set_rack(RackLabel(w->info));
      if (gpu >= 0) a->set_gpu(gpu);
      workers_->HoldSlot(*w, {jid, rank, gpu});
      rec.live.insert({w->info.id(), rank});
      loom::v1::WorkerCommand cmd;
      auto* start = cmd.mutable_start();
      start->set_job_id(jid);
      *start->mutable_spec() = rec.job.spec();
      start->set_rank(rank);
      start->set_world_size(n_ranks);
      start->set_master_addr(head->info.address());
      start->set_master_port(master_port);
      start->set_checkpoint_dir(rec.job.spec().checkpoint().dir());
      for (const auto& [step, why] : holds) (*start->mutable_held_checkpoints())[step] = why;
      if (rank == 0 && !rec.job.spec().checkpoint().remote().empty()) {
        for (loom::v1::CheckpointInfo& c : catalog_->PendingUploads(jid, kMaxPendingUploads)) {
          *start->add_pending_uploads() = std::move(c);
        }
      }
      for (int blocks : rec.stage_layers_now) {
        start->mutable_spec()->mutable_parallelism()->add_stage_layers(blocks);
      }
      start->set_generation(rec.job.generation());
      start->set_resume_step(rec.job.resume_step());
      *start->mutable_skip_batches() = rec.job.skip_batches();
      if (gpu >= 0) start->set_gpu(gpu);
      w->pending_commands.push_back(std::move(cmd));
    }
    std::map<int, std::string>& placed = rec.placements[rec.job.generation()];
    for (const auto& r : rec.job.ranks()) placed[r.rank()] = r.node();
    while (rec.placements.size() > kMaxPlacementsKept) rec.placements.erase(rec.placements.begin());
    rec.job.clear_queue_position();
    rec.job.clear_wait_reason();
    rec.opportunistic = admission.opportunistic;
    if (rec.job.state() == loom::v1::PREEMPTED) {
      // (Or the in-memory snapshot the preemption counted from, when its
      // ranks stopped without a save: the newest PREEMPTED event's.)
      const int64_t newest_checkpoint = catalog_->NewestGoodStep(rec.job.id(), -1);
      int64_t checkpoint = newest_checkpoint;
      for (int i = rec.job.events_size() - 1; i >= 0; --i) {
        if (rec.job.events(i).kind() != loom::v1::RecoveryEvent::PREEMPTED) continue;
        checkpoint = std::max(checkpoint, rec.job.events(i).checkpoint_step());
        break;
      }
      const std::optional<absl::Time> since = LastTransitionTo(rec.job, loom::v1::PREEMPTED);
      loom::v1::RecoveryEvent resumed;
      resumed.set_kind(loom::v1::RecoveryEvent::RESUMED);
      resumed.set_checkpoint_step(checkpoint);
      resumed.set_step(checkpoint);
      resumed.set_generation(rec.job.generation());
      resumed.set_message(
          absl::StrFormat("placed again after %.1fs in its queue; its ranks resume from %s",
                          since.has_value() ? absl::ToDoubleSeconds(now - *since) : 0.0,
                          checkpoint > newest_checkpoint
                              ? absl::StrCat("the in-memory snapshot at step ", checkpoint)
                          : checkpoint > 0 ? absl::StrCat("the checkpoint at step ", checkpoint)
                                           : std::string("the start")));
      jobs_->AddEvent(rec, resumed);
    }
    jobs_->Transition(rec, loom::v1::SCHEDULED, DescribePlacement(gang, *placement));
  }
  // (An admitted job still waiting to be placed keeps its room.)
  if (all_placed && replanner_ != nullptr && replanner_->ShrinkWaiting(snapshot, decisions)) {
    schedule_->Request();
  }
}

loom::v1::ListQueuesResponse Admitter::ListQueues() const {
  auto limit = [](const scheduling::Resources& r, loom::v1::QueueLimit* out) {
    out->set_slots(r.slots >= scheduling::kUnlimited ? -1 : r.slots);
    out->set_gpus(r.gpus >= scheduling::kUnlimited ? -1 : r.gpus);
  };
  auto queue_of = [](const loom::v1::JobSpec& spec) {
    const std::string& name = spec.scheduling().queue();
    return name.empty() ? std::string(scheduling::kDefaultQueue) : name;
  };
  // What placed jobs hold, from the workers' rank slots (as Schedule).
  std::map<std::string, scheduling::Resources> used;
  std::map<std::string, std::set<std::string>> running;
  for (const loom::v1::WorkerInfo& info : workers_->Infos()) {
    if (!info.alive()) continue;
    for (const RankSlot& slot : workers_->Find(info.id())->ranks) {
      const JobRecord* rec = jobs_->Find(slot.job_id);
      const std::string queue =
          rec != nullptr ? queue_of(rec->job.spec()) : std::string(scheduling::kDefaultQueue);
      used[queue] += scheduling::Resources{1, slot.gpu >= 0 ? 1 : 0};
      running[queue].insert(slot.job_id);
    }
  }
  std::map<std::string, int> pending;
  for (const auto& [position, jid] : jobs_->pending()) {
    if (const JobRecord* rec = jobs_->Find(jid); rec != nullptr)
      ++pending[queue_of(rec->job.spec())];
  }
  loom::v1::ListQueuesResponse resp;
  for (const scheduling::QueueSpec& q : queues_->queues) {
    loom::v1::QueueInfo* info = resp.add_queues();
    info->set_name(q.name);
    info->set_cohort(q.cohort);
    limit(q.nominal_quota, info->mutable_nominal_quota());
    limit(q.borrowing_limit, info->mutable_borrowing_limit());
    info->set_weight(q.weight);
    info->set_preemption(q.preemption);
    limit(used[q.name], info->mutable_used());
    info->set_pending_jobs(pending[q.name]);
    info->set_running_jobs(static_cast<int>(running[q.name].size()));
  }
  for (const auto& [name, value] : queues_->priority_classes) {
    (*resp.mutable_priority_classes())[name] = value;
  }
  resp.set_fair_share_half_life_seconds(absl::ToDoubleSeconds(queues_->fair_share_half_life));
  resp.set_preemption_grace_seconds(absl::ToDoubleSeconds(queues_->preemption_grace));
  resp.set_min_run_time_seconds(absl::ToDoubleSeconds(queues_->min_run_time));
  return resp;
}

}  // namespace loom::controller
