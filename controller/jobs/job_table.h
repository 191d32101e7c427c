// The job table: every job's record in memory, in submission order, with
// the indexes the periodic checks read (the PENDING queue, the unfinished
// jobs, counts by state, recovery totals of ended jobs), and its durable
// copy in the Store. The only way a job changes state is through this
// table (Transition, Requeue), checked against jobs/job_state_machine.h,
// recorded with time and reason, and appended to the event log in the
// transaction that writes the job. The subsystems (admission/, preemption/,
// recovery/, elastic/, slow_ranks/, workers/, progress/) act on jobs only
// through it.
//
// Durable writes: Persist writes a record; a write that fails is handled
// here, not by callers: the change stands in memory, the job is marked
// unpersisted, logged once and counted (write_failures), and every
// RetryUnpersisted (each controller tick) writes it again, with every
// transition not yet stored, until the store takes it.
//
// Not thread-safe: the controller's lock (JobManager's) guards it.
#ifndef LOOM_CONTROLLER_JOBS_JOB_TABLE_H_
#define LOOM_CONTROLLER_JOBS_JOB_TABLE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "controller/jobs/job_record.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/jobs/rank_commands.h"
#include "controller/recovery/slow_rank_detector.h"
#include "controller/recovery/spike_detector.h"
#include "controller/store/store.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

// Which jobs JobTable::ListPage lists; the default, every one.
struct JobFilter {
  std::set<loom::v1::JobState> states;  // empty: any state
  std::string queue;                    // spec.scheduling.queue; "default" matches none named
  std::string submitted_by;             // exactly this user
  std::string name_contains;            // a substring of the name or the id
  bool Matches(const loom::v1::Job& job) const;
};

// Hears of transitions as they are recorded (under the controller's lock,
// in registration order); must not change the job.
class JobTableListener {
 public:
  virtual ~JobTableListener() = default;
  virtual void OnTransition(const JobRecord& rec, loom::v1::JobState to) = 0;
};

// The checkpoints of `source` that retention must keep for other jobs, by
// step, and why: those that the init_from of an unfinished job among
// `jobs` names (by job, or by a path in source's checkpoint directory)
// while that job has no checkpoint of its own (its restarts would start
// from it).
std::map<int64_t, std::string> CheckpointHolds(const loom::v1::Job& source,
                                               const std::vector<const loom::v1::Job*>& jobs);

class JobTable {
 public:
  // `store`, `clock` and `ranks` must outlive the table; `ranks` may be
  // null only where nothing is requeued or ended (Requeue, Stop).
  JobTable(Store* store, const Clock* clock, RankCommands* ranks = nullptr)
      : store_(store), clock_(clock), ranks_(ranks) {}
  JobTable(const JobTable&) = delete;
  JobTable& operator=(const JobTable&) = delete;

  // Loads every stored job into an empty catalog (a controller start) and
  // continues the id sequence after the largest stored. Jobs found ended
  // count in the totals and are not thinned again. The store's error if it
  // cannot be read.
  absl::Status Load();
  // The same with the jobs given (a standby's warm copy of every stored job,
  // oldest first, as Store::LoadJobs orders them) instead of reading them.
  absl::Status Load(std::vector<loom::v1::Job> jobs);

  // "<name>-<seq>"; sequences never repeat (across restarts too).
  std::string NewJobId(const std::string& name);
  // A new record for `id`, last in submission order, in no state yet
  // (JOB_STATE_UNSPECIFIED): give it its first transition, then StoreNew.
  JobRecord& Add(const std::string& id);
  // Writes a record just added and given its first transition; if the
  // store fails, takes the record back out (the job was never submitted)
  // and returns UNAVAILABLE saying so.
  absl::Status StoreNew(JobRecord& rec);

  // Null when there is no such job.
  JobRecord* Find(const std::string& id);
  const JobRecord* Find(const std::string& id) const;
  // NOT_FOUND "no job with id ..." when there is no such job.
  absl::StatusOr<JobRecord*> Lookup(const std::string& id);
  // Every record by id.
  std::map<std::string, JobRecord>& records() { return records_; }
  const std::map<std::string, JobRecord>& records() const { return records_; }
  // CheckpointHolds over every job in the table.
  std::map<int64_t, std::string> CheckpointHolds(const std::string& job_id) const;

