#include "controller/store/sqlite_connection.h"

#include <sqlite3.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::controller::store {

absl::StatusOr<std::unique_ptr<SqliteConnection>> SqliteConnection::Open(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open store ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<SqliteConnection> conn(new SqliteConnection(db, path));
  // WAL: readers never block the writer.
  absl::Status s =
      conn->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;");
  if (!s.ok()) return s;
  return conn;
}

SqliteConnection::~SqliteConnection() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

absl::Status SqliteConnection::Error(absl::string_view what) const {
  return absl::InternalError(absl::StrCat("store: ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status SqliteConnection::Exec(absl::string_view script) {
  char* err = nullptr;
  const std::string sql(script);
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("store: ", msg));
  }
  return absl::OkStatus();
}

absl::StatusOr<SqlResult> SqliteConnection::Run(absl::string_view sql,
                                                std::initializer_list<SqlParam> params) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) !=
        SQLITE_OK) {
      return Error(absl::StrCat("prepare \"", sql.substr(0, 60), "\""));
    }
    it = statements_.emplace(std::string(sql), stmt).first;
  }
  sqlite3_stmt* stmt = it->second;
  // Back to ready with no bindings on every exit: a statement left active
  // would keep a read open across transactions.
  struct ResetOnExit {
    sqlite3_stmt* stmt;
    ~ResetOnExit() {
      sqlite3_reset(stmt);
      sqlite3_clear_bindings(stmt);
    }
  } reset{stmt};
  int i = 1;
  for (const SqlParam& p : params) {
    switch (p.kind) {
      case SqlParam::Kind::kInt:
        sqlite3_bind_int64(stmt, i, p.i);
        break;
      case SqlParam::Kind::kText:
        sqlite3_bind_text(stmt, i, p.s.data(), static_cast<int>(p.s.size()), SQLITE_STATIC);
        break;
      case SqlParam::Kind::kBlob:
        sqlite3_bind_blob(stmt, i, p.s.data(), static_cast<int>(p.s.size()), SQLITE_STATIC);
        break;
    }
    ++i;
  }
  SqlResult result;
  const int columns = sqlite3_column_count(stmt);
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    SqlRow row(columns);
    for (int c = 0; c < columns; ++c) {
      const int type = sqlite3_column_type(stmt, c);
      if (type == SQLITE_INTEGER || type == SQLITE_FLOAT) {
        row[c].i = sqlite3_column_int64(stmt, c);
      } else if (const void* p = sqlite3_column_blob(stmt, c); p != nullptr) {
        row[c].s.assign(static_cast<const char*>(p), sqlite3_column_bytes(stmt, c));
      }
    }
    result.rows.push_back(std::move(row));
  }
  if (rc != SQLITE_DONE) return Error(absl::StrCat("run \"", sql.substr(0, 60), "\""));
  result.affected = sqlite3_changes(db_);
  return result;
}

}  // namespace loom::controller::store
