#include "controller/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::controller {
namespace {

// RAII wrapper for a prepared statement.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
    if (rc_ != SQLITE_OK) error_ = sqlite3_errmsg(db);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  const std::string& error() const { return error_; }
  sqlite3_stmt* get() { return stmt_; }
  void BindText(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void BindInt(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  int Step() { return sqlite3_step(stmt_); }
  // Ready to run again with new bindings.
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  std::string ColumnBlob(int i) {
    const void* p = sqlite3_column_blob(stmt_, i);
    int n = sqlite3_column_bytes(stmt_, i);
    return p ? std::string(static_cast<const char*>(p), n) : std::string();
  }
  int64_t ColumnInt(int i) { return sqlite3_column_int64(stmt_, i); }
  std::string ColumnText(int i) {
    const unsigned char* p = sqlite3_column_text(stmt_, i);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, i))
             : std::string();
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
  std::string error_;
};

absl::Status SqlError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(absl::StrCat("store: ", what, ": ", sqlite3_errmsg(db)));
}

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  seq INTEGER NOT NULL,
  state INTEGER NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  job BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS transitions (
  job_id TEXT NOT NULL,
  idx INTEGER NOT NULL,
  from_state INTEGER NOT NULL,
  to_state INTEGER NOT NULL,
  time_unix_ms INTEGER NOT NULL,
  reason TEXT NOT NULL,
  PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS step_metrics (
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  metrics BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS step_metrics_by_job ON step_metrics (job_id, step);
CREATE TABLE IF NOT EXISTS checkpoints (
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  info BLOB NOT NULL,
  PRIMARY KEY (job_id, step, generation)
);
CREATE TABLE IF NOT EXISTS workers (
  id TEXT PRIMARY KEY,
  node TEXT NOT NULL,
  address TEXT NOT NULL,
  registered_unix_ms INTEGER NOT NULL,
  zone TEXT NOT NULL DEFAULT '',
  rack TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS cordons (
  node TEXT PRIMARY KEY,
  until_unix_ms INTEGER NOT NULL,
  reason TEXT NOT NULL
);
)sql";

// Columns added to existing tables since their first release, in order:
// {table, column, declaration}. Migrate() adds those a database lacks.
struct AddedColumn {
  const char* table;
  const char* column;
  const char* declaration;
};
constexpr AddedColumn kAddedColumns[] = {
    {"workers", "zone", "TEXT NOT NULL DEFAULT ''"},  // issue 5 (deploy)
    {"workers", "rack", "TEXT NOT NULL DEFAULT ''"},
};

int64_t JobSequence(const std::string& id) {
  // Ids are "<name>-<seq>"; the sequence is the digits after the last '-'.
  auto dash = id.rfind('-');
  if (dash == std::string::npos) return 0;
  int64_t v = 0;
  for (size_t i = dash + 1; i < id.size(); ++i) {
    if (id[i] < '0' || id[i] > '9') return 0;
    v = v * 10 + (id[i] - '0');
  }
  return v;
}

}  // namespace

namespace {

// Takes `<dir>/LOCK` exclusively; returns its descriptor. flock locks belong
// to the open file description, so a second open in the same process
// conflicts too.
absl::StatusOr<int> LockDirectory(const std::string& dir) {
  const std::string path = dir + "/LOCK";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state directory ", dir, " is in use by another loom-controller",
          pid.empty() ? "" : absl::StrCat(" (pid ", pid, ")"),
          "; stop it first, or give this one its own --data_dir"));
    }
    return absl::UnavailableError(absl::StrCat("cannot lock ", path, ": ", std::strerror(err)));
  }
  const std::string me = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) < 0) {
    // The lock holds either way; the pid is only for the message above.
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir) {
  absl::StatusOr<int> lock_fd = LockDirectory(dir);
  if (!lock_fd.ok()) return lock_fd.status();
  std::string path = dir + "/loom.db";
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    close(*lock_fd);
    return absl::UnavailableError(absl::StrCat("cannot open store ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<Store> store(new Store(db, *lock_fd));
  // WAL: readers never block the writer; synchronous=FULL so a committed
  // transition survives power loss, not only a process crash.
  for (const char* pragma : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;",
                             "PRAGMA foreign_keys=ON;"}) {
    absl::Status s = store->Exec(pragma);
    if (!s.ok()) return s;
  }
  absl::Status s = store->Exec(kSchema);
  if (!s.ok()) return s;
  s = store->Migrate();
  if (!s.ok()) return s;
  return store;
}

absl::Status Store::Migrate() {
  for (const AddedColumn& c : kAddedColumns) {
    bool present = false;
    {
      Stmt st(db_, absl::StrCat("PRAGMA table_info(", c.table, ");").c_str());
      if (!st.ok()) return SqlError(db_, "read table info");
      while (st.Step() == SQLITE_ROW) present = present || st.ColumnText(1) == c.column;
    }
    if (present) continue;
    absl::Status s = Exec(
        absl::StrCat("ALTER TABLE ", c.table, " ADD COLUMN ", c.column, " ", c.declaration, ";")
            .c_str());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

struct Store::BatchStatements {
  explicit BatchStatements(sqlite3* db)
      : begin(db, "BEGIN IMMEDIATE;"),
        commit(db, "COMMIT;"),
        job(db,
            "INSERT OR REPLACE INTO jobs (id, seq, state, created_unix_ms, job) "
            "VALUES (?, ?, ?, ?, ?);"),
        transition(db,
                   "INSERT OR REPLACE INTO transitions (job_id, idx, from_state, to_state, "
                   "time_unix_ms, reason) VALUES (?, ?, ?, ?, ?, ?);"),
        step(db, "INSERT INTO step_metrics (job_id, step, metrics) VALUES (?, ?, ?);") {}
  bool ok() const {
    return begin.ok() && commit.ok() && job.ok() && transition.ok() && step.ok();
  }
  // Back to ready, bindings dropped: no statement stays active between
  // batches (an active one would keep a read open across transactions).
  void ResetAll() {
    for (Stmt* st : {&begin, &commit, &job, &transition, &step}) st->Reset();
  }
  Stmt begin, commit, job, transition, step;
};

Store::Store(sqlite3* db, int lock_fd) : db_(db), lock_fd_(lock_fd) {}

Store::~Store() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  durable_cv_.notify_all();
  if (committer_.joinable()) committer_.join();
  batch_statements_.reset();  // finalized before the database closes
  sqlite3_close(db_);
  close(lock_fd_);  // releases the directory
}

absl::Status Store::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("store: ", msg));
  }
  return absl::OkStatus();
}

