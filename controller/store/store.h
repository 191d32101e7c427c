// Durable state of the controller: jobs (with their state history), workers
// seen, step metrics, checkpoint catalogs, cordons and the leader lease.
//
// Two backends, one code path above them (store/sql_connection.h): an
// embedded SQLite database in WAL mode (Open, the default) or a PostgreSQL
// database that several controllers share (OpenPostgres: one leads, the
// others stand by; see the lease below).
//
// Every mutating call is one transaction: either all of it is durable when
// the call returns OK, or none of it is. Once SetFencingEpoch(e) was called,
// every such transaction also checks, under the lease row's lock, that
// epoch e still holds the lease, and fails with ABORTED (writing nothing)
// when another controller has taken it since. Thread-safe (one mutex
// serialises access to the connection).
#ifndef LOOM_CONTROLLER_STORE_STORE_H_
#define LOOM_CONTROLLER_STORE_STORE_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/watched_mutex.h"
#include "controller/store/postgres_connection.h"
#include "controller/store/sql_connection.h"
#include "loom/v1/job.pb.h"

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
  // Connects to a PostgreSQL database (shared by every controller of one
  // installation) and brings its schema up to date. UNAVAILABLE when the
  // server cannot be reached; FAILED_PRECONDITION when its schema is newer
  // than this build knows.
  static absl::StatusOr<std::unique_ptr<Store>> OpenPostgres(store::PostgresOptions options);
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
  // How long a batch waits for more writes (see Wait), by store: about what
  // a commit costs there, so that waiting batches writes without adding
  // much latency. Each transaction costs the controller ~0.2 ms of CPU
  // beyond its writes (bench control-plane, 1,000 step reports a second, on
  // SQLite: windows of 0, 2, 4 and 10 ms gave 754, 600, 465 and 263
  // transactions a second, 68%, 65%, 62% and 59% of a core, and a step
  // report p99 of 5.0, 6.6, 8.4 and 14.6 ms).
  // - SQLite, 2 ms: its fsync takes ~0.1 ms here, so a longer wait only
  //   adds latency; 4 -> 2 ms took the step-report p99 from 9.41 to
  //   6.98 ms at the same CPU (2026-12-06).
  // - PostgreSQL, 4 ms: a commit is a round trip to a server that shares
  //   the cores; at 2 ms its p99 rose from 9.2-10.0 ms (five runs at 4 ms)
  //   to 10.8-18.1 ms (five runs at 2 ms, 2026-12-06).
  static constexpr std::chrono::milliseconds kGroupCommitWindowSqlite{2};
  static constexpr std::chrono::milliseconds kGroupCommitWindowPostgres{4};

  // One entry of the event log (table job_events): what happened to a job,
  // numbered twice. `idx` is the job's own count of its events, given by
  // the caller: the log keeps one entry per (job, idx), so a write retried
  // after an answer that was lost stores nothing twice. `seq` is the log's
  // global number, given by the store as the entry commits: 1, 2, 3, ...
  // in commit order with no gap (a failed or fenced transaction takes no
  // number), so a reader that passes back the last seq it saw misses
  // nothing and reads nothing twice, whichever controller wrote it. `kind`
  // and `payload` are the caller's (the store does not read them).
  struct LoggedEvent {
    int64_t seq = 0;  // set by the store; ignored in Enqueue
    std::string job_id;
    int64_t idx = 0;
    int32_t kind = 0;
    int64_t time_unix_ms = 0;
    std::string payload;
  };
  // The controller's kinds of entries (the store keeps any value; retention
  // never deletes a transition).
  static constexpr int32_t kLoggedTransition = 1;
  static constexpr int32_t kLoggedRecovery = 2;
  static constexpr int32_t kLoggedCheckpoint = 3;
  // Listeners are called with the entries each committed transaction added
  // to the log (their seq set; an entry already there is not repeated), one
  // batch at a time in commit order, before the writers' Wait returns; on
  // the committing thread, which holds none of the store's locks, so a
  // listener may take its own locks, but must not call the store. `key`
  // names the listener (adding a key again replaces it).
  using LoggedEventsListener = std::function<void(const std::vector<LoggedEvent>&)>;
  void AddLoggedEventsListener(const void* key, LoggedEventsListener listener);
  void RemoveLoggedEventsListener(const void* key);

  // Puts PutJobAndSteps(job, new_transitions, steps) in line, with `events`
  // appended to the event log in the same transaction, and returns at
  // once; `job` may be null for steps or events only. Serialises its
  // arguments now.
  Ticket Enqueue(const loom::v1::Job* job, int new_transitions,
                 const std::vector<loom::v1::StepMetrics>& steps, const std::string& job_id,
                 const std::vector<LoggedEvent>& events = {});
  // Blocks until the write is durable (OK) or its batch failed. Whoever
  // waits first while no batch is being written writes everything in line;
  // when others are in line too, it first lets the group-commit window pass
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
  // Writes handed to the database so far and the transactions that carried them
  // (for the load benchmark and tests: writes / batches is the grouping).
  int64_t writes_committed();
  int64_t batches_committed();

  // Inserts or replaces the job row, appends `new_transitions` (the tail
  // of job.history not yet stored) to the transitions table, and `events`
  // to the event log, in one transaction.
  absl::Status PutJob(const loom::v1::Job& job, int new_transitions,
                      const std::vector<LoggedEvent>& events = {});
  // PutJob and AppendStepMetrics in one transaction: the job's summary
  // (its last step) and the step rows it counts are durable together, so a
  // restart never finds steps the summary does not know (a retried report
  // would store them twice).
  absl::Status PutJobAndSteps(const loom::v1::Job& job, int new_transitions,
                              const std::vector<loom::v1::StepMetrics>& steps);

  // All jobs, oldest first.
  absl::StatusOr<std::vector<loom::v1::Job>> LoadJobs();
  // The jobs written since change number `after` (-1: all), in the order
  // they were written; *newest gets the highest number read (`after` when
  // none). Every job write takes the next number (migration 3), so a reader
  // that passes back *newest misses no write and reads none twice.
  absl::StatusOr<std::vector<loom::v1::Job>> LoadJobsChangedSince(int64_t after, int64_t* newest);

  // Appends `events` (of any jobs) to the event log in one transaction and
  // waits until they are durable: Wait(Enqueue(nullptr, 0, {}, "", events)).
  absl::Status AppendEvents(const std::vector<LoggedEvent>& events);
  // The log's entries after `after_seq` (0: from the first), in seq order,
  // at most `limit` (0: all); of one job, or of all when `job_id` is empty.
  absl::StatusOr<std::vector<LoggedEvent>> LoadEvents(const std::string& job_id, int64_t after_seq,
                                                      int64_t limit);
  // The highest seq in the log (0 when it is empty).
  absl::StatusOr<int64_t> LastEventSeq();
  // Retention of an ended job's entries: keeps every transition and the
  // newest `keep` (>= 1) other entries of `job_id`, deletes the rest in one
  // fenced transaction; returns how many went. (A reader after a deleted
  // seq reads on from the next kept one.)
  absl::StatusOr<int64_t> PruneEvents(const std::string& job_id, int64_t keep);

  // Transitions recorded for a job, in order (from the transitions table).
  absl::StatusOr<std::vector<loom::v1::StateTransition>> LoadTransitions(const std::string& job_id);

  // Appends step metrics of a job.
  absl::Status AppendStepMetrics(const std::string& job_id,
                                 const std::vector<loom::v1::StepMetrics>& steps);

  // The newest `limit` (0 = all) step metrics of a job, oldest first.
  absl::StatusOr<std::vector<loom::v1::StepMetrics>> LoadStepMetrics(const std::string& job_id,
                                                                     int limit);

  // The job's first and last recorded steps (0 and -1: none), from the
  // index (store_steps.cc).
  absl::StatusOr<std::pair<int64_t, int64_t>> StepBounds(const std::string& job_id);
  // Calls `fn` with each step record of the job in [from_step, to_step], in
  // step order and, for a step recorded more than once, in the order of
  // recording; reads `chunk_rows` rows per query, letting other users of
  // the store in between.
  absl::Status ScanStepMetrics(const std::string& job_id, int64_t from_step, int64_t to_step,
                               const std::function<void(const loom::v1::StepMetrics&)>& fn,
                               int chunk_rows = 4096);

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
  // The numeric suffix of a job id "<name>-<seq>" (0 when it has none):
  // LoadJobs orders jobs by creation time, then by it.
  static int64_t JobSequence(const std::string& id);

  // --- Rank logs (store_logs.cc) ---
  // One log per (job, rank, attempt): the bytes a rank wrote, addressed by
  // offset. The log keeps its newest bytes: whole chunks (one per append)
  // are dropped from its start while more than max_bytes would remain, so
  // first_kept can grow.
  struct LogRow {
    std::string job_id;
    int rank = 0;
    int64_t generation = 0;
    int64_t first_kept = 0;  // bytes before this were dropped
    int64_t end = 0;         // bytes appended so far
    bool complete = false;   // the rank exited: nothing more is taken
  };
  // Appends `data`, which starts at `offset` of the log, in one fenced
  // transaction: bytes the log already has are skipped, nothing is taken
  // when `offset` is past the end or the log is complete, and the log is
  // marked complete when `complete`. Returns the log as it stands after.
  // `start_anywhere`: a log that does not exist yet starts at `offset`
  // (first_kept = offset), as one whose older bytes were dropped (an
  // import). (The caller validates the key.)
  absl::StatusOr<LogRow> AppendLog(const std::string& job_id, int rank, int64_t generation,
                                   int64_t offset, absl::string_view data, bool complete,
                                   int64_t max_bytes, bool start_anywhere = false);
  // The log, or NOT_FOUND.
  absl::StatusOr<LogRow> GetLog(const std::string& job_id, int rank, int64_t generation);
  // Every log of `job_id` by rank then attempt.
  absl::StatusOr<std::vector<LogRow>> ListLogs(const std::string& job_id);
  // The jobs that have logs.
  absl::StatusOr<std::vector<std::string>> LogJobs();
  // One stored append: bytes [offset, offset + data.size()) of its log.
  struct LogChunk {
    int64_t offset = 0;
    std::string data;
  };
  // The chunks that hold the log's bytes from `from` on, in order, until
  // they hold at least `max_bytes` of them (or the log ends).
  absl::StatusOr<std::vector<LogChunk>> ReadLogForward(const std::string& job_id, int rank,
                                                       int64_t generation, int64_t from,
                                                       int64_t max_bytes);
  // The chunks that hold the log's bytes before `before`, newest first,
  // until they hold at least `max_bytes` of them (or the log starts).
  absl::StatusOr<std::vector<LogChunk>> ReadLogBackward(const std::string& job_id, int rank,
                                                        int64_t generation, int64_t before,
                                                        int64_t max_bytes);
  // Deletes every log of `job_id` (retention).
  absl::Status RemoveLogs(const std::string& job_id);
  // A chunk of one of the job's logs whose searchable text contains
  // `needle`. Its text is the partial line the chunk continues (at most
  // kLogCarryMax bytes of it), then the chunk, as valid UTF-8 (other bytes
  // shown as U+FFFD, NUL as a space): every line that ends in a chunk is
  // whole in its text, so a line is matched where it ends.
  struct LogMatch {
    int rank = 0;
    int64_t generation = 0;
    int64_t offset = 0;   // of the chunk in its log
    bool last = false;    // the log's newest chunk (its partial last line is matched here)
    int64_t carried = 0;  // bytes of the partial line before it that its text starts with
    std::string data;     // the chunk's bytes
    std::string text;     // its searchable text (the carried partial line has no newline)
  };
  static constexpr int64_t kLogCarryMax = 4096;
  // Chunks of `job_id`'s logs (all ranks and attempts) whose text contains
  // `needle` (case-sensitive; through the trigram index when it has 3 or
  // more characters), at most `limit` (when more match, which ones is not
  // set).
  absl::StatusOr<std::vector<LogMatch>> SearchLogs(const std::string& job_id,
                                                   absl::string_view needle, int64_t limit);
  // The text a chunk is searched by: `carry` then `data` as valid UTF-8.
  static std::string LogSearchText(absl::string_view carry, absl::string_view data);

  // --- Loom Console (store_console.cc) ---
  // A console session: hashes of its id and of the token it was opened with
  // (hex SHA-256), never either secret.
  struct SessionRow {
    std::string id_sha256;
    std::string user;
    std::string token_sha256;
    int64_t created_unix_ms = 0;
    int64_t expires_unix_ms = 0;
  };
  // Records a new session, and deletes those expired by its creation time.
  absl::Status PutSession(const SessionRow& session);
  // The session (expired or not), or NOT_FOUND.
  absl::StatusOr<SessionRow> GetSession(const std::string& id_sha256);
  // Ends a session; a no-op for one that is gone.
  absl::Status DeleteSession(const std::string& id_sha256);
  // Records (or refreshes) where `holder`'s console serves. Not fenced: a
  // standby records its own.
  absl::Status PutConsole(const std::string& holder, const std::string& url, int64_t seen_unix_ms);
  // The console URLs seen after `seen_after_unix_ms`, most recent first.
  absl::StatusOr<std::vector<std::string>> LoadConsoles(int64_t seen_after_unix_ms);

  // --- The leader lease (store_lease.cc) ---
  // One row says which controller leads, under which epoch, until when, on
  // the database's clock. Epochs only grow: each change of holder adds one.
  struct Lease {
    int64_t epoch = 0;    // 0: nobody has led yet
    std::string holder;   // the leading controller's unique id
    std::string address;  // where it serves (for standbys to name)
    std::string console_url;  // where its console serves ("" when it has none)
    int64_t expires_unix_ms = 0;
    int64_t now_unix_ms = 0;  // the database's clock when it was read
    bool held_by(absl::string_view id) const {
      return holder == id && expires_unix_ms > now_unix_ms;
    }
  };
  // Takes the lease for `holder` if it is free (never held, expired, or
  // released), or extends it if `holder` has it, to the database's now +
  // `duration`; otherwise changes nothing. Returns the row as it stands
  // after the call: the caller leads when Lease::held_by(holder). Taking it
  // from someone else (or after a release) adds one to the epoch; renewing
  // keeps it. `force` takes it even from a live holder (a SQLite store,
  // whose directory lock proves the last holder gone). `console_url` is
  // recorded with the address.
  absl::StatusOr<Lease> AcquireLease(const std::string& holder, const std::string& address,
                                     absl::Duration duration, bool force = false,
                                     const std::string& console_url = "");
  // Ends `holder`'s lease at once (a clean stop), so a standby need not wait
  // for it to expire; a no-op when `holder` no longer has it.
  absl::Status ReleaseLease(const std::string& holder);
  absl::StatusOr<Lease> ReadLease();
  // From now on every write is fenced on `epoch` (0: unfenced, the default).
  void SetFencingEpoch(int64_t epoch);
  int64_t fencing_epoch();

  // Which backend, and where ("/var/lib/loom/loom.db", "PostgreSQL ...").
  store::SqlDialect dialect() const { return dialect_; }
  std::string Describe();

 private:
  Store(std::unique_ptr<store::SqlConnection> conn, int lock_fd);
  // Migrates `conn`'s database, then opens the reader with `open_other`,
  // and (when `lease_connection`) the lease's connection too.
  static absl::StatusOr<std::unique_ptr<Store>> Init(
      std::unique_ptr<store::SqlConnection> conn, int lock_fd,
      const std::function<absl::StatusOr<std::unique_ptr<store::SqlConnection>>()>& open_other,
      bool lease_connection);
  // Runs `body` on the lease's own connection (PostgreSQL), or on conn_
  // under mu_ (SQLite, where one controller writes and a second connection
  // would only wait on the same file lock).
  template <typename F>
  auto WithLeaseConnection(const char* holder, F body);
  // BEGIN of a write transaction, then the fence (when set): ABORTED, with
  // the transaction rolled back, when the fencing epoch no longer leads.
  // Holds mu_.
  absl::Status BeginFencedLocked();
  // Runs `body` between BeginFencedLocked and COMMIT, rolling back if it
  // fails. Holds mu_.
  absl::Status WriteTransactionLocked(const std::function<absl::Status()>& body);
  // One transaction with all of `batch`, in order (the job row only from
  // the last write of each job in the batch).
  // `logged`: the event log entries it added, numbered (when it commits).
  absl::Status WriteBatch(const std::vector<Ticket>& batch, std::vector<LoggedEvent>* logged);

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::vector<Ticket> queue_;      // guarded by queue_mu_
  bool committing_ = false;        // a waiter is writing a batch; guarded by queue_mu_
  int64_t writes_committed_ = 0;   // guarded by queue_mu_
  int64_t batches_committed_ = 0;  // guarded by queue_mu_
  // WhenDurable's waits and their thread.
  void RunCommitter();
  std::vector<std::pair<Ticket, std::function<void(absl::Status)>>> durable_waits_;  // queue_mu_
  std::condition_variable durable_cv_;
  bool stopping_ = false;  // guarded by queue_mu_
  std::thread committer_;  // started by the first WhenDurable

  std::mutex listener_mu_;
  std::map<const void*, LoggedEventsListener> events_listeners_;  // guarded by listener_mu_

  WatchedMutex mu_{"loom-controller: the store connection"};
  // Owned; guarded by mu_. It prepares each statement once and reuses it:
  // parsing WriteBatch's for every batch was a tenth of a transaction's CPU.
  std::unique_ptr<store::SqlConnection> conn_;
  const store::SqlDialect dialect_;
  int64_t fencing_epoch_ = 0;  // guarded by mu_
  int lock_fd_;                // owned (-1 for PostgreSQL): holds the directory's flock

  // A second connection for the long reads of rank logs (a search over
  // millions of lines), so that they never hold up the writes on conn_.
  // It sees what conn_ committed (SQLite's WAL; PostgreSQL).
  std::mutex read_mu_;
  std::unique_ptr<store::SqlConnection> reader_;  // guarded by read_mu_

  // PostgreSQL: a third connection for the leader lease alone. A renewal
  // must reach the database within the lease however long a write on conn_
  // takes (a rank log append once held conn_ for 2.2 s on a loaded machine,
  // and the leader lost a lease it was alive to renew). Null for SQLite.
  WatchedMutex lease_mu_{"loom-controller: the lease's store connection"};
  std::unique_ptr<store::SqlConnection> lease_conn_;  // guarded by lease_mu_
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_STORE_STORE_H_