  // Appends the transition to `rec`'s history (time now), sets its state
  // and reason and the indexes; in memory only (Persist writes it). A
  // transition the state machine (jobs/job_state_machine.h) does not allow
  // is a controller bug: it is recorded all the same, so that the history
  // stays whole, logged and counted (illegal_transitions).
  const loom::v1::StateTransition& RecordTransition(JobRecord& rec, loom::v1::JobState to,
                                                    const std::string& reason);
  // RecordTransition, then Persist: the change is on disk (or kept for a
  // retry, see the file comment) when it returns; watchers hear of it from
  // the event log once the write commits.
  void Transition(JobRecord& rec, loom::v1::JobState to, const std::string& reason);
  // Stops the attempt's ranks and ends it (Transition to `to`).
  void Stop(JobRecord& rec, loom::v1::JobState to, const std::string& reason);
  // Ends the current attempt and queues the job again: stops its ranks,
  // resets the per-attempt state, bumps the generation and moves it to `to`
  // (PENDING, or PREEMPTED for a preempted job).
  void Requeue(JobRecord& rec, const std::string& reason,
               loom::v1::JobState to = loom::v1::PENDING);
  // Rank `rank` of the current attempt finished training: recorded with
  // the job (Job.finished_ranks) and, unless it is the attempt's last rank
  // (whose exit ends the job with a write of its own), written now, so that
  // a controller that takes over knows it. False: already recorded.
  bool RankFinished(JobRecord& rec, int rank);
  // Whether `id`'s newest state is not yet on disk (a write failed and
  // waits for RetryUnpersisted): what the controller acknowledges must be.
  bool Unpersisted(const std::string& id) const { return unpersisted_.count(id) > 0; }
  // Appends a recovery event (time now) to the job's events and its event
  // log, written with the job's next write.
  void AddEvent(JobRecord& rec, loom::v1::RecoveryEvent event);
  void AddListener(JobTableListener* listener) { listeners_.push_back(listener); }
  // Gives `event` (a transition, recovery event or committed checkpoint;
  // its `job` is not kept) the job's next event log number and keeps it on
  // the record until a write carries it to the log, in the transaction
  // that writes the job as it stands then. RecordTransition calls it.
  void RecordEvent(JobRecord& rec, loom::v1::JobEvent event);
  // The entries a write that carried `rec.unstored_events` up to idx
  // `through` stored: dropped from the record (later ones stay).
  static void EventsStored(JobRecord& rec, int64_t through);
  // The idx of the newest entry a write of `rec` would carry now (0: none).
  static int64_t NewestUnstoredEvent(const JobRecord& rec);
  // Jobs stored before the event log existed (events_logged 0, with a
  // history): their transitions and recovery events are given numbers now,
  // in time order, and written with the jobs at the next RetryUnpersisted
  // (one transaction for all, not counted as a failed write). Called by
  // Load; returns how many jobs it changed.
  int BackfillEventLog();

  // Writes `rec` (its updated time set now) with its `new_transitions`
  // newest history entries added since the last write and its unstored
  // event log entries; see the file comment for a failed write.
  void Persist(JobRecord& rec, int new_transitions);
  // A write of `id` outside Persist failed (a step report's transaction):
  // counted, and the job written again by RetryUnpersisted.
  void MarkUnpersisted(const std::string& id);
  // Writes every job whose newest state is not stored (each in line first,
  // so that they share transactions, then waited for).
  void RetryUnpersisted();
  int64_t write_failures() const { return write_failures_; }
  int64_t illegal_transitions() const { return illegal_transitions_; }

  // PENDING and PREEMPTED jobs by submission position: the scheduler's queue.
  const std::set<std::pair<size_t, std::string>>& pending() const { return pending_; }
  // Jobs not ended.
  const std::set<std::string>& unfinished() const { return unfinished_; }
  const std::map<loom::v1::JobState, int>& state_counts() const { return state_counts_; }
  RecoveryTotals Totals() const;
  // Jobs that ended since the last call, whose step series are to be
  // thinned.
  std::vector<std::string> TakeEndedToThin();

  // Jobs in `states` (all when empty), newest first; at most `limit` (all
  // when <= 0).
  std::vector<loom::v1::Job> List(const std::set<loom::v1::JobState>& states, int limit) const;
  // One page of those `filter` matches: those with a sequence below
  // `before_seq` (0: from the newest), at most `page_size`; `full` false:
  // the fields a listing shows (no spec beyond name, schedule, resources and
  // queue; no plan, history or events). *next_before_seq: where the next
  // page starts, 0 at the end.
  std::vector<loom::v1::Job> ListPage(const JobFilter& filter, int page_size, int64_t before_seq,
                                      bool full, int64_t* next_before_seq) const;

 private:
  // Keeps pending_, unfinished_, state_counts_ and finished_totals_ in step
  // with a job moving from `from` to `to` (JOB_STATE_UNSPECIFIED: new, or
  // forgotten).
  void Index(const std::string& id, loom::v1::JobState from, loom::v1::JobState to);
  // What follows a write of `rec` that carried its events up to `through`:
  // on success the carried entries and transitions are dropped and the job
  // is stored again; on failure it is counted and kept for a retry.
  void AfterWrite(JobRecord& rec, const absl::Status& s, int64_t through);
  void Remove(const std::string& id);

  Store* const store_;
  const Clock* const clock_;
  RankCommands* const ranks_;
  std::vector<JobTableListener*> listeners_;
  std::map<std::string, JobRecord> records_;  // by id
  std::vector<std::string> order_;            // ids in submission order
  std::map<std::string, size_t> position_;    // id -> position in order_
  std::set<std::pair<size_t, std::string>> pending_;
  std::set<std::string> unfinished_;
  std::map<loom::v1::JobState, int> state_counts_;
  RecoveryTotals finished_totals_;     // of jobs that have ended
  std::vector<std::string> to_thin_;   // ended jobs whose series to thin
  std::set<std::string> unpersisted_;  // jobs whose newest state is not on disk
  std::set<std::string> backfilled_;   // jobs whose log entries BackfillEventLog added
  int64_t write_failures_ = 0;
  int64_t illegal_transitions_ = 0;
  int64_t next_seq_ = 1;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOBS_JOB_TABLE_H_