absl::Status Store::Commit() {
  absl::Status s = Exec("COMMIT;");
  // A failed COMMIT leaves the transaction open; roll it back so the next
  // BEGIN works and the caller's error is the whole story.
  if (!s.ok()) Exec("ROLLBACK;").IgnoreError();
  return s;
}

struct Store::PendingWrite {
  std::string job_id;
  bool has_job = false;
  int64_t seq = 0;
  int state = 0;
  int64_t created_unix_ms = 0;
  std::string job_blob;
  std::vector<std::pair<int, loom::v1::StateTransition>> transitions;  // (index, transition)
  std::vector<std::pair<int64_t, std::string>> steps;                 // (step, metrics)
  std::chrono::steady_clock::time_point enqueued;
  bool done = false;     // guarded by queue_mu_
  absl::Status status;   // set when done
};

Store::Ticket Store::Enqueue(const loom::v1::Job* job, int new_transitions,
                             const std::vector<loom::v1::StepMetrics>& steps,
                             const std::string& job_id) {
  auto w = std::make_shared<PendingWrite>();
  w->job_id = job_id;
  if (job != nullptr) {
    w->has_job = true;
    w->seq = JobSequence(job->id());
    w->state = job->state();
    w->created_unix_ms = job->created_unix_ms();
    w->job_blob = job->SerializeAsString();
    const int n = job->history_size();
    for (int i = std::max(0, n - new_transitions); i < n; ++i) {
      w->transitions.emplace_back(i, job->history(i));
    }
  }
  w->steps.reserve(steps.size());
  for (const auto& m : steps) w->steps.emplace_back(m.step(), m.SerializeAsString());
  w->enqueued = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(queue_mu_);
  queue_.push_back(w);
  return w;
}

absl::Status Store::Wait(const Ticket& ticket) {
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (!ticket->done) {
    if (committing_) {
      queue_cv_.wait(lock);
      continue;
    }
    // Not done and nobody writing: it is in the line; write the whole line.
    committing_ = true;
    if (queue_.size() >= 2) {
      // Others are writing too: give more of them the same transaction.
      // (A lone writer commits at once.)
      queue_cv_.wait_until(lock, queue_.front()->enqueued + kGroupCommitWindow);
    }
    std::vector<Ticket> batch;
    batch.swap(queue_);
    lock.unlock();
    absl::Status s = WriteBatch(batch);
    lock.lock();
    for (const Ticket& w : batch) {
      w->status = s;
      w->done = true;
    }
    if (s.ok()) {
      writes_committed_ += static_cast<int64_t>(batch.size());
      batches_committed_ += 1;
    }
    committing_ = false;
    queue_cv_.notify_all();
  }
  return ticket->status;
}

