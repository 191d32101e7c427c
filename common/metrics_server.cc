#include "common/metrics_server.h"

#include <civetweb.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace loom {
namespace metrics {

namespace {

// mg_init_library must run once before any other civetweb call and is not
// thread-safe itself.
void InitCivetwebOnce() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

// While Start() runs mg_start2() on its thread, civetweb's messages land
// here: mg_error_data only ever says "Failed to setup server ports", the
// reason ("cannot bind to ...: Address already in use") comes as a log line.
thread_local std::string* start_log = nullptr;

// civetweb's log_message callback. Outside Start() there is no logger of
// ours to use, so diagnostics go to stderr. Returning 1 stops civetweb's own
// logging.
int LogMessage(const mg_connection* /*connection*/, const char* message) {
  if (start_log != nullptr) {
    absl::StrAppend(start_log, start_log->empty() ? "" : "; ", message);
  } else {
    std::fprintf(stderr, "loom::metrics::Exposer: civetweb: %s\n", message);
  }
  return 1;
}

// Sends a complete response. `body` is omitted for HEAD requests, but the
// Content-Length still describes it (RFC 9110, section 9.3.2).
void SendResponse(mg_connection* connection, int status,
                  const char* content_type, absl::string_view body,
                  bool send_body, const char* allow = nullptr) {
  const std::string length = absl::StrCat(body.size());
  mg_response_header_start(connection, status);
  mg_response_header_add(connection, "Content-Type", content_type, -1);
  mg_response_header_add(connection, "Content-Length", length.c_str(), -1);
  if (allow != nullptr) mg_response_header_add(connection, "Allow", allow, -1);
  mg_response_header_send(connection);
  if (send_body && !body.empty()) {
    mg_write(connection, body.data(), body.size());
  }
}

// Opens and at once closes a TCP connection to the server bound to
// host:port (host as in the bind address; a wildcard means loopback).
void ConnectAndClose(const std::string& host, int port) {
  std::string target = host;
  if (target.size() >= 2 && target.front() == '[' && target.back() == ']') {
    target = target.substr(1, target.size() - 2);
  }
  if (target.empty() || target == "0.0.0.0") target = "127.0.0.1";
  if (target == "::") target = "::1";
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  if (getaddrinfo(target.c_str(), absl::StrCat(port).c_str(), &hints,
                  &addresses) != 0) {
    return;
  }
  for (addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(addresses);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Exposer>> Exposer::Start(
    const std::string& bind_address, int num_threads) {
  if (bind_address.empty() || bind_address.find(',') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Exposer bind address \"", bind_address,
        "\" must be one \"host:port\" or \"port\""));
  }
  if (num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Exposer num_threads must be >= 1, got ", num_threads));
  }
  InitCivetwebOnce();

  // Not make_unique: the constructor is private.
  std::unique_ptr<Exposer> exposer(new Exposer());
  const std::string threads = absl::StrCat(num_threads);
  const char* options[] = {"listening_ports", bind_address.c_str(),
                           "num_threads", threads.c_str(),
                           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.begin_request = &Exposer::HandleRequest;
  callbacks.log_message = &LogMessage;
  mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.user_data = exposer.get();
  init.configuration_options = options;
  unsigned error_code = 0;
  char error_text[256] = {0};
  mg_error_data error;
  std::memset(&error, 0, sizeof(error));
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);

  std::string log;
  start_log = &log;
  exposer->context_ = mg_start2(&init, &error);
  start_log = nullptr;
  if (exposer->context_ == nullptr) {
    const std::string message =
        absl::StrCat("cannot start metrics server on \"", bind_address,
                     "\": ", log.empty() ? error_text : log);
    // civetweb reports no error codes (mg_error_data::code stays 0), so tell
    // a malformed address from a bind failure by its message.
    if (log.find("invalid port spec") != std::string::npos) {
      return absl::InvalidArgumentError(message);
    }
    return absl::UnavailableError(message);
  }
  if (!log.empty()) {
    std::fprintf(stderr, "loom::metrics::Exposer: civetweb: %s\n",
                 log.c_str());
  }

  mg_server_port ports[1];
  std::memset(ports, 0, sizeof(ports));
  if (mg_get_server_ports(exposer->context_, 1, ports) != 1 ||
      ports[0].port <= 0) {
    // The destructor stops the half-started server.
    return absl::InternalError(absl::StrCat(
        "metrics server on \"", bind_address, "\" reports no bound port"));
  }
  exposer->port_ = ports[0].port;
  const size_t colon = bind_address.rfind(':');
  exposer->host_ = colon == std::string::npos ? "0.0.0.0"
                                              : bind_address.substr(0, colon);
  return exposer;
}

Exposer::~Exposer() {
  if (context_ == nullptr) return;
  // mg_stop() raises a flag that civetweb's listener thread checks only
  // between polls, and the poll timeout is compiled in at 2 s
  // (SOCKET_TIMEOUT_QUANTUM). Connecting to ourselves ends the poll at once,
  // so stopping takes milliseconds. If the connection fails we merely wait.
  absl::Notification stopped;
  std::thread stopper([this, &stopped] {
    mg_stop(context_);
    stopped.Notify();
  });
  constexpr int kMaxWakeups = 100;  // Past ~1 s, the poll timeout wins anyway.
  for (int i = 0; i < kMaxWakeups && !stopped.WaitForNotificationWithTimeout(
                                         absl::Milliseconds(10));
       ++i) {
    ConnectAndClose(host_, port_);
  }
  stopper.join();
}

void Exposer::RegisterCollectable(std::weak_ptr<Collectable> collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(std::move(collectable));
}

void Exposer::RemoveCollectable(const std::weak_ptr<Collectable>& collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.erase(
      std::remove_if(collectables_.begin(), collectables_.end(),
                     [&](const std::weak_ptr<Collectable>& registered) {
                       return !registered.owner_before(collectable) &&
                              !collectable.owner_before(registered);
                     }),
      collectables_.end());
}

std::string Exposer::address() const { return absl::StrCat(host_, ":", port_); }

std::string Exposer::Scrape() {
  // Lock only to take strong references, so a slow Collect() does not block
  // RegisterCollectable and concurrent scrapes do not serialize.
  std::vector<std::shared_ptr<Collectable>> live;
  {
    absl::MutexLock lock(&mu_);
    auto expired = std::remove_if(
        collectables_.begin(), collectables_.end(),
        [&](const std::weak_ptr<Collectable>& weak) {
          std::shared_ptr<Collectable> strong = weak.lock();
          if (strong == nullptr) return true;
          live.push_back(std::move(strong));
          return false;
        });
    collectables_.erase(expired, collectables_.end());
  }
  std::vector<MetricFamily> families;
  for (const std::shared_ptr<Collectable>& collectable : live) {
    for (MetricFamily& family : collectable->Collect()) {
      families.push_back(std::move(family));
    }
  }
  return SerializeText(families);
}

int Exposer::HandleRequest(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  auto* exposer = static_cast<Exposer*>(request->user_data);
  const bool is_head = std::strcmp(request->request_method, "HEAD") == 0;
  const char* uri = request->local_uri != nullptr ? request->local_uri : "";
  if (std::strcmp(uri, "/metrics") != 0) {
    SendResponse(connection, 404, "text/plain; charset=utf-8",
                 "404 Not Found: metrics are at /metrics\n", !is_head);
    return 404;
  }
  if (!is_head && std::strcmp(request->request_method, "GET") != 0) {
    SendResponse(connection, 405, "text/plain; charset=utf-8",
                 "405 Method Not Allowed\n", /*send_body=*/true,
                 /*allow=*/"GET, HEAD");
    return 405;
  }
  SendResponse(connection, 200, kTextContentType, exposer->Scrape(), !is_head);
  return 200;
}

}  // namespace metrics
}  // namespace loom
