#include "controller/jobs/job_table.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/scheduling/queue_config.h"

namespace loom::controller {
namespace {

using loom::v1::Job;
using loom::v1::JobState;

// The sequence number in a job id "<name>-<seq>" (ids never repeat).
int64_t JobSequenceOf(const std::string& id) {
  const size_t dash = id.rfind('-');
  int64_t seq = 0;
  if (dash == std::string::npos || !absl::SimpleAtoi(id.substr(dash + 1), &seq)) return 0;
  return seq;
}

void AddRecoveryCounts(const Job& job, RecoveryTotals* t) {
  t->restarts += job.restarts();
  t->rollbacks += job.rollbacks();
  t->preemptions += job.preemptions();
  for (const auto& e : job.events()) {
    t->spikes += e.kind() == loom::v1::RecoveryEvent::SPIKE ? 1 : 0;
  }
}

}  // namespace

absl::Status JobTable::Load() {
  absl::StatusOr<std::vector<Job>> jobs = store_->LoadJobs();
  if (!jobs.ok()) return jobs.status();
  return Load(*std::move(jobs));
}

absl::Status JobTable::Load(std::vector<Job> jobs) {
  absl::StatusOr<int64_t> max_seq = store_->MaxJobSequence();
  if (!max_seq.ok()) return max_seq.status();
  next_seq_ = *max_seq + 1;
  for (Job& job : jobs) {
    const std::string id = job.id();
    const JobState state = job.state();
    JobRecord& rec = Add(id);
    rec.job = std::move(job);
    rec.exited_ok.insert(rec.job.finished_ranks().begin(), rec.job.finished_ranks().end());
    Index(id, loom::v1::JOB_STATE_UNSPECIFIED, state);
  }
  BackfillEventLog();
  return absl::OkStatus();
}

void JobTable::RecordEvent(JobRecord& rec, loom::v1::JobEvent event) {
  event.clear_job();
  Store::LoggedEvent e;
  e.job_id = rec.job.id();
  e.idx = rec.job.events_logged() + 1;
  e.kind = event.has_transition()   ? Store::kLoggedTransition
           : event.has_checkpoint() ? Store::kLoggedCheckpoint
                                    : Store::kLoggedRecovery;
  e.time_unix_ms = event.time_unix_ms();
  e.payload = event.SerializeAsString();
  rec.job.set_events_logged(e.idx);
  rec.unstored_events.push_back(std::move(e));
}

void JobTable::EventsStored(JobRecord& rec, int64_t through) {
  auto& v = rec.unstored_events;
  v.erase(std::remove_if(v.begin(), v.end(),
                         [through](const Store::LoggedEvent& e) { return e.idx <= through; }),
          v.end());
}

int64_t JobTable::NewestUnstoredEvent(const JobRecord& rec) {
  return rec.unstored_events.empty() ? 0 : rec.unstored_events.back().idx;
}

int JobTable::BackfillEventLog() {
  int changed = 0;
  for (const std::string& id : order_) {
    JobRecord& rec = records_.at(id);
    const Job& job = rec.job;
    if (job.events_logged() > 0 || (job.history_size() == 0 && job.events_size() == 0)) continue;
    // Merged by time; within one millisecond a recovery event goes first,
    // as the controller records the event before the transition it causes.
    std::vector<loom::v1::JobEvent> merged;
    int t = 0, r = 0;
    while (t < job.history_size() || r < job.events_size()) {
      loom::v1::JobEvent e;
      const bool take_recovery =
          r < job.events_size() && (t >= job.history_size() ||
                                    job.events(r).time_unix_ms() <= job.history(t).time_unix_ms());
      if (take_recovery) {
        e.set_time_unix_ms(job.events(r).time_unix_ms());
        *e.mutable_recovery() = job.events(r++);
      } else {
        e.set_time_unix_ms(job.history(t).time_unix_ms());
        *e.mutable_transition() = job.history(t++);
      }
      merged.push_back(std::move(e));
    }
    for (loom::v1::JobEvent& e : merged) RecordEvent(rec, std::move(e));
    backfilled_.insert(id);
    changed += 1;
  }
  if (changed > 0) {
    std::cerr << "loom-controller: " << changed
              << " job(s) stored before the event log: their history is added to it" << std::endl;
  }
  return changed;
}

std::string JobTable::NewJobId(const std::string& name) {
  return absl::StrCat(name, "-", next_seq_++);
}

JobRecord& JobTable::Add(const std::string& id) {
  JobRecord& rec = records_[id];
  position_[id] = order_.size();
  order_.push_back(id);
  return rec;
}

absl::Status JobTable::StoreNew(JobRecord& rec) {
  rec.job.set_updated_unix_ms(clock_->NowUnixMillis());
  const absl::Status s = store_->PutJob(rec.job, rec.job.history_size(), rec.unstored_events);
  if (s.ok()) {
    rec.unstored_events.clear();
    return s;
  }
  const std::string id = rec.job.id();
  Index(id, rec.job.state(), loom::v1::JOB_STATE_UNSPECIFIED);
  Remove(id);
  return absl::UnavailableError(
      absl::StrCat("could not record the job durably, nothing was submitted: ", s.message()));
}

void JobTable::Remove(const std::string& id) {
  auto at = position_.find(id);
  if (at != position_.end()) {
    // Only the newest job is ever taken back, so positions stay dense.
    if (at->second + 1 == order_.size()) order_.pop_back();
    position_.erase(at);
  }
  records_.erase(id);
}

JobRecord* JobTable::Find(const std::string& id) {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second;
}

const JobRecord* JobTable::Find(const std::string& id) const {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second;
}

absl::StatusOr<JobRecord*> JobTable::Lookup(const std::string& id) {
  JobRecord* rec = Find(id);
  if (rec == nullptr) return absl::NotFoundError(absl::StrCat("no job with id \"", id, "\""));
  return rec;
}

const loom::v1::StateTransition& JobTable::RecordTransition(JobRecord& rec, JobState to,
                                                            const std::string& reason) {
  Job& job = rec.job;
  if (!IsLegalTransition(job.state(), to)) {
    illegal_transitions_ += 1;
    std::cerr << "loom-controller: job " << job.id() << ": "
              << DescribeIllegalTransition(job.state(), to) << " (recorded anyway: " << reason
              << ")" << std::endl;
  }
  loom::v1::StateTransition* t = job.add_history();
  t->set_from(job.state());
  t->set_to(to);
  t->set_time_unix_ms(clock_->NowUnixMillis());
  t->set_reason(reason);
  const JobState from = job.state();
  job.set_state(to);
  job.set_reason(reason);
  Index(job.id(), from, to);
  loom::v1::JobEvent e;
  e.set_time_unix_ms(t->time_unix_ms());
  *e.mutable_transition() = *t;
  RecordEvent(rec, std::move(e));
  for (JobTableListener* l : listeners_) l->OnTransition(rec, to);
  return *t;
}

void JobTable::Transition(JobRecord& rec, JobState to, const std::string& reason) {
  RecordTransition(rec, to, reason);
  Persist(rec, 1);
}

void JobTable::Stop(JobRecord& rec, JobState to, const std::string& reason) {
  if (ranks_ != nullptr) ranks_->Stop(rec, reason, "");
  Transition(rec, to, reason);
}

void JobTable::Requeue(JobRecord& rec, const std::string& reason, JobState to) {
  if (ranks_ != nullptr) ranks_->Stop(rec, reason, "");
  rec.pending_failure.reset();
  rec.preempting.reset();
  rec.opportunistic = false;
  rec.exited_ok.clear();
  rec.job.clear_finished_ranks();
  rec.running_seen.clear();
  rec.attempt_last_step = -1;
  rec.attempt_snapshot_steps.clear();
  rec.adopt_deadline = absl::InfinitePast();
  rec.adopted.clear();
  rec.across_controller_restart = false;
  rec.job.clear_ranks();
  rec.job.set_generation(rec.job.generation() + 1);
  Transition(rec, to, reason);
}

bool JobTable::RankFinished(JobRecord& rec, int rank) {
  if (!rec.exited_ok.insert(rank).second) return false;
  rec.job.add_finished_ranks(rank);
  if (static_cast<int>(rec.exited_ok.size()) < rec.job.ranks_size()) Persist(rec, 0);
  return true;
}

void JobTable::AddEvent(JobRecord& rec, loom::v1::RecoveryEvent event) {
  event.set_time_unix_ms(clock_->NowUnixMillis());
  *rec.job.add_events() = event;
  loom::v1::JobEvent e;
  e.set_time_unix_ms(event.time_unix_ms());
  *e.mutable_recovery() = std::move(event);
  RecordEvent(rec, std::move(e));
}

void JobTable::Persist(JobRecord& rec, int new_transitions) {
  rec.unstored_transitions += new_transitions;
  rec.job.set_updated_unix_ms(clock_->NowUnixMillis());
  const int64_t through = NewestUnstoredEvent(rec);
  AfterWrite(rec, store_->PutJob(rec.job, rec.unstored_transitions, rec.unstored_events), through);
}

void JobTable::AfterWrite(JobRecord& rec, const absl::Status& s, int64_t through) {
  if (s.ok()) {
    rec.unstored_transitions = 0;
    EventsStored(rec, through);
    backfilled_.erase(rec.job.id());
    if (unpersisted_.erase(rec.job.id()) > 0) {
      std::cerr << "loom-controller: job " << rec.job.id() << " is recorded durably again"
                << std::endl;
    }
    return;
  }
  write_failures_ += 1;
  if (unpersisted_.insert(rec.job.id()).second) {
    std::cerr << "loom-controller: could not record job " << rec.job.id()
              << " durably (kept in memory, written again every tick until the store takes "
                 "it): "
              << s << std::endl;
  }
}

void JobTable::MarkUnpersisted(const std::string& id) {
  write_failures_ += 1;
  unpersisted_.insert(id);
}

void JobTable::RetryUnpersisted() {
  struct InLine {
    JobRecord* rec;
    int64_t through;
    Store::Ticket ticket;
  };
  std::vector<InLine> writes;
  std::set<std::string> ids = unpersisted_;
  ids.insert(backfilled_.begin(), backfilled_.end());
  for (const std::string& id : ids) {
    JobRecord* rec = Find(id);
    if (rec == nullptr) {
      unpersisted_.erase(id);
      backfilled_.erase(id);
      continue;
    }
    rec->job.set_updated_unix_ms(clock_->NowUnixMillis());
    writes.push_back(
        {rec, NewestUnstoredEvent(*rec),
         store_->Enqueue(&rec->job, rec->unstored_transitions, {}, id, rec->unstored_events)});
  }
  for (InLine& w : writes) AfterWrite(*w.rec, store_->Wait(w.ticket), w.through);
}

void JobTable::Index(const std::string& id, JobState from, JobState to) {
  if (from == to) return;
  if (from != loom::v1::JOB_STATE_UNSPECIFIED) state_counts_[from] -= 1;
  if (to != loom::v1::JOB_STATE_UNSPECIFIED) state_counts_[to] += 1;
  auto at = position_.find(id);
  const size_t position = at == position_.end() ? order_.size() : at->second;
  if (IsQueuedJobState(from)) pending_.erase({position, id});
  if (IsQueuedJobState(to)) pending_.insert({position, id});
  if (to == loom::v1::JOB_STATE_UNSPECIFIED) {
    unfinished_.erase(id);
  } else if (IsTerminalJobState(to)) {
    if (unfinished_.erase(id) > 0 || from == loom::v1::JOB_STATE_UNSPECIFIED) {
      // Its recovery counts stop changing: add them to the finished part.
      if (const JobRecord* rec = Find(id)) AddRecoveryCounts(rec->job, &finished_totals_);
      // (Jobs found ended at Load were thinned when they ended.)
      if (from != loom::v1::JOB_STATE_UNSPECIFIED) to_thin_.push_back(id);
    }
  } else {
    unfinished_.insert(id);
  }
}

RecoveryTotals JobTable::Totals() const {
  RecoveryTotals t = finished_totals_;
  for (const std::string& id : unfinished_) AddRecoveryCounts(records_.at(id).job, &t);
  return t;
}

std::vector<std::string> JobTable::TakeEndedToThin() {
  std::vector<std::string> out;
  out.swap(to_thin_);
  return out;
}

std::vector<Job> JobTable::List(const std::set<JobState>& states, int limit) const {
  std::vector<Job> out;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const Job& job = records_.at(*it).job;
    if (!states.empty() && !states.count(job.state())) continue;
    out.push_back(job);
    if (limit > 0 && static_cast<int>(out.size()) >= limit) break;
  }
  return out;
}

