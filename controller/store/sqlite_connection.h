// SqlConnection over one SQLite database file (the default, embedded store).
#ifndef LOOM_CONTROLLER_STORE_SQLITE_CONNECTION_H_
#define LOOM_CONTROLLER_STORE_SQLITE_CONNECTION_H_

#include <map>
#include <memory>
#include <string>

#include "controller/store/sql_connection.h"

struct sqlite3;
struct sqlite3_stmt;

namespace loom::controller::store {

class SqliteConnection : public SqlConnection {
 public:
  // Opens (creating if needed) the database at `path` in WAL mode with
  // synchronous=FULL: a committed transaction survives power loss, not only
  // a crash.
  static absl::StatusOr<std::unique_ptr<SqliteConnection>> Open(const std::string& path);
  ~SqliteConnection() override;

  SqlDialect dialect() const override { return SqlDialect::kSqlite; }
  std::string Describe() const override { return path_; }
  absl::Status Exec(absl::string_view script) override;
  absl::StatusOr<SqlResult> Run(absl::string_view sql,
                                std::initializer_list<SqlParam> params) override;

 private:
  SqliteConnection(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Error(absl::string_view what) const;

  sqlite3* db_;  // owned
  std::string path_;
  // Prepared statements by their SQL (finalized before the database closes).
  std::map<std::string, sqlite3_stmt*, std::less<>> statements_;
};

}  // namespace loom::controller::store

#endif  // LOOM_CONTROLLER_STORE_SQLITE_CONNECTION_H_
