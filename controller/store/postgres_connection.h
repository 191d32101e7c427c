// SqlConnection to a PostgreSQL server through libpq.
//
// Reaching the server is bounded: connecting gives up after
// connect_timeout_seconds, and a connection whose sent data goes
// unacknowledged for tcp_user_timeout_ms (a partition) fails instead of
// hanging, so that a leader cut off from the database finds out within its
// lease. A lost connection fails the call with UNAVAILABLE; the next call
// outside a transaction connects again. A transaction never continues on a
// new connection: every call inside it fails until its ROLLBACK.
#ifndef LOOM_CONTROLLER_STORE_POSTGRES_CONNECTION_H_
#define LOOM_CONTROLLER_STORE_POSTGRES_CONNECTION_H_

#include <map>
#include <memory>
#include <string>

#include "controller/store/sql_connection.h"

typedef struct pg_conn PGconn;

namespace loom::controller::store {

struct PostgresOptions {
  // A libpq connection URL without a password, e.g.
  // postgresql://loom@db.example:5432/loom?sslmode=verify-full or
  // postgresql:///loom?host=/run/loom-pg (a unix socket directory).
  std::string url;
  // The password, read from a file or the environment by the caller; empty
  // for none (peer or trust authentication, or libpq's own PGPASSFILE).
  std::string password;
  int connect_timeout_seconds = 3;
  int tcp_user_timeout_ms = 2000;
  // Server-side limits on every session of this connection. A controller
  // paused (SIGSTOP, a frozen VM) or cut off inside a transaction holds the
  // lease row's lock; the server ends such a session once it has been idle
  // in its transaction this long, so that a standby can take the lease
  // (and the paused one's transaction commits nothing). Waiting for a lock
  // gives up after lock_timeout_ms (the caller tries again). Keep both well
  // under the lease. 0 leaves the server's setting.
  int idle_in_transaction_timeout_ms = 1000;
  int lock_timeout_ms = 1000;
};

// True when `url` carries a password (postgresql://user:secret@host/...
// or ?password=...): Loom refuses those, since a command line is visible to
// every user of the machine.
bool PostgresUrlHasPassword(absl::string_view url);
// True for postgres:// and postgresql:// URLs.
bool IsPostgresUrl(absl::string_view url);

class PostgresConnection : public SqlConnection {
 public:
  // Connects. Errors carry libpq's message: UNAVAILABLE when the server
  // cannot be reached (worth waiting for), PERMISSION_DENIED when it refuses
  // the credentials, FAILED_PRECONDITION when the database or the role does
  // not exist.
  static absl::StatusOr<std::unique_ptr<PostgresConnection>> Open(PostgresOptions options);
  ~PostgresConnection() override;

  SqlDialect dialect() const override { return SqlDialect::kPostgres; }
  std::string Describe() const override { return describe_; }
  absl::Status Exec(absl::string_view script) override;
  absl::StatusOr<SqlResult> Run(absl::string_view sql,
                                std::initializer_list<SqlParam> params) override;

 private:
  explicit PostgresConnection(PostgresOptions options) : options_(std::move(options)) {}
  absl::Status Connect();
  // Before a call: connects again after a lost connection, unless a
  // transaction was open on it (then UNAVAILABLE until ROLLBACK).
  absl::Status Ready(bool is_rollback);
  absl::Status ErrorOf(const void* result, absl::string_view what);

  PostgresOptions options_;
  std::string describe_;
  PGconn* conn_ = nullptr;  // owned
  bool broken_ = false;     // the connection was lost; connect before the next call
  bool in_transaction_ = false;
  // Prepared statement names by their SQL (forgotten with the connection).
  std::map<std::string, std::string, std::less<>> statements_;
};

}  // namespace loom::controller::store

#endif  // LOOM_CONTROLLER_STORE_POSTGRES_CONNECTION_H_
