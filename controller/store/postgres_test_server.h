// A PostgreSQL server of a test's (or a benchmark's) own: `initdb` into a
// fresh temporary directory, the server listening on a unix socket there
// (and on a loopback port when asked), stopped and its directory removed
// when this object is destroyed. If the test process dies the server gets
// SIGQUIT too (parent-death signal), so no server outlives a crashed test.
//
// PostgreSQL refuses to run as root: under root, initdb and the server run
// as the `postgres` user Debian's package creates (or `nobody`).
#ifndef LOOM_CONTROLLER_STORE_POSTGRES_TEST_SERVER_H_
#define LOOM_CONTROLLER_STORE_POSTGRES_TEST_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::controller::store {

class PostgresTestServer {
 public:
  struct Options {
    // Also listen on this loopback address (e.g. "127.0.0.1"), on a free
    // port; empty: the unix socket only.
    std::string tcp_address;
    // fsync off makes tests fast; a benchmark that reports commit latency
    // keeps it on.
    bool fsync = false;
    // More server settings, "name=value" each (postgres -c), after the
    // defaults above: a benchmark tries the settings it recommends.
    std::vector<std::string> settings;
  };
  static absl::StatusOr<std::unique_ptr<PostgresTestServer>> Start(Options options);
  static absl::StatusOr<std::unique_ptr<PostgresTestServer>> Start() { return Start(Options()); }
  ~PostgresTestServer();

  // Makes an empty database `name` (owned by the superuser "loom").
  absl::Status CreateDatabase(const std::string& name);
  // A libpq URL for `database` over the unix socket (user loom, no password).
  std::string SocketUrl(const std::string& database) const;
  // Over TCP to tcp_address:port(); empty without tcp_address.
  std::string TcpUrl(const std::string& database) const;
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }

  // Stops the server as a crash would (SIGKILL), and starts it again on the
  // same directory and port (crash recovery replays its WAL).
  absl::Status Kill();
  absl::Status Restart();

 private:
  PostgresTestServer() = default;
  absl::Status Launch();
  absl::Status WaitReady();

  Options options_;
  std::string bindir_;
  std::string dir_;  // temporary; holds data/, the socket and server.log
  int port_ = 0;
  pid_t pid_ = -1;
  uid_t uid_ = 0;  // who runs the server (0: this process's user)
  gid_t gid_ = 0;
};

}  // namespace loom::controller::store

#endif  // LOOM_CONTROLLER_STORE_POSTGRES_TEST_SERVER_H_
