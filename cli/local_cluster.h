// `loomctl local ...`: a complete Loom on one machine. Starts a controller
// and N workers as detached daemons whose state lives under a home directory
// (default ~/.loom):
//   token                the local user's token (an admin in `users`), 0600
//   users                the controller's users file (controller/service/access.h)
//   worker-token         the workers' token (they also hold certificates)
//   tls/                 the cluster CA and the certificates it issued
//                        (cli/cluster_ca.h): the controller serves TLS,
//                        each worker proves its node with a client
//                        certificate "worker:local-<i>", and user-local.pem
//                        ("user:local") is the local user's certificate
//   run/controller.json  {grpc_address, metrics_address, console_url, pid, role} (ready
//                        file); with --ha, controller-0.json and
//                        controller-1.json, and postgres.json
//                        (cli/local_postgres.h)
//   run/worker-<i>.json  {metrics_address, pid}
//   run/<daemon>.args    its command line, one argument a line (for restart;
//                        the controller's with the gRPC address it got, so
//                        a restarted controller keeps it and workers find it)
//   logs/*.log           daemon logs
//   controller/          the controller's data dir (job store, checkpoints)
//   workers/<i>/         each worker's work dir (rank logs)
#ifndef LOOM_CLI_LOCAL_CLUSTER_H_
#define LOOM_CLI_LOCAL_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::cli {

struct LocalClusterOptions {
  std::string home;         // state directory
  std::string bin_dir;      // where loom-controller / loom-worker live
  int workers = 2;
  int slots_per_worker = 1;
  uint64_t memory_bytes_per_worker = 0;  // loom-worker --memory_bytes (0 = the host's)
  std::string gpus_per_worker = "auto";  // loom-worker --gpus: a count or auto (NVML)
  absl::Duration start_timeout = absl::Seconds(30);  // for each daemon to become ready
  double worker_timeout_s = 10;  // passed to the controller
  // The controller's --queues file (absolute); empty: the default queue.
  std::string queues_file;
  // Each worker's --notice_url, "{node}" replaced by its node ("" = none).
  std::string notice_url;
  // Each worker's --warm_ranks. None by default: a local cluster's workers
  // share one machine, where each worker's idle LibTorch processes (and
  // their loading, which competes with training for the same cores) would
  // add up; a worker alone on its node keeps one per slot.
  int warm_ranks = 0;
  // Where each daemon runs, for fault tests that give every daemon its own
  // network namespace (tests/netns_lab.h): a command line prefix that the
  // daemon's command is appended to (e.g. {"ip", "netns", "exec", "ns1"};
  // kept in its run/<daemon>.args, so `local restart` starts it in the same
  // place), the host the controller listens on, and the address each
  // worker gives its ranks' peers. Empty: this host's loopback.
  std::vector<std::string> controller_prefix;
  std::string controller_host = "127.0.0.1";
  std::vector<std::vector<std::string>> worker_prefix;  // by worker index
  std::vector<std::string> worker_address;              // by worker index
  // The controller's --data_root: where job data may be read. Empty: the
  // home directory and the directory `local up` ran in. Checkpoint
  // directories may be named under <home>/checkpoints (and jobs that name
  // none get <home>/controller/checkpoints/<job id>).
  std::vector<std::string> data_roots;
  // `local up --ha`: a PostgreSQL server (cli/local_postgres.h)
  // and two controllers sharing it, controller-0 and controller-1, each
  // with its own data dir (<home>/controller-<i>: rank logs) and the same
  // checkpoint roots; one leads, the other stands by, and the workers and
  // loomctl follow whichever leads.
  bool ha = false;
  // `local up --store postgres`: one controller, as without --ha, but on a
  // PostgreSQL server of the cluster's own instead of SQLite (ha implies
  // it).
  bool postgres = false;
  // With ha, for fault tests: where each controller runs and listens (by
  // index; default: controller_prefix and controller_host), and where the
  // database runs: with postgres_host set it listens on postgres_host:5432
  // over TCP (as well as its socket) and the controllers connect there, so
  // that a test can cut one controller off from it.
  std::vector<std::vector<std::string>> ha_controller_prefix;
  std::vector<std::string> ha_controller_host;
  std::vector<std::string> postgres_prefix;
  std::string postgres_host;
  // Extra flags for every controller (e.g. --lease_s).
  std::vector<std::string> controller_flags;
};

struct DaemonInfo {
  std::string name;  // "controller", "worker-0", ...
  int pid = 0;
  bool alive = false;
  std::string grpc_address;     // controller only
  std::string metrics_address;
  std::string console_url;  // controller only, when it serves Loom Console
  std::string log_path;
  // A controller's "active" or "standby" (as its ready file last said: a
  // killed one keeps its last word, with alive false); "database" for the
  // PostgreSQL server of --ha; empty for workers.
  std::string role;
};

// Starts the cluster and waits until the controller serves and every
// worker has registered. FAILED_PRECONDITION if one is already up.
absl::StatusOr<std::vector<DaemonInfo>> LocalUp(const LocalClusterOptions& options);

// SIGTERM to every daemon, SIGKILL after `grace`. OK if nothing was up.
absl::Status LocalDown(const std::string& home, absl::Duration grace = absl::Seconds(10));

// Where the workers of the cluster at `home` keep in-memory snapshots:
// worker N's --snapshot_dir is <this>/worker-N, a directory of its own
// under /dev/shm standing for its node's memory ("" without /dev/shm).
// LocalDown removes it.
std::string LocalSnapshotRoot(const std::string& home);

// Restarts one daemon of the cluster ("controller" or "worker-<i>") with
// its original command line: a live one gets SIGTERM (SIGKILL with `kill`
// or after `grace`), a dead one (crashed, kill -9) is just started again.
// Waits until it is ready. NOT_FOUND for a daemon the cluster never had.
absl::StatusOr<DaemonInfo> LocalRestart(const std::string& home, const std::string& name,
                                        bool kill_first, absl::Duration grace = absl::Seconds(10),
                                        absl::Duration start_timeout = absl::Seconds(30));

// What the run files say, with liveness checked.
std::vector<DaemonInfo> LocalStatus(const std::string& home);

// Reads a ready file written by a daemon.
absl::StatusOr<DaemonInfo> ReadReadyFile(const std::string& path);

// A channel to the controller of the local cluster under `home`, at
// `address`: TLS, trusting the cluster CA (<home>/tls/ca.pem).
absl::StatusOr<std::shared_ptr<grpc::Channel>> LocalControllerChannel(
    const std::string& home, const std::string& address,
    const grpc::ChannelArguments& args = grpc::ChannelArguments());

}  // namespace loom::cli

#endif  // LOOM_CLI_LOCAL_CLUSTER_H_
