// ConsoleServer: the controller's HTTP(S) listener for Loom Console.
//
// Serves the JSON API of ApiGateway under /api/v1/ (cpp-httplib's worker
// threads call the gateway, which calls this controller's gRPC services in
// process), and its event streams (event_stream.h), each on a thread of
// its own while it is open. Every other path answers 404 for now. While the controller
// stands by and knows the leader's console, every request is answered 307
// to the same path there, as a standby's gRPC answers name the leader. With a certificate and
// key it serves HTTPS only (TLS 1.2 and newer), with the controller's own
// certificate, so a browser that trusts the gRPC port trusts the console.
//
// Every reply carries Cache-Control: no-store, X-Content-Type-Options:
// nosniff and a Content-Security-Policy that allows nothing from another
// origin. Request bodies over ApiGateway::kMaxBodyBytes are refused (413)
// without being read.
#ifndef LOOM_CONTROLLER_CONSOLE_CONSOLE_SERVER_H_
#define LOOM_CONTROLLER_CONSOLE_CONSOLE_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "controller/console/api_gateway.h"

namespace httplib {
class Server;
}
namespace grpc {
class Server;
}
namespace loom::controller {
class Store;
class Leadership;
}  // namespace loom::controller

namespace loom::controller::console {

struct ConsoleOptions {
  // "host:port"; port 0 picks a free one.
  std::string listen;
  // Both or neither: PEM files of the controller's TLS certificate and key.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Threads for requests; each open event stream holds one more.
  int threads = 8;
  // Event streams open at once (a page holds one or two); one more is
  // answered 429.
  int max_streams = 64;
  // The leader's console URL while this controller stands by, else "" (the
  // request is served here). May be empty: always served here.
  std::function<std::string()> leader_url;
};

class ConsoleServer {
 public:
  // Serves `gateway`'s API. INVALID_ARGUMENT for bad options, UNAVAILABLE
  // when the port cannot be bound or the certificate not used.
  static absl::StatusOr<std::unique_ptr<ConsoleServer>> Start(const ConsoleOptions& options,
                                                              std::unique_ptr<ApiGateway> gateway);
  // Stops accepting and waits for requests in flight.
  ~ConsoleServer();
  ConsoleServer(const ConsoleServer&) = delete;
  ConsoleServer& operator=(const ConsoleServer&) = delete;

  // "host:port" as bound (never port 0).
  std::string address() const;
  int port() const { return port_; }
  // "https://host:port" or "http://host:port" (a wildcard host as 127.0.0.1).
  std::string url() const;

 private:
  ConsoleServer() = default;

  std::unique_ptr<ApiGateway> gateway_;
  std::shared_ptr<std::atomic<int>> streams_ = std::make_shared<std::atomic<int>>(0);
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  std::string host_;
  int port_ = 0;
  bool tls_ = false;
};

class ConsoleSessions;

// A controller's console, wired to it: the gateway over `server`'s
// in-process channel, sessions in `sessions` (which must outlive it), the
// console URLs recorded in `store` (this one as `holder`'s), and the 307 to
// the leader's console while `leadership` stands by. TLS when `cert` and
// `key` are given.
absl::StatusOr<std::unique_ptr<ConsoleServer>> StartControllerConsole(
    const std::string& listen, const std::string& cert, const std::string& key,
    grpc::Server* server, Store* store, ConsoleSessions* sessions, const Leadership* leadership,
    const std::string& holder);

}  // namespace loom::controller::console

#endif  // LOOM_CONTROLLER_CONSOLE_CONSOLE_SERVER_H_
