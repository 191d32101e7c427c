#include "controller/store/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/store/migrations.h"
#include "controller/store/sqlite_connection.h"

namespace loom::controller {
namespace {

using store::Blob;
using store::Int;
using store::SqlResult;
using store::Text;

// The job row's upsert, with `next_change` the expression of its change
// number.
std::string UpsertJob(const std::string& next_change) {
  return absl::StrCat(
      "INSERT INTO jobs (id, seq, state, created_unix_ms, job, change_seq) "
      "VALUES (?, ?, ?, ?, ?, ",
      next_change,
      ") ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, state = excluded.state, "
      "created_unix_ms = excluded.created_unix_ms, job = excluded.job, "
      "change_seq = excluded.change_seq;");
}

}  // namespace

int64_t Store::JobSequence(const std::string& id) {
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

std::string Store::Describe() {
  WatchedLock lock(mu_, __func__);
  return conn_->Describe();
}

void Store::SetFencingEpoch(int64_t epoch) {
  WatchedLock lock(mu_, __func__);
  fencing_epoch_ = epoch;
}

int64_t Store::fencing_epoch() {
  WatchedLock lock(mu_, __func__);
  return fencing_epoch_;
}

absl::Status Store::BeginFencedLocked() {
  absl::Status s = conn_->BeginWrite();
  if (!s.ok() || fencing_epoch_ == 0) return s;
  // Locks the lease row until COMMIT: a controller taking the lease waits
  // for this transaction, and this one, if it comes second, finds the epoch
  // moved on and writes nothing.
  // (PostgreSQL: a key-share lock. A takeover's FOR UPDATE waits for it;
  // the holder's renewal, an UPDATE of non-key columns, does not, so a slow
  // write never holds up the lease it runs under. SQLite's write
  // transaction excludes every other writer already.)
  auto fenced = conn_->Run(dialect_ == store::SqlDialect::kPostgres
                               ? "SELECT epoch FROM leader WHERE id = 1 FOR KEY SHARE;"
                               : "SELECT epoch FROM leader WHERE id = 1;",
                           {});
  if (fenced.ok() && fenced->rows.size() == 1 && fenced->rows[0][0].i == fencing_epoch_) {
    return absl::OkStatus();
  }
  conn_->Rollback();
  if (!fenced.ok()) return fenced.status();
  return absl::AbortedError(absl::StrCat(
      "store: fenced: epoch ", fencing_epoch_, " no longer holds the leader lease (epoch ",
      fenced->rows.empty() ? 0 : fenced->rows[0][0].i,
      " does); another controller leads, and this one must step down"));
}

absl::Status Store::WriteTransactionLocked(const std::function<absl::Status()>& body) {
  absl::Status s = BeginFencedLocked();
  if (!s.ok()) return s;
  s = body();
  if (!s.ok()) {
    conn_->Rollback();
    return s;
  }
  return conn_->Commit();
}

struct Store::PendingWrite {
  std::string job_id;
  bool has_job = false;
  int64_t seq = 0;
  int state = 0;
  int64_t created_unix_ms = 0;
  std::string job_blob;
  std::vector<std::pair<int, loom::v1::StateTransition>> transitions;  // (index, transition)
  std::vector<std::pair<int64_t, std::string>> steps;                  // (step, metrics)
  std::vector<LoggedEvent> events;
  std::chrono::steady_clock::time_point enqueued;
  bool done = false;    // guarded by queue_mu_
  absl::Status status;  // set when done
};

Store::Ticket Store::Enqueue(const loom::v1::Job* job, int new_transitions,
                             const std::vector<loom::v1::StepMetrics>& steps,
                             const std::string& job_id, const std::vector<LoggedEvent>& events) {
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
  w->events = events;
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
      queue_cv_.wait_until(lock, queue_.front()->enqueued +
                                     (dialect_ == store::SqlDialect::kPostgres
                                          ? kGroupCommitWindowPostgres
                                          : kGroupCommitWindowSqlite));
    }
    std::vector<Ticket> batch;
    batch.swap(queue_);
    lock.unlock();
    std::vector<LoggedEvent> logged;
    absl::Status s = WriteBatch(batch, &logged);
    if (!s.ok()) logged.clear();  // rolled back: none of them happened
    if (!logged.empty()) {
      // Still the only committer: listeners hear of batches in commit order.
      std::lock_guard<std::mutex> listen(listener_mu_);
      for (const auto& [key, listener] : events_listeners_) listener(logged);
    }
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

absl::Status Store::WriteBatch(const std::vector<Ticket>& batch,
                             std::vector<LoggedEvent>* logged) {
  // The last write of each job in the batch carries its newest row.
  std::map<std::string, size_t> last_row;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i]->has_job) last_row[batch[i]->job_id] = i;
  }
  WatchedLock lock(mu_, __func__);
  return WriteTransactionLocked([&]() -> absl::Status {
    // The event log's next number, read once the batch has an event: this
    // transaction holds the write lock (and the fence), so no other writer
    // numbers events until it ends, and a rolled-back batch leaves no gap.
    int64_t next_seq = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const PendingWrite& w = *batch[i];
      if (w.has_job && last_row[w.job_id] == i) {
        // (change_seq: the next number; only the leader writes, one
        // transaction at a time, so numbers commit in order. PostgreSQL
        // takes it from a sequence: see migration 3.)
        static const std::string kSqlite = UpsertJob("(SELECT COALESCE(MAX(change_seq), 0) + 1 FROM jobs)");
        static const std::string kPostgres = UpsertJob("nextval('jobs_change_seq')");
        auto r = conn_->Run(dialect_ == store::SqlDialect::kPostgres ? kPostgres : kSqlite,
                            {Text(w.job_id), Int(w.seq), Int(w.state), Int(w.created_unix_ms),
                             Blob(w.job_blob)});
        if (!r.ok()) return r.status();
      }
      for (const auto& [idx, t] : w.transitions) {
        auto r = conn_->Run(
            "INSERT INTO transitions (job_id, idx, from_state, to_state, time_unix_ms, reason) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, idx) DO UPDATE SET "
            "from_state = excluded.from_state, to_state = excluded.to_state, "
            "time_unix_ms = excluded.time_unix_ms, reason = excluded.reason;",
            {Text(w.job_id), Int(idx), Int(t.from()), Int(t.to()), Int(t.time_unix_ms()),
             Blob(t.reason())});
        if (!r.ok()) return r.status();
      }
      for (const auto& [step, blob] : w.steps) {
        auto r = conn_->Run("INSERT INTO step_metrics (job_id, step, metrics) VALUES (?, ?, ?);",
                            {Text(w.job_id), Int(step), Blob(blob)});
        if (!r.ok()) return r.status();
      }
      for (const LoggedEvent& e : w.events) {
        if (next_seq == 0) {
          auto last = conn_->Run("SELECT COALESCE(MAX(seq), 0) FROM job_events;", {});
          if (!last.ok()) return last.status();
          next_seq = last->rows[0][0].i + 1;
        }
        // An entry already logged (a retried write) changes nothing and
        // takes no number.
        auto r = conn_->Run(
            "INSERT INTO job_events (seq, job_id, idx, kind, time_unix_ms, payload) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, idx) DO NOTHING;",
            {Int(next_seq), Text(e.job_id), Int(e.idx), Int(e.kind), Int(e.time_unix_ms),
             Blob(e.payload)});
        if (!r.ok()) return r.status();
        if (r->affected != 1) continue;
        logged->push_back(e);
        logged->back().seq = next_seq++;
      }
    }
    return absl::OkStatus();
  });
}