void Store::WhenDurable(Ticket ticket, std::function<void(absl::Status)> done) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    durable_waits_.emplace_back(std::move(ticket), std::move(done));
    if (!committer_.joinable()) committer_ = std::thread([this] { RunCommitter(); });
  }
  durable_cv_.notify_one();
}

void Store::RunCommitter() {
  for (;;) {
    std::vector<std::pair<Ticket, std::function<void(absl::Status)>>> waits;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      durable_cv_.wait(lock, [&] { return stopping_ || !durable_waits_.empty(); });
      if (durable_waits_.empty()) return;  // stopping, and nothing left
      waits.swap(durable_waits_);
    }
    // The first Wait commits the whole line (after the group-commit
    // window, when others are in it); the rest are then done already,
    // unless they were put in line after that batch began.
    for (auto& [ticket, done] : waits) done(Wait(ticket));
  }
}

int64_t Store::writes_committed() {
  std::lock_guard<std::mutex> lock(queue_mu_);
  return writes_committed_;
}

int64_t Store::batches_committed() {
  std::lock_guard<std::mutex> lock(queue_mu_);
  return batches_committed_;
}

absl::Status Store::WriteBatch(const std::vector<Ticket>& batch) {
  // The last write of each job in the batch carries its newest row.
  std::map<std::string, size_t> last_row;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i]->has_job) last_row[batch[i]->job_id] = i;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (batch_statements_ == nullptr) {
    auto prepared = std::make_unique<BatchStatements>(db_);
    if (!prepared->ok()) return SqlError(db_, "prepare batch");
    batch_statements_ = std::move(prepared);
  }
  BatchStatements& st = *batch_statements_;
  struct ResetOnExit {
    BatchStatements* st;
    ~ResetOnExit() { st->ResetAll(); }
  } reset_on_exit{&st};
  if (st.begin.Step() != SQLITE_DONE) return SqlError(db_, "begin batch");
  auto fail = [&](absl::string_view what) {
    absl::Status err = SqlError(db_, what);
    st.ResetAll();  // before the rollback: none may stay active
    Exec("ROLLBACK;").IgnoreError();
    return err;
  };
  Stmt& job_st = st.job;
  Stmt& transition_st = st.transition;
  Stmt& step_st = st.step;
  for (size_t i = 0; i < batch.size(); ++i) {
    const PendingWrite& w = *batch[i];
    if (w.has_job && last_row[w.job_id] == i) {
      job_st.Reset();
      job_st.BindText(1, w.job_id);
      job_st.BindInt(2, w.seq);
      job_st.BindInt(3, w.state);
      job_st.BindInt(4, w.created_unix_ms);
      job_st.BindBlob(5, w.job_blob);
      if (job_st.Step() != SQLITE_DONE) return fail("write job");
    }
    for (const auto& [idx, t] : w.transitions) {
      transition_st.Reset();
      transition_st.BindText(1, w.job_id);
      transition_st.BindInt(2, idx);
      transition_st.BindInt(3, t.from());
      transition_st.BindInt(4, t.to());
      transition_st.BindInt(5, t.time_unix_ms());
      transition_st.BindText(6, t.reason());
      if (transition_st.Step() != SQLITE_DONE) return fail("write transition");
    }
    for (const auto& [step, blob] : w.steps) {
      step_st.Reset();
      step_st.BindText(1, w.job_id);
      step_st.BindInt(2, step);
      step_st.BindBlob(3, blob);
      if (step_st.Step() != SQLITE_DONE) return fail("write step metrics");
    }
  }
  if (st.commit.Step() != SQLITE_DONE) {
    // A failed COMMIT leaves the transaction open (as Commit() does).
    return fail("commit batch");
  }
  return absl::OkStatus();
}

absl::Status Store::PutJob(const loom::v1::Job& job, int new_transitions) {
  return PutJobAndSteps(job, new_transitions, {});
}

absl::Status Store::PutJobAndSteps(const loom::v1::Job& job, int new_transitions,
                                   const std::vector<loom::v1::StepMetrics>& steps) {
  return Wait(Enqueue(&job, new_transitions, steps, job.id()));
}

