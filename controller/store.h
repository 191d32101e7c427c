// Durable state of the controller: jobs (with their state history), workers
// seen, and step metrics, in one SQLite database in WAL mode.
//
// Every mutating call is one transaction: either all of it is on disk when
// the call returns OK, or none of it is. Thread-safe (one mutex serialises
// access to the connection).
#ifndef LOOM_CONTROLLER_STORE_H_
#define LOOM_CONTROLLER_STORE_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"

struct sqlite3;

namespace loom::controller {

class Store {
 public:
  // Opens (creating if needed) `<dir>/loom.db`. `dir` must exist. One
  // controller per directory: the store holds an exclusive lock on
  // `<dir>/LOCK` (flock, released when the store closes or the process
  // dies, kill -9 included) and a second Open of the same directory, from
  // this process or another, fails with FAILED_PRECONDITION naming the
  // directory and the pid written in the lock file.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& dir);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Inserts or replaces the job row, and appends `new_transitions` (the tail
  // of job.history not yet stored) to the transitions table.
  absl::Status PutJob(const loom::v1::Job& job, int new_transitions);
  // PutJob and AppendStepMetrics in one transaction: the job's summary
  // (its last step) and the step rows it counts are durable together, so a
  // restart never finds steps the summary does not know (a retried report
  // would store them twice).
  absl::Status PutJobAndSteps(const loom::v1::Job& job, int new_transitions,
                              const std::vector<loom::v1::StepMetrics>& steps);

  // All jobs, oldest first.
  absl::StatusOr<std::vector<loom::v1::Job>> LoadJobs();

  // Transitions recorded for a job, in order (from the transitions table).
  absl::StatusOr<std::vector<loom::v1::StateTransition>> LoadTransitions(
      const std::string& job_id);

  // Appends step metrics of a job.
  absl::Status AppendStepMetrics(const std::string& job_id,
                                 const std::vector<loom::v1::StepMetrics>& steps);

  // The newest `limit` (0 = all) step metrics of a job, oldest first.
  absl::StatusOr<std::vector<loom::v1::StepMetrics>> LoadStepMetrics(
      const std::string& job_id, int limit);

  // Adds a committed checkpoint to the job's catalog (idempotent per
  // job/step/generation).
  absl::Status PutCheckpoint(const std::string& job_id, const loom::v1::CheckpointInfo& info);
  // PutCheckpoint of each, in one transaction (all or none).
  absl::Status PutCheckpoints(const std::string& job_id,
                              const std::vector<loom::v1::CheckpointInfo>& infos);
  // The catalog of a job, oldest step first.
  absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> LoadCheckpoints(const std::string& job_id);

  // A worker registration as recorded (the workers table).
  struct WorkerRow {
    std::string id;
    std::string node;
    std::string address;
    std::string zone;  // empty = not reported (and in rows from before zones)
    std::string rack;
    int64_t registered_unix_ms = 0;
  };
  // Records a worker registration (for audit; workers re-register after a
  // controller restart).
  absl::Status PutWorker(const WorkerRow& worker);
  // Every recorded registration, oldest first.
  absl::StatusOr<std::vector<WorkerRow>> LoadWorkers();

  // Largest numeric suffix used in job ids so far (ids never repeat).
  absl::StatusOr<int64_t> MaxJobSequence();

 private:
  Store(sqlite3* db, int lock_fd) : db_(db), lock_fd_(lock_fd) {}
  absl::Status Exec(const char* sql);
  // Brings tables of a database made by an older Loom up to kSchema.
  absl::Status Migrate();
  absl::Status Commit();

  std::mutex mu_;
  sqlite3* db_;  // owned; guarded by mu_
  int lock_fd_;  // owned: holds the directory's flock
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_STORE_H_
