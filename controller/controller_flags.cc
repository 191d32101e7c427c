#include "controller/controller_flags.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "controller/store/postgres_connection.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "gRPC listen address (port 0 = pick one)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0", "/metrics listen address");
ABSL_FLAG(std::string, data_dir, "", "directory for the job store (required)");
ABSL_FLAG(std::string, token_file, "",
          "retired: workers and people no longer share a token (use --worker_token_file and "
          "--users_file)");
ABSL_FLAG(std::string, worker_token_file, "",
          "file holding the workers' bearer token (mode 0600, or 0640/0440 with a group); "
          "workers with a certificate from --tls_client_ca need none");
ABSL_FLAG(std::string, users_file, "",
          "the people who may call JobService: '<name> <reader|user|admin> [sha256:<hex>]' per "
          "line (loomctl users add); re-read when it changes");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA whose client certificates identify workers ('worker:<node>') and users "
          "('user:<name>'); needs --tls_cert and --tls_key");
ABSL_FLAG(std::string, health_listen, "",
          "also serve grpc.health.v1 (only) in plaintext here, for kubelet probes and the "
          "image's HEALTHCHECK, which speak no TLS (e.g. 0.0.0.0:7071); empty: none");
ABSL_FLAG(int32_t, console_port, -1,
          "serve Loom Console's JSON API (/api/v1/, docs/console.md) on this port of the --listen "
          "host, over HTTPS with --tls_cert/--tls_key; 0 = pick a free port, -1 = no console");
ABSL_FLAG(std::string, console_url, "",
          "the URL browsers reach this console at, \"https://host[:port]\" with no path (behind "
          "a Service or an Ingress: its URL); a standby sends browsers to the leader's, and a "
          "page follows the leader to it; default: https://<--listen host>:<console port>");
ABSL_FLAG(absl::Duration, console_session_lifetime, absl::Hours(12),
          "how long a Loom Console login lasts (it ends sooner on logout, or when its token is "
          "revoked)");
ABSL_FLAG(bool, allow_plaintext, false,
          "serve without TLS (no --tls_cert): tokens then cross the network in the clear");
ABSL_FLAG(std::string, data_root, "",
          "comma-separated directories that job data paths must lie under (after resolving "
          ".. and symlinks); empty: unconfined, with a warning");
ABSL_FLAG(std::string, checkpoint_root, "",
          "comma-separated absolute paths that a job's checkpoint.dir must lie beneath; jobs "
          "without one checkpoint under the first, one directory per job; workers must see "
          "them at the same paths (default: <data_dir>/checkpoints)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate for TLS on the gRPC port");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for TLS on the gRPC port");
ABSL_FLAG(std::string, ready_file, "",
          "once serving, write {grpc_address, metrics_address[, console_url]} JSON here");
ABSL_FLAG(int64_t, log_max_bytes, 16 << 20,
          "keep at most this many bytes (the newest) of each rank's log per attempt, as "
          "workers ship them (loomctl logs); at least 4096");
ABSL_FLAG(absl::Duration, log_retention, absl::Hours(168),
          "delete a job's rank logs this long after the job ended (e.g. 72h; 0 = at once)");
ABSL_FLAG(std::string, queues, "",
          "YAML file of the shared cluster's queues, quotas, cohorts and priority classes "
          "(docs/scheduling.md); reloaded on SIGHUP. Empty: one unlimited queue, \"default\"");
ABSL_FLAG(double, worker_timeout_s, 10.0, "declare a worker dead after this many silent seconds");
ABSL_FLAG(double, heartbeat_interval_s, 0.5, "heartbeat period workers are told to use");
ABSL_FLAG(std::string, store, "",
          "where the job store lives: empty = SQLite in --data_dir (this controller alone); "
          "postgresql://[user@]host[:port]/database = one database several controllers share, "
          "one leading and the others standing by (docs/ha.md). No password in the URL: give it "
          "in --store_password_file or $LOOM_STORE_PASSWORD");
ABSL_FLAG(std::string, store_password_file, "",
          "file holding the PostgreSQL password (readable by this user only)");
ABSL_FLAG(double, store_wait_s, 600,
          "with a PostgreSQL --store: how long to keep trying to reach it at start-up (a "
          "controller that steps down starts again as a standby, and must wait out a "
          "partition from its database)");
ABSL_FLAG(double, lease_s, 2.0,
          "with a PostgreSQL --store: the leader lease, in seconds; a standby takes over this "
          "long after the leader's last renewal");
ABSL_FLAG(double, lease_renew_s, 0.5, "with a PostgreSQL --store: how often the leader renews");
ABSL_FLAG(std::string, advertise_address, "",
          "the host:port clients and workers reach this controller at (standbys name the leader "
          "by it); default: the gRPC listen address");
ABSL_FLAG(int32_t, max_watchers, 256,
          "most WatchJob streams served at once (loomctl watch / submit --follow); one more is "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, finished_steps_kept, 20000,
          "a finished job's step series is thinned to this many evenly spaced steps (first and "
          "last kept); 0 keeps every step");
ABSL_FLAG(int64_t, finished_events_kept, 10000,
          "a finished job keeps its newest this many event log entries besides its transitions "
          "(recovery events, checkpoints), all of which it keeps; 0 keeps every entry");

namespace loom::controller {

absl::StatusOr<std::unique_ptr<Store>> OpenStoreFromFlags(const std::string& data_dir,
                                                          absl::Duration lease) {
  const std::string url = absl::GetFlag(FLAGS_store);
  if (url.empty()) return Store::Open(data_dir);
  if (!loom::controller::store::IsPostgresUrl(url)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store: \"", url,
                     "\" is not a postgresql:// URL (leave it empty for SQLite in "
                     "--data_dir)"));
  }
  if (loom::controller::store::PostgresUrlHasPassword(url)) {
    return absl::InvalidArgumentError(
        "--store: the URL carries a password, which every user of this machine can read on "
        "the command line; put it in --store_password_file or $LOOM_STORE_PASSWORD instead");
  }
  loom::controller::store::PostgresOptions options;
  options.url = url;
  // A leader paused inside a transaction must not hold the lease row past
  // half its lease (store/postgres_connection.h).
  options.idle_in_transaction_timeout_ms =
      static_cast<int>(std::max<int64_t>(100, absl::ToInt64Milliseconds(lease) / 2));
  options.lock_timeout_ms = options.idle_in_transaction_timeout_ms;
  if (const std::string file = absl::GetFlag(FLAGS_store_password_file); !file.empty()) {
    std::ifstream in(file);
    if (!in) return absl::NotFoundError(absl::StrCat("--store_password_file: cannot read ", file));
    std::getline(in, options.password);
  } else if (const char* env = std::getenv("LOOM_STORE_PASSWORD"); env != nullptr) {
    options.password = env;
  }
  return Store::OpenPostgres(std::move(options));
}

}  // namespace loom::controller