absl::StatusOr<std::vector<loom::v1::Job>> Store::LoadJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_, "SELECT id, job FROM jobs ORDER BY created_unix_ms, seq;");
  if (!st.ok()) return SqlError(db_, "prepare load jobs");
  std::vector<loom::v1::Job> jobs;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    loom::v1::Job job;
    if (!job.ParseFromString(st.ColumnBlob(1))) {
      return absl::DataLossError(absl::StrCat("store: job row ", job.id(), " is corrupt"));
    }
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "load jobs");
  return jobs;
}

absl::StatusOr<std::vector<loom::v1::StateTransition>> Store::LoadTransitions(
    const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_,
          "SELECT from_state, to_state, time_unix_ms, reason FROM transitions "
          "WHERE job_id = ? ORDER BY idx;");
  if (!st.ok()) return SqlError(db_, "prepare load transitions");
  st.BindText(1, job_id);
  std::vector<loom::v1::StateTransition> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    loom::v1::StateTransition t;
    t.set_from(static_cast<loom::v1::JobState>(st.ColumnInt(0)));
    t.set_to(static_cast<loom::v1::JobState>(st.ColumnInt(1)));
    t.set_time_unix_ms(st.ColumnInt(2));
    t.set_reason(st.ColumnBlob(3));
    out.push_back(std::move(t));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "load transitions");
  return out;
}

absl::Status Store::AppendStepMetrics(const std::string& job_id,
                                      const std::vector<loom::v1::StepMetrics>& steps) {
  if (steps.empty()) return absl::OkStatus();
  return Wait(Enqueue(nullptr, 0, steps, job_id));
}

absl::StatusOr<int64_t> Store::ThinStepMetrics(const std::string& job_id, int64_t keep) {
  if (keep < 2) return absl::InvalidArgumentError("keep: must be >= 2");
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> rowids;
  {
    Stmt st(db_, "SELECT rowid FROM step_metrics WHERE job_id = ? ORDER BY step, rowid;");
    if (!st.ok()) return SqlError(db_, "prepare thin step metrics");
    st.BindText(1, job_id);
    int rc;
    while ((rc = st.Step()) == SQLITE_ROW) rowids.push_back(st.ColumnInt(0));
    if (rc != SQLITE_DONE) return SqlError(db_, "read step metrics to thin");
  }
  const int64_t n = static_cast<int64_t>(rowids.size());
  if (n <= keep) return 0;
  // Row i is kept when it is the nearest to one of keep evenly spaced
  // positions 0, (n-1)/(keep-1), ..., n-1.
  std::vector<bool> kept(n, false);
  for (int64_t k = 0; k < keep; ++k) kept[k * (n - 1) / (keep - 1)] = true;
  absl::Status s = Exec("BEGIN IMMEDIATE;");
  if (!s.ok()) return s;
  Stmt del(db_, "DELETE FROM step_metrics WHERE rowid = ?;");
  if (!del.ok()) {
    absl::Status err = SqlError(db_, "prepare delete step metrics");
    Exec("ROLLBACK;").IgnoreError();
    return err;
  }
  int64_t deleted = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (kept[i]) continue;
    del.Reset();
    del.BindInt(1, rowids[i]);
    if (del.Step() != SQLITE_DONE) {
      absl::Status err = SqlError(db_, "delete step metrics");
      Exec("ROLLBACK;").IgnoreError();
      return err;
    }
    ++deleted;
  }
  s = Commit();
  if (!s.ok()) return s;
  return deleted;
}

absl::StatusOr<std::vector<loom::v1::StepMetrics>> Store::LoadStepMetrics(
    const std::string& job_id, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_,
          "SELECT metrics FROM step_metrics WHERE job_id = ? "
          "ORDER BY step DESC, rowid DESC LIMIT ?;");
  if (!st.ok()) return SqlError(db_, "prepare load step metrics");
  st.BindText(1, job_id);
  st.BindInt(2, limit > 0 ? limit : -1);
  std::vector<loom::v1::StepMetrics> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    loom::v1::StepMetrics m;
    if (!m.ParseFromString(st.ColumnBlob(0))) {
      return absl::DataLossError("store: step metrics row is corrupt");
    }
    out.push_back(std::move(m));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "load step metrics");
  std::reverse(out.begin(), out.end());
  return out;
}

absl::Status Store::PutCheckpoint(const std::string& job_id,
                                  const loom::v1::CheckpointInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_,
          "INSERT OR REPLACE INTO checkpoints (job_id, step, generation, info) "
          "VALUES (?, ?, ?, ?);");
  if (!st.ok()) return SqlError(db_, "prepare checkpoint");
  st.BindText(1, job_id);
  st.BindInt(2, info.step());
  st.BindInt(3, info.generation());
  st.BindBlob(4, info.SerializeAsString());
  if (st.Step() != SQLITE_DONE) return SqlError(db_, "write checkpoint");
  return absl::OkStatus();
}

