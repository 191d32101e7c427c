#include "tests/tls_controller.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "cli/cluster_ca.h"
#include "cli/local_cluster.h"
#include "common/file_util.h"
#include "tests/test_util.h"

namespace loom::testing {

absl::Status TlsController::Start(const std::string& bin_dir, const std::string& dir,
                                  const std::string& users, const std::string& flags) {
  tls_ = dir + "/tls";
  if (absl::Status s = cli::EnsureClusterCa(tls_); !s.ok()) return s;
  auto server = cli::IssueCertificate(tls_, "controller", "loom-controller", true,
                                      {"127.0.0.1", "localhost"});
  if (!server.ok()) return server.status();
  if (absl::Status s = WritePrivateFile(dir + "/worker-token", "the-workers-token\n"); !s.ok()) {
    return s;
  }
  if (absl::Status s = WritePrivateFile(dir + "/users", users); !s.ok()) return s;
  const std::string ready = dir + "/controller.json";
  auto started = RunCommand(absl::StrCat(
      bin_dir, "/loom-controller --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --data_dir=",
      dir, "/data --users_file=", dir, "/users --worker_token_file=", dir,
      "/worker-token --tls_cert=", server->cert_path, " --tls_key=", server->key_path,
      " --tls_client_ca=", tls_, "/ca.pem --ready_file=", ready, " ", flags, " > ", dir,
      "/controller.log 2>&1 & echo $!"));
  pid_ = atoi(started.out.c_str());
  if (pid_ <= 0) return absl::InternalError("the controller did not start: " + started.err);
  for (int i = 0; i < 200 && !cli::ReadReadyFile(ready).ok(); ++i) usleep(100 * 1000);
  auto info = cli::ReadReadyFile(ready);
  if (!info.ok()) {
    return absl::UnavailableError(
        absl::StrCat("no ready file; the controller's log:\n",
                     ReadFile(dir + "/controller.log").value_or("(none)")));
  }
  grpc_address_ = info->grpc_address;
  console_url_ = info->console_url;
  return absl::OkStatus();
}

TlsController::~TlsController() {
  if (pid_ > 0) kill(pid_, SIGTERM);
}

}  // namespace loom::testing
