// loom-controller's flags (defined in controller_flags.cc, read by
// controller_main.cc), and the store they name.
#ifndef LOOM_CONTROLLER_CONTROLLER_FLAGS_H_
#define LOOM_CONTROLLER_CONTROLLER_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/store/store.h"

ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, metrics_listen);
ABSL_DECLARE_FLAG(std::string, data_dir);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, worker_token_file);
ABSL_DECLARE_FLAG(std::string, users_file);
ABSL_DECLARE_FLAG(std::string, tls_client_ca);
ABSL_DECLARE_FLAG(std::string, health_listen);
ABSL_DECLARE_FLAG(int32_t, console_port);
ABSL_DECLARE_FLAG(std::string, console_url);
ABSL_DECLARE_FLAG(absl::Duration, console_session_lifetime);
ABSL_DECLARE_FLAG(bool, allow_plaintext);
ABSL_DECLARE_FLAG(std::string, data_root);
ABSL_DECLARE_FLAG(std::string, checkpoint_root);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, ready_file);
ABSL_DECLARE_FLAG(int64_t, log_max_bytes);
ABSL_DECLARE_FLAG(absl::Duration, log_retention);
ABSL_DECLARE_FLAG(std::string, queues);
ABSL_DECLARE_FLAG(double, worker_timeout_s);
ABSL_DECLARE_FLAG(double, heartbeat_interval_s);
ABSL_DECLARE_FLAG(std::string, store);
ABSL_DECLARE_FLAG(std::string, store_password_file);
ABSL_DECLARE_FLAG(double, store_wait_s);
ABSL_DECLARE_FLAG(double, lease_s);
ABSL_DECLARE_FLAG(double, lease_renew_s);
ABSL_DECLARE_FLAG(std::string, advertise_address);
ABSL_DECLARE_FLAG(int32_t, max_watchers);
ABSL_DECLARE_FLAG(int64_t, finished_steps_kept);
ABSL_DECLARE_FLAG(int64_t, finished_events_kept);

namespace loom::controller {

// The store --store names: SQLite in `data_dir`, or PostgreSQL with the
// password from --store_password_file or $LOOM_STORE_PASSWORD, its session
// limits set for a lease of `lease`.
absl::StatusOr<std::unique_ptr<Store>> OpenStoreFromFlags(const std::string& data_dir,
                                                          absl::Duration lease);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_CONTROLLER_FLAGS_H_