bool JobFilter::Matches(const Job& job) const {
  if (!states.empty() && !states.count(job.state())) return false;
  if (!submitted_by.empty() && job.submitted_by() != submitted_by) return false;
  if (!queue.empty()) {
    const std::string& named = job.spec().scheduling().queue();
    if (named != queue && !(named.empty() && queue == loom::scheduling::kDefaultQueue))
      return false;
  }
  return name_contains.empty() || job.spec().name().find(name_contains) != std::string::npos ||
         job.id().find(name_contains) != std::string::npos;
}

std::vector<Job> JobTable::ListPage(const JobFilter& filter, int page_size, int64_t before_seq,
                                    bool full, int64_t* next_before_seq) const {
  std::vector<Job> out;
  *next_before_seq = 0;
  // order_ is in submission order, so sequences increase along it.
  auto it = order_.rbegin();
  if (before_seq > 0) {
    it = std::find_if(order_.rbegin(), order_.rend(),
                      [&](const std::string& id) { return JobSequenceOf(id) < before_seq; });
  }
  for (; it != order_.rend(); ++it) {
    const Job& job = records_.at(*it).job;
    if (!filter.Matches(job)) continue;
    if (static_cast<int>(out.size()) >= page_size) {
      *next_before_seq = JobSequenceOf(out.back().id());
      break;
    }
    if (full) {
      out.push_back(job);
      continue;
    }
    Job brief;
    brief.set_id(job.id());
    brief.mutable_spec()->set_name(job.spec().name());
    *brief.mutable_spec()->mutable_schedule() = job.spec().schedule();
    *brief.mutable_spec()->mutable_resources() = job.spec().resources();
    if (job.spec().has_scheduling()) {
      brief.mutable_spec()->mutable_scheduling()->set_queue(job.spec().scheduling().queue());
    }
    brief.set_state(job.state());
    brief.set_reason(job.reason());
    brief.set_created_unix_ms(job.created_unix_ms());
    brief.set_updated_unix_ms(job.updated_unix_ms());
    brief.set_submitted_by(job.submitted_by());
    *brief.mutable_summary() = job.summary();
    brief.set_restarts(job.restarts());
    brief.set_rollbacks(job.rollbacks());
    brief.set_operator_rollbacks(job.operator_rollbacks());
    brief.set_generation(job.generation());
    *brief.mutable_ranks() = job.ranks();
    out.push_back(std::move(brief));
  }
  return out;
}