absl::Status Store::PutCheckpoints(const std::string& job_id,
                                   const std::vector<loom::v1::CheckpointInfo>& infos) {
  if (infos.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = Exec("BEGIN IMMEDIATE;");
  if (!s.ok()) return s;
  for (const loom::v1::CheckpointInfo& info : infos) {
    Stmt st(db_,
            "INSERT OR REPLACE INTO checkpoints (job_id, step, generation, info) "
            "VALUES (?, ?, ?, ?);");
    bool written = st.ok();
    if (written) {
      st.BindText(1, job_id);
      st.BindInt(2, info.step());
      st.BindInt(3, info.generation());
      st.BindBlob(4, info.SerializeAsString());
      written = st.Step() == SQLITE_DONE;
    }
    if (!written) {
      absl::Status err = SqlError(db_, "write checkpoints");
      Exec("ROLLBACK;").IgnoreError();
      return err;
    }
  }
  return Commit();
}

absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> Store::LoadCheckpoints(
    const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_, "SELECT info FROM checkpoints WHERE job_id = ? ORDER BY step, generation;");
  if (!st.ok()) return SqlError(db_, "prepare load checkpoints");
  st.BindText(1, job_id);
  std::vector<loom::v1::CheckpointInfo> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    loom::v1::CheckpointInfo info;
    if (!info.ParseFromString(st.ColumnBlob(0))) {
      return absl::DataLossError("store: checkpoint row is corrupt");
    }
    out.push_back(std::move(info));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "load checkpoints");
  return out;
}

absl::Status Store::PutWorker(const WorkerRow& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_,
          "INSERT OR REPLACE INTO workers (id, node, address, registered_unix_ms, zone, rack) "
          "VALUES (?, ?, ?, ?, ?, ?);");
  if (!st.ok()) return SqlError(db_, "prepare worker");
  st.BindText(1, worker.id);
  st.BindText(2, worker.node);
  st.BindText(3, worker.address);
  st.BindInt(4, worker.registered_unix_ms);
  st.BindText(5, worker.zone);
  st.BindText(6, worker.rack);
  if (st.Step() != SQLITE_DONE) return SqlError(db_, "write worker");
  return absl::OkStatus();
}

absl::Status Store::PutCordon(const CordonRow& cordon) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_, "INSERT OR REPLACE INTO cordons (node, until_unix_ms, reason) VALUES (?, ?, ?);");
  if (!st.ok()) return SqlError(db_, "prepare cordon");
  st.BindText(1, cordon.node);
  st.BindInt(2, cordon.until_unix_ms);
  st.BindText(3, cordon.reason);
  if (st.Step() != SQLITE_DONE) return SqlError(db_, "write cordon");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Store::CordonRow>> Store::LoadCordons(int64_t after_unix_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_,
          "SELECT node, until_unix_ms, reason FROM cordons WHERE until_unix_ms > ? ORDER BY node;");
  if (!st.ok()) return SqlError(db_, "prepare load cordons");
  st.BindInt(1, after_unix_ms);
  std::vector<CordonRow> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    out.push_back({st.ColumnText(0), st.ColumnInt(1), st.ColumnText(2)});
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "load cordons");
  return out;
}

absl::StatusOr<std::vector<Store::WorkerRow>> Store::LoadWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_,
          "SELECT id, node, address, zone, rack, registered_unix_ms FROM workers "
          "ORDER BY registered_unix_ms, id;");
  if (!st.ok()) return SqlError(db_, "prepare load workers");
  std::vector<WorkerRow> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    WorkerRow w;
    w.id = st.ColumnText(0);
    w.node = st.ColumnText(1);
    w.address = st.ColumnText(2);
    w.zone = st.ColumnText(3);
    w.rack = st.ColumnText(4);
    w.registered_unix_ms = st.ColumnInt(5);
    out.push_back(std::move(w));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "load workers");
  return out;
}

absl::StatusOr<int64_t> Store::MaxJobSequence() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_, "SELECT COALESCE(MAX(seq), 0) FROM jobs;");
  if (!st.ok() || st.Step() != SQLITE_ROW) return SqlError(db_, "max job sequence");
  return st.ColumnInt(0);
}

}  // namespace loom::controller
