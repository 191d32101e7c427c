// The PostgreSQL server of `loomctl local up --ha`: the database
// the local cluster's two controllers share. A daemon like the others
// (run/postgres.json, run/postgres.args, logs/postgres.log): `initdb` on
// first use, the server on a unix socket only (no TCP port), trust
// authentication for the superuser "loom" (the socket's directory is the
// only way in: 0700, its owner's).
//
// Its data lives in <home>/postgres; under root, whom PostgreSQL refuses to
// run as, in /var/lib/loom-local/<hash of home> owned by the `postgres` user
// Debian's package makes (a home under /root is not reachable by it), and
// the server runs as that user.
#ifndef LOOM_CLI_LOCAL_POSTGRES_H_
#define LOOM_CLI_LOCAL_POSTGRES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/local_cluster.h"

namespace loom::cli {

// Where the server keeps its data and socket for the cluster under `home`.
std::string LocalPostgresDir(const std::string& home);
// The controllers' --store URL for it: its socket, or `tcp_host`:5432.
std::string LocalPostgresUrl(const std::string& home, const std::string& tcp_host = "");

// initdb (first time only), then starts the server and waits until it
// answers and database "loom" exists; writes run/postgres.{json,args}.
// `prefix` runs it elsewhere (a network namespace: "ip netns exec NS");
// with `tcp_host` it also listens on tcp_host:5432.
absl::StatusOr<DaemonInfo> StartLocalPostgres(const std::string& home, absl::Duration start_timeout,
                                              const std::vector<std::string>& prefix = {},
                                              const std::string& tcp_host = "");
// Deletes the server's data (for tests and throw-away clusters: `local down`
// keeps it, like the rest of the home). FAILED_PRECONDITION while it runs.
absl::Status RemoveLocalPostgres(const std::string& home);

// After Spawn of run/postgres.args (LocalRestart): waits for it to answer
// and writes run/postgres.json.
absl::StatusOr<DaemonInfo> WaitLocalPostgres(const std::string& home, int pid,
                                             absl::Duration start_timeout);

}  // namespace loom::cli

#endif  // LOOM_CLI_LOCAL_POSTGRES_H_