std::map<int64_t, std::string> CheckpointHolds(const loom::v1::Job& source,
                                               const std::vector<const loom::v1::Job*>& jobs) {
  std::map<int64_t, std::string> holds;
  const std::string& dir = source.spec().checkpoint().dir();
  for (const loom::v1::Job* job : jobs) {
    const loom::v1::InitFrom& from = job->spec().init_from();
    if (job->id() == source.id() || IsTerminalJobState(job->state()) ||
        job->summary().checkpoints_written() > 0) {
      continue;
    }
    // Named by job (resolved at submit to its step and path), or by a path
    // inside this job's checkpoint directory.
    int64_t step = 0;
    if (from.job() == source.id()) {
      step = from.step();
    } else if (!dir.empty() && absl::StartsWith(from.path(), dir + "/step-") &&
               !absl::SimpleAtoi(from.path().substr(dir.size() + 6), &step)) {
      step = 0;
    }
    if (step <= 0) continue;
    std::string& why = holds[step];
    why = absl::StrCat(why, why.empty() ? "" : "; ", "init_from of ", job->id(), " (",
                       loom::v1::JobState_Name(job->state()),
                       "), which has no checkpoint of its own yet");
  }
  return holds;
}

std::map<int64_t, std::string> JobTable::CheckpointHolds(const std::string& job_id) const {
  const JobRecord* source = Find(job_id);
  if (source == nullptr) return {};
  std::vector<const loom::v1::Job*> jobs;
  for (const auto& [id, rec] : records_) jobs.push_back(&rec.job);
  return loom::controller::CheckpointHolds(source->job, jobs);
}

}  // namespace loom::controller