absl::Status Store::PutJob(const loom::v1::Job& job, int new_transitions,
                           const std::vector<LoggedEvent>& events) {
  return Wait(Enqueue(&job, new_transitions, {}, job.id(), events));
}

absl::Status Store::PutJobAndSteps(const loom::v1::Job& job, int new_transitions,
                                   const std::vector<loom::v1::StepMetrics>& steps) {
  return Wait(Enqueue(&job, new_transitions, steps, job.id()));
}

absl::StatusOr<std::vector<loom::v1::Job>> Store::LoadJobs() {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run("SELECT id, job FROM jobs ORDER BY created_unix_ms, seq;", {});
  if (!r.ok()) return r.status();
  std::vector<loom::v1::Job> jobs;
  jobs.reserve(r->rows.size());
  for (const store::SqlRow& row : r->rows) {
    loom::v1::Job job;
    if (!job.ParseFromString(row[1].s)) {
      return absl::DataLossError(absl::StrCat("store: job row ", row[0].s, " is corrupt"));
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::StatusOr<std::vector<loom::v1::Job>> Store::LoadJobsChangedSince(int64_t after,
                                                                       int64_t* newest) {
  WatchedLock lock(mu_, __func__);
  auto r =
      conn_->Run("SELECT id, job, change_seq FROM jobs WHERE change_seq > ? ORDER BY change_seq;",
                 {Int(after)});
  if (!r.ok()) return r.status();
  std::vector<loom::v1::Job> jobs(r->rows.size());
  *newest = after;
  for (size_t i = 0; i < r->rows.size(); ++i) {
    if (!jobs[i].ParseFromString(r->rows[i][1].s)) {
      return absl::DataLossError(absl::StrCat("store: job row ", r->rows[i][0].s, " is corrupt"));
    }
    *newest = std::max(*newest, r->rows[i][2].i);
  }
  return jobs;
}

absl::StatusOr<std::vector<loom::v1::StateTransition>> Store::LoadTransitions(
    const std::string& job_id) {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run(
      "SELECT from_state, to_state, time_unix_ms, reason FROM transitions "
      "WHERE job_id = ? ORDER BY idx;",
      {Text(job_id)});
  if (!r.ok()) return r.status();
  std::vector<loom::v1::StateTransition> out;
  out.reserve(r->rows.size());
  for (const store::SqlRow& row : r->rows) {
    loom::v1::StateTransition t;
    t.set_from(static_cast<loom::v1::JobState>(row[0].i));
    t.set_to(static_cast<loom::v1::JobState>(row[1].i));
    t.set_time_unix_ms(row[2].i);
    t.set_reason(row[3].s);
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status Store::AppendStepMetrics(const std::string& job_id,
                                      const std::vector<loom::v1::StepMetrics>& steps) {
  if (steps.empty()) return absl::OkStatus();
  return Wait(Enqueue(nullptr, 0, steps, job_id));
}

absl::StatusOr<int64_t> Store::ThinStepMetrics(const std::string& job_id, int64_t keep) {
  if (keep < 2) return absl::InvalidArgumentError("keep: must be >= 2");
  WatchedLock lock(mu_, __func__);
  const std::string row_id = conn_->StepRowId();
  auto rows = conn_->Run(absl::StrCat("SELECT ", row_id, " FROM step_metrics WHERE job_id = ? ",
                                      "ORDER BY step, ", row_id, ";"),
                         {Text(job_id)});
  if (!rows.ok()) return rows.status();
  const int64_t n = static_cast<int64_t>(rows->rows.size());
  if (n <= keep) return 0;
  // Row i is kept when it is the nearest to one of keep evenly spaced
  // positions 0, (n-1)/(keep-1), ..., n-1.
  std::vector<bool> kept(n, false);
  for (int64_t k = 0; k < keep; ++k) kept[k * (n - 1) / (keep - 1)] = true;
  const std::string del = absl::StrCat("DELETE FROM step_metrics WHERE ", row_id, " = ?;");
  int64_t deleted = 0;
  absl::Status s = WriteTransactionLocked([&]() -> absl::Status {
    for (int64_t i = 0; i < n; ++i) {
      if (kept[i]) continue;
      auto r = conn_->Run(del, {Int(rows->rows[i][0].i)});
      if (!r.ok()) return r.status();
      deleted += r->affected;
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return deleted;
}

absl::StatusOr<std::vector<loom::v1::StepMetrics>> Store::LoadStepMetrics(const std::string& job_id,
                                                                          int limit) {
  WatchedLock lock(mu_, __func__);
  const std::string row_id = conn_->StepRowId();
  const std::string order = absl::StrCat("SELECT metrics FROM step_metrics WHERE job_id = ? ",
                                         "ORDER BY step DESC, ", row_id, " DESC");
  absl::StatusOr<SqlResult> r =
      limit > 0 ? conn_->Run(absl::StrCat(order, " LIMIT ?;"), {Text(job_id), Int(limit)})
                : conn_->Run(absl::StrCat(order, ";"), {Text(job_id)});
  if (!r.ok()) return r.status();
  std::vector<loom::v1::StepMetrics> out(r->rows.size());
  // Newest first in the result; oldest first out.
  for (size_t i = 0; i < r->rows.size(); ++i) {
    if (!out[r->rows.size() - 1 - i].ParseFromString(r->rows[i][0].s)) {
      return absl::DataLossError("store: step metrics row is corrupt");
    }
  }
  return out;
}

absl::Status Store::PutCheckpoint(const std::string& job_id, const loom::v1::CheckpointInfo& info) {
  return PutCheckpoints(job_id, {info});
}

absl::Status Store::PutCheckpoints(const std::string& job_id,
                                   const std::vector<loom::v1::CheckpointInfo>& infos) {
  if (infos.empty()) return absl::OkStatus();
  WatchedLock lock(mu_, __func__);
  return WriteTransactionLocked([&]() -> absl::Status {
    for (const loom::v1::CheckpointInfo& info : infos) {
      const std::string blob = info.SerializeAsString();
      auto r = conn_->Run(
          "INSERT INTO checkpoints (job_id, step, generation, info) VALUES (?, ?, ?, ?) "
          "ON CONFLICT (job_id, step, generation) DO UPDATE SET info = excluded.info;",
          {Text(job_id), Int(info.step()), Int(info.generation()), Blob(blob)});
      if (!r.ok()) return r.status();
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<loom::v1::CheckpointInfo>> Store::LoadCheckpoints(
    const std::string& job_id) {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run("SELECT info FROM checkpoints WHERE job_id = ? ORDER BY step, generation;",
                      {Text(job_id)});
  if (!r.ok()) return r.status();
  std::vector<loom::v1::CheckpointInfo> out(r->rows.size());
  for (size_t i = 0; i < r->rows.size(); ++i) {
    if (!out[i].ParseFromString(r->rows[i][0].s)) {
      return absl::DataLossError("store: checkpoint row is corrupt");
    }
  }
  return out;
}

absl::Status Store::PutWorker(const WorkerRow& worker) {
  WatchedLock lock(mu_, __func__);
  return WriteTransactionLocked([&]() -> absl::Status {
    return conn_
        ->Run(
            "INSERT INTO workers (id, node, address, registered_unix_ms, zone, rack) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET node = excluded.node, "
            "address = excluded.address, registered_unix_ms = excluded.registered_unix_ms, "
            "zone = excluded.zone, rack = excluded.rack;",
            {Text(worker.id), Text(worker.node), Text(worker.address),
             Int(worker.registered_unix_ms), Text(worker.zone), Text(worker.rack)})
        .status();
  });
}

absl::Status Store::PutCordon(const CordonRow& cordon) {
  WatchedLock lock(mu_, __func__);
  return WriteTransactionLocked([&]() -> absl::Status {
    return conn_
        ->Run(
            "INSERT INTO cordons (node, until_unix_ms, reason) VALUES (?, ?, ?) "
            "ON CONFLICT (node) DO UPDATE SET until_unix_ms = excluded.until_unix_ms, "
            "reason = excluded.reason;",
            {Text(cordon.node), Int(cordon.until_unix_ms), Blob(cordon.reason)})
        .status();
  });
}

absl::StatusOr<std::vector<Store::CordonRow>> Store::LoadCordons(int64_t after_unix_ms) {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run(
      "SELECT node, until_unix_ms, reason FROM cordons WHERE until_unix_ms > ? ORDER BY node;",
      {Int(after_unix_ms)});
  if (!r.ok()) return r.status();
  std::vector<CordonRow> out;
  for (const store::SqlRow& row : r->rows) out.push_back({row[0].s, row[1].i, row[2].s});
  return out;
}

absl::StatusOr<std::vector<Store::WorkerRow>> Store::LoadWorkers() {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run(
      "SELECT id, node, address, zone, rack, registered_unix_ms FROM workers "
      "ORDER BY registered_unix_ms, id;",
      {});
  if (!r.ok()) return r.status();
  std::vector<WorkerRow> out;
  for (const store::SqlRow& row : r->rows) {
    WorkerRow w;
    w.id = row[0].s;
    w.node = row[1].s;
    w.address = row[2].s;
    w.zone = row[3].s;
    w.rack = row[4].s;
    w.registered_unix_ms = row[5].i;
    out.push_back(std::move(w));
  }
  return out;
}

absl::StatusOr<int64_t> Store::MaxJobSequence() {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run("SELECT COALESCE(MAX(seq), 0) FROM jobs;", {});
  if (!r.ok()) return r.status();
  return r->rows[0][0].i;
}

}  // namespace loom::controller
