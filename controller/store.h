// Durable state of the controller: jobs (with their state history), workers
// seen, and step metrics, in one SQLite database in WAL mode.
//
// Every mutating call is one transaction: either all of it is on disk when
// the call returns OK, or none of it is. Thread-safe (one mutex serialises
// access to the connection).
#ifndef LOOM_CONTROLLER_STORE_H_
#define LOOM_CONTROLLER_STORE_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
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

  // Every job and step write goes through one line (group commit): writes
  // are applied in the order they were put in line, in batches that are one
  // transaction each, so that many reports arriving together share one
  // fsync. A batch commits or fails as a whole. Because every job write
  // takes the same line, an older snapshot of a job never overwrites a
  // newer one. A caller that must not wait under its own lock puts the
  // write in line there (Enqueue, which keeps its order) and waits for it
  // after releasing the lock (Wait).
  struct PendingWrite;
  using Ticket = std::shared_ptr<PendingWrite>;
  // How long a batch waits for more writes (see Wait). Each transaction
  // costs the controller ~0.2 ms of CPU beyond its writes (bench
  // control-plane, 1,000 step reports a second: windows of 0, 2, 4 and
  // 10 ms gave 754, 600, 465 and 263 transactions a second, 68%, 65%, 62%
  // and 59% of a core, and a step report p99 of 5.0, 6.6, 8.4 and 14.6 ms).
  // 4 ms: most of the latency gone for 3% of a core.
  static constexpr std::chrono::milliseconds kGroupCommitWindow{4};
  // Puts PutJobAndSteps(job, new_transitions, steps) in line and returns at
  // once; `job` may be null for steps only. Serialises its arguments now.
  Ticket Enqueue(const loom::v1::Job* job, int new_transitions,
                 const std::vector<loom::v1::StepMetrics>& steps, const std::string& job_id);
  // Blocks until the write is durable (OK) or its batch failed. Whoever
  // waits first while no batch is being written writes everything in line;
  // when others are in line too, it first lets kGroupCommitWindow pass
  // since the oldest was put there, so that a thousand step reports a
  // second share a few hundred transactions instead of one per report or
  // two (bench control-plane: "writes each").
  absl::Status Wait(const Ticket& ticket);
  // Returns at once; `done` runs with what Wait would return, on the
  // store's own committer thread (started on first use), which waits as
  // Wait does: a server answers durable writes without a thread per
  // waiting request. `done` must not wait for another write of this store.
  // Writes still waited for when the store is destroyed are waited for
  // first.
  void WhenDurable(Ticket ticket, std::function<void(absl::Status)> done);
  // Writes handed to SQLite so far and the transactions that carried them
  // (for the load benchmark and tests: writes / batches is the grouping).
  int64_t writes_committed();
  int64_t batches_committed();

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

  // Keeps at most `keep` (>= 2) of a job's step rows, evenly spaced by
  // position with the first and the last among them, and deletes the rest
  // in one transaction. Returns how many rows were deleted.
  absl::StatusOr<int64_t> ThinStepMetrics(const std::string& job_id, int64_t keep);

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

  // A node cordoned until a time (a slow rank there; WorkerRegistry::Cordon),
  // kept across controller restarts.
  struct CordonRow {
    std::string node;
    int64_t until_unix_ms = 0;
    std::string reason;
  };
  // Records (or replaces) the node's cordon.
  absl::Status PutCordon(const CordonRow& cordon);
  // The cordons that end after `after_unix_ms`, by node.
  absl::StatusOr<std::vector<CordonRow>> LoadCordons(int64_t after_unix_ms);

  // Largest numeric suffix used in job ids so far (ids never repeat).
  absl::StatusOr<int64_t> MaxJobSequence();

 private:
  Store(sqlite3* db, int lock_fd);
  absl::Status Exec(const char* sql);
  // Brings tables of a database made by an older Loom up to kSchema.
  absl::Status Migrate();
  absl::Status Commit();
  // One transaction with all of `batch`, in order (the job row only from
  // the last write of each job in the batch).
  absl::Status WriteBatch(const std::vector<Ticket>& batch);

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::vector<Ticket> queue_;   // guarded by queue_mu_
  bool committing_ = false;     // a waiter is writing a batch; guarded by queue_mu_
  int64_t writes_committed_ = 0;   // guarded by queue_mu_
  int64_t batches_committed_ = 0;  // guarded by queue_mu_
  // WhenDurable's waits and their thread.
  void RunCommitter();
  std::vector<std::pair<Ticket, std::function<void(absl::Status)>>> durable_waits_;  // queue_mu_
  std::condition_variable durable_cv_;
  bool stopping_ = false;  // guarded by queue_mu_
  std::thread committer_;  // started by the first WhenDurable

  std::mutex mu_;
  sqlite3* db_;  // owned; guarded by mu_
  // WriteBatch's statements, prepared once (store.cc): parsing them for
  // every batch was a tenth of a transaction's CPU. Guarded by mu_.
  struct BatchStatements;
  std::unique_ptr<BatchStatements> batch_statements_;
  int lock_fd_;  // owned: holds the directory's flock
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_STORE_H_
