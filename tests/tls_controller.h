// A real loom-controller for integration tests that call it as different
// callers: TLS with a cluster CA of its own (which also vouches for client
// certificates), a users file, a workers' token, gRPC and metrics on
// 127.0.0.1:0, everything under one directory.
#ifndef LOOM_TESTS_TLS_CONTROLLER_H_
#define LOOM_TESTS_TLS_CONTROLLER_H_

#include <string>

#include "absl/status/status.h"

namespace loom::testing {

class TlsController {
 public:
  // Starts bin_dir/loom-controller in `dir` with `users` as its users file
  // (controller::UsersFileLine lines), the workers' token
  // "the-workers-token" and `flags` added; waits for its ready file.
  // The error carries the controller's log.
  absl::Status Start(const std::string& bin_dir, const std::string& dir, const std::string& users,
                     const std::string& flags = "");
  // SIGTERM.
  ~TlsController();

  const std::string& tls_dir() const { return tls_; }  // ca.pem, the CA's key
  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& console_url() const { return console_url_; }

 private:
  std::string tls_, grpc_address_, console_url_;
  int pid_ = 0;
};

}  // namespace loom::testing

#endif  // LOOM_TESTS_TLS_CONTROLLER_H_
