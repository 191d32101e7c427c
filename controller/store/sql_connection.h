// One connection to the controller's database, behind which the embedded
// SQLite file and a PostgreSQL server look the same to the Store above.
//
// SQL is written once, for both: parameters are `?` (the PostgreSQL
// connection numbers them $1, $2, ... in order), upserts are
// `INSERT ... ON CONFLICT (...) DO UPDATE`, and what differs between the two
// (column types in the schema, the row id, row locks, the clock) is asked of
// dialect() or SqlDialect below.
//
// Not thread-safe: the Store serialises every use under its own mutex.
#ifndef LOOM_CONTROLLER_STORE_SQL_CONNECTION_H_
#define LOOM_CONTROLLER_STORE_SQL_CONNECTION_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::controller::store {

enum class SqlDialect { kSqlite, kPostgres };

// A statement parameter. Text and blob parameters do not own their bytes:
// they must outlive the Run call they are passed to.
struct SqlParam {
  enum class Kind { kInt, kText, kBlob };
  Kind kind = Kind::kInt;
  int64_t i = 0;
  absl::string_view s;
};
inline SqlParam Int(int64_t v) { return {SqlParam::Kind::kInt, v, {}}; }
inline SqlParam Text(absl::string_view v) { return {SqlParam::Kind::kText, 0, v}; }
inline SqlParam Blob(absl::string_view v) { return {SqlParam::Kind::kBlob, 0, v}; }

// One column of a result row: integers in `i`, text and blobs in `s`.
struct SqlValue {
  int64_t i = 0;
  std::string s;
};
using SqlRow = std::vector<SqlValue>;

struct SqlResult {
  std::vector<SqlRow> rows;
  int64_t affected = 0;  // rows an INSERT, UPDATE or DELETE changed
};

class SqlConnection {
 public:
  virtual ~SqlConnection() = default;

  virtual SqlDialect dialect() const = 0;
  // Where the data lives, for messages ("/var/lib/loom/loom.db",
  // "postgresql database loom on /tmp/x:5432").
  virtual std::string Describe() const = 0;

  // Runs statements without parameters or results (schema, BEGIN, COMMIT).
  virtual absl::Status Exec(absl::string_view script) = 0;
  // Runs one statement with `params` bound to its `?`s in order, and returns
  // its rows. The statement is prepared once per connection and reused.
  // Errors: UNAVAILABLE when the database cannot be reached (the next call
  // reconnects), INTERNAL for anything else, with the database's message.
  virtual absl::StatusOr<SqlResult> Run(absl::string_view sql,
                                        std::initializer_list<SqlParam> params) = 0;

  // BEGIN of a transaction that writes: SQLite takes its write lock at once
  // (BEGIN IMMEDIATE), so that two writers never deadlock upgrading.
  absl::Status BeginWrite() {
    return Exec(dialect() == SqlDialect::kSqlite ? "BEGIN IMMEDIATE;" : "BEGIN;");
  }
  // COMMIT; a failed COMMIT is rolled back so that the next BEGIN works.
  absl::Status Commit() {
    absl::Status s = Exec("COMMIT;");
    if (!s.ok()) Exec("ROLLBACK;").IgnoreError();
    return s;
  }
  void Rollback() { Exec("ROLLBACK;").IgnoreError(); }

  // ` FOR UPDATE` where a SELECT must lock the rows it reads (PostgreSQL);
  // SQLite's write transaction already excludes every other writer.
  const char* ForUpdate() const { return dialect() == SqlDialect::kPostgres ? " FOR UPDATE" : ""; }
  // The database's own clock in Unix milliseconds, as an SQL expression:
  // leases are timed by the one clock every controller shares.
  const char* NowUnixMs() const {
    return dialect() == SqlDialect::kPostgres
               ? "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
               : "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
  }
  // The column that numbers step rows in insertion order.
  const char* StepRowId() const { return dialect() == SqlDialect::kPostgres ? "row_id" : "rowid"; }
};

}  // namespace loom::controller::store

#endif  // LOOM_CONTROLLER_STORE_SQL_CONNECTION_H_
