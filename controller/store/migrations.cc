#include "controller/store/migrations.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace loom::controller::store {
namespace {

struct Migration {
  int64_t version;
  const char* description;
  const char* sqlite;
  const char* postgres;
};

constexpr Migration kMigrations[] = {
    {1, "catalogs: jobs, transitions, step metrics, checkpoints, workers, cordons",
     R"sql(
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
)sql",
     // Reasons are bytes (a rank's last words may be any), so bytea.
     R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  seq BIGINT NOT NULL,
  state INTEGER NOT NULL,
  created_unix_ms BIGINT NOT NULL,
  job BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS transitions (
  job_id TEXT NOT NULL,
  idx INTEGER NOT NULL,
  from_state INTEGER NOT NULL,
  to_state INTEGER NOT NULL,
  time_unix_ms BIGINT NOT NULL,
  reason BYTEA NOT NULL,
  PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS step_metrics (
  row_id BIGSERIAL PRIMARY KEY,
  job_id TEXT NOT NULL,
  step BIGINT NOT NULL,
  metrics BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS step_metrics_by_job ON step_metrics (job_id, step);
CREATE TABLE IF NOT EXISTS checkpoints (
  job_id TEXT NOT NULL,
  step BIGINT NOT NULL,
  generation BIGINT NOT NULL,
  info BYTEA NOT NULL,
  PRIMARY KEY (job_id, step, generation)
);
CREATE TABLE IF NOT EXISTS workers (
  id TEXT PRIMARY KEY,
  node TEXT NOT NULL,
  address TEXT NOT NULL,
  registered_unix_ms BIGINT NOT NULL,
  zone TEXT NOT NULL DEFAULT '',
  rack TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS cordons (
  node TEXT PRIMARY KEY,
  until_unix_ms BIGINT NOT NULL,
  reason BYTEA NOT NULL
);
)sql"},
    // One row: who leads, under which epoch, until when (the database's
    // clock). Epoch 0 is "nobody yet".
    {2, "leader lease",
     R"sql(
CREATE TABLE leader (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  epoch INTEGER NOT NULL,
  holder TEXT NOT NULL,
  address TEXT NOT NULL,
  expires_unix_ms INTEGER NOT NULL
);
INSERT INTO leader (id, epoch, holder, address, expires_unix_ms) VALUES (1, 0, '', '', 0);
)sql",
     R"sql(
CREATE TABLE leader (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  epoch BIGINT NOT NULL,
  holder TEXT NOT NULL,
  address TEXT NOT NULL,
  expires_unix_ms BIGINT NOT NULL
);
INSERT INTO leader (id, epoch, holder, address, expires_unix_ms) VALUES (1, 0, '', '', 0);
)sql"},
    // Every job write takes the next number, so that a standby reads only
    // the jobs changed since its last look (Store::LoadJobsChangedSince).
    {3, "jobs change sequence",
     R"sql(
ALTER TABLE jobs ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS jobs_by_change ON jobs (change_seq);
)sql",
     // (PostgreSQL: from a sequence, rather than MAX(change_seq) + 1, which
     // there walks past the dead index entries of rows rewritten since the
     // last vacuum.)
     R"sql(
ALTER TABLE jobs ADD COLUMN change_seq BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS jobs_by_change ON jobs (change_seq);
CREATE SEQUENCE IF NOT EXISTS jobs_change_seq;
)sql"},
    // The event log: every recorded event of every job under one global,
    // gap-free number (Store::Enqueue's events; LoadJobEvents). seq is set
    // by the writing transaction (MAX + 1 under the write lock and the
    // fence), not taken from a sequence, whose numbers a rolled-back batch
    // would skip; (job_id, idx) makes a retried write store nothing twice.
    {4, "job event log",
     R"sql(
CREATE TABLE IF NOT EXISTS job_events (
  seq INTEGER PRIMARY KEY,
  job_id TEXT NOT NULL,
  idx INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  time_unix_ms INTEGER NOT NULL,
  payload BLOB NOT NULL,
  UNIQUE (job_id, idx)
);
CREATE INDEX IF NOT EXISTS job_events_by_job ON job_events (job_id, seq);
)sql",
     R"sql(
CREATE TABLE IF NOT EXISTS job_events (
  seq BIGINT PRIMARY KEY,
  job_id TEXT NOT NULL,
  idx BIGINT NOT NULL,
  kind INTEGER NOT NULL,
  time_unix_ms BIGINT NOT NULL,
  payload BYTEA NOT NULL,
  UNIQUE (job_id, idx)
);
CREATE INDEX IF NOT EXISTS job_events_by_job ON job_events (job_id, seq);
)sql"},
    // Rank logs where the store is, so every controller of an installation
    // reads the same bytes (Store::AppendLog). A log's bytes are its
    // chunks', in offset order; `lines` is each chunk's text for search
    // (the partial line before it, then the chunk, as valid UTF-8), indexed
    // by trigrams: FTS5 on SQLite, pg_trgm on PostgreSQL (a trusted
    // extension: a database owner may create it).
    {5, "rank logs with a search index",
     R"sql(
CREATE TABLE IF NOT EXISTS rank_logs (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  first_kept INTEGER NOT NULL,
  end_offset INTEGER NOT NULL,
  complete INTEGER NOT NULL,
  carry BLOB NOT NULL,
  PRIMARY KEY (job_id, rank, generation)
);
CREATE TABLE IF NOT EXISTS rank_log_chunks (
  id INTEGER PRIMARY KEY,
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  start_offset INTEGER NOT NULL,
  size INTEGER NOT NULL,
  carried INTEGER NOT NULL,
  data BLOB NOT NULL,
  lines TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS rank_log_chunks_by_log
  ON rank_log_chunks (job_id, rank, generation, start_offset);
CREATE VIRTUAL TABLE IF NOT EXISTS rank_log_search USING fts5(
  lines, content='rank_log_chunks', content_rowid='id', tokenize='trigram case_sensitive 1');
CREATE TRIGGER IF NOT EXISTS rank_log_chunks_indexed AFTER INSERT ON rank_log_chunks BEGIN
  INSERT INTO rank_log_search (rowid, lines) VALUES (new.id, new.lines);
END;
CREATE TRIGGER IF NOT EXISTS rank_log_chunks_unindexed AFTER DELETE ON rank_log_chunks BEGIN
  INSERT INTO rank_log_search (rank_log_search, rowid, lines) VALUES ('delete', old.id, old.lines);
END;
)sql",
     R"sql(
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE TABLE IF NOT EXISTS rank_logs (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  generation BIGINT NOT NULL,
  first_kept BIGINT NOT NULL,
  end_offset BIGINT NOT NULL,
  complete INTEGER NOT NULL,
  carry BYTEA NOT NULL,
  PRIMARY KEY (job_id, rank, generation)
);
CREATE TABLE IF NOT EXISTS rank_log_chunks (
  id BIGSERIAL PRIMARY KEY,
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  generation BIGINT NOT NULL,
  start_offset BIGINT NOT NULL,
  size INTEGER NOT NULL,
  carried INTEGER NOT NULL,
  data BYTEA NOT NULL,
  lines TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS rank_log_chunks_by_log
  ON rank_log_chunks (job_id, rank, generation, start_offset);
CREATE INDEX IF NOT EXISTS rank_log_chunks_search ON rank_log_chunks USING gin (lines gin_trgm_ops);
)sql"},
    // Loom Console: sessions in the store, so a page logged in at one
    // controller stays logged in at the next leader (the session id's
    // SHA-256 and the token's, never either secret); every controller's
    // console URL, so a page whose controller died finds another; and the
    // leader's console URL in the lease row, where a standby's console
    // reads where to send the browser.
    {6, "console sessions and URLs",
     R"sql(
CREATE TABLE IF NOT EXISTS console_sessions (
  id_sha256 TEXT PRIMARY KEY,
  user_name TEXT NOT NULL,
  token_sha256 TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  expires_unix_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS consoles (
  holder TEXT PRIMARY KEY,
  url TEXT NOT NULL,
  seen_unix_ms INTEGER NOT NULL
);
ALTER TABLE leader ADD COLUMN console_url TEXT NOT NULL DEFAULT '';
)sql",
     R"sql(
CREATE TABLE IF NOT EXISTS console_sessions (
  id_sha256 TEXT PRIMARY KEY,
  user_name TEXT NOT NULL,
  token_sha256 TEXT NOT NULL,
  created_unix_ms BIGINT NOT NULL,
  expires_unix_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS consoles (
  holder TEXT PRIMARY KEY,
  url TEXT NOT NULL,
  seen_unix_ms BIGINT NOT NULL
);
ALTER TABLE leader ADD COLUMN console_url TEXT NOT NULL DEFAULT '';
)sql"},
};

// Columns a SQLite file from before schema_migrations may lack (added by
// earlier releases with ALTER TABLE): {table, column, declaration}.
struct AddedColumn {
  const char* table;
  const char* column;
  const char* declaration;
};
constexpr AddedColumn kSqliteAddedColumns[] = {
    {"workers", "zone", "TEXT NOT NULL DEFAULT ''"},  // added for deployment labels
    {"workers", "rack", "TEXT NOT NULL DEFAULT ''"},
};

absl::Status AddMissingSqliteColumns(SqlConnection& conn) {
  for (const AddedColumn& c : kSqliteAddedColumns) {
    auto info = conn.Run(absl::StrCat("PRAGMA table_info(", c.table, ");"), {});
    if (!info.ok()) return info.status();
    bool present = false;
    for (const SqlRow& row : info->rows) present = present || row[1].s == c.column;
    if (present) continue;
    absl::Status s = conn.Exec(
        absl::StrCat("ALTER TABLE ", c.table, " ADD COLUMN ", c.column, " ", c.declaration, ";"));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

constexpr const char* kMigrationsTable = R"sql(
CREATE TABLE IF NOT EXISTS schema_migrations (
  version INTEGER PRIMARY KEY,
  description TEXT NOT NULL,
  applied_unix_ms BIGINT NOT NULL
);
)sql";

}  // namespace

int64_t LatestSchemaVersion() { return std::end(kMigrations)[-1].version; }

absl::StatusOr<int64_t> SchemaVersion(SqlConnection& conn) {
  auto exists = conn.Run(conn.dialect() == SqlDialect::kPostgres
                             ? "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = "
                               "'schema_migrations' AND table_schema = current_schema();"
                             : "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND "
                               "name = 'schema_migrations';",
                         {});
  if (!exists.ok()) return exists.status();
  if (exists->rows.empty() || exists->rows[0][0].i == 0) return 0;
  auto version = conn.Run("SELECT COALESCE(MAX(version), 0) FROM schema_migrations;", {});
  if (!version.ok()) return version.status();
  return version->rows[0][0].i;
}

absl::Status Migrate(SqlConnection& conn) {
  absl::Status s = conn.BeginWrite();
  if (!s.ok()) return s;
  auto fail = [&conn](absl::Status err) {
    conn.Rollback();
    return err;
  };
  if (conn.dialect() == SqlDialect::kPostgres) {
    // Controllers starting together migrate one at a time (the lock ends
    // with the transaction).
    auto locked = conn.Run("SELECT pg_advisory_xact_lock(7374656);", {});
    if (!locked.ok()) return fail(locked.status());
  }
  if (s = conn.Exec(kMigrationsTable); !s.ok()) return fail(s);
  absl::StatusOr<int64_t> current = SchemaVersion(conn);
  if (!current.ok()) return fail(current.status());
  if (*current > LatestSchemaVersion()) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("the database ", conn.Describe(), " has schema version ", *current,
                     ", newer than this loom-controller knows (", LatestSchemaVersion(),
                     "): a newer Loom wrote it; run that version (or newer) of loom-controller")));
  }
  for (const Migration& m : kMigrations) {
    if (m.version <= *current) continue;
    s = conn.Exec(conn.dialect() == SqlDialect::kPostgres ? m.postgres : m.sqlite);
    if (s.ok() && m.version == 1 && conn.dialect() == SqlDialect::kSqlite) {
      s = AddMissingSqliteColumns(conn);
    }
    if (!s.ok()) {
      return fail(absl::Status(s.code(), absl::StrCat("schema migration ", m.version, " (",
                                                      m.description, "): ", s.message())));
    }
    auto recorded = conn.Run(
        absl::StrCat("INSERT INTO schema_migrations (version, description, applied_unix_ms) "
                     "VALUES (?, ?, ",
                     conn.NowUnixMs(), ");"),
        {Int(m.version), Text(m.description)});
    if (!recorded.ok()) return fail(recorded.status());
  }
  return conn.Commit();
}

}  // namespace loom::controller::store
