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
// origin but connections to the peer consoles (ConsoleOptions::peer_origins),
// which alone get CORS answers. Request bodies over
// ApiGateway::kMaxBodyBytes are refused (413) without being read.
#ifndef LOOM_CONTROLLER_CONSOLE_CONSOLE_SERVER_H_
#define LOOM_CONTROLLER_CONSOLE_CONSOLE_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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
  // The URL browsers reach this console at ("https://host[:port]", no path):
  // behind a Service or an Ingress, theirs. Empty: the listen address's.
  std::string advertised_url;
  // The origins of the other consoles over the same store ("scheme://host:port"),
  // asked at most every few seconds. A page loaded from one of them may
  // call this console (CORS with credentials, and the page's connect-src):
  // when its own controller dies, the page goes on at the new leader's.
  std::function<std::vector<std::string>()> peer_origins;
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
  // ConsoleOptions::advertised_url, else "https://host:port" or
  // "http://host:port" (a wildcard host as 127.0.0.1).
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
  std::string advertised_url_;
};

// The origin of a console URL as browsers write it in an Origin header:
// "scheme://host[:port]", lower case, the scheme's default port left out; a
// trailing "/" is allowed. "" when `url` is not http(s), or has a path, a
// query, a user, or a character no origin has.
std::string ConsoleOrigin(absl::string_view url);

class ConsoleSessions;

// A controller's console, wired to it: the gateway over `server`'s
// in-process channel, sessions in `sessions` (which must outlive it), the
// console URLs recorded in `store` (this one, `advertised_url` or its own, as
// `holder`'s; the others are its peers), and the 307 to
// the leader's console while `leadership` stands by. TLS when `cert` and
// `key` are given.
absl::StatusOr<std::unique_ptr<ConsoleServer>> StartControllerConsole(
    const std::string& listen, const std::string& advertised_url, const std::string& cert,
    const std::string& key, grpc::Server* server, Store* store, ConsoleSessions* sessions,
    const Leadership* leadership, const std::string& holder);

}  // namespace loom::controller::console

#endif  // LOOM_CONTROLLER_CONSOLE_CONSOLE_SERVER_H_
