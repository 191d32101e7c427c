// loom-probe: the containers' health check. Small on purpose: it runs every
// few seconds inside every Loom container, and it needs nothing but the
// libraries the daemons already link.
//
//   loom-probe grpc HOST:PORT [SERVICE]   grpc.health.v1.Health/Check; healthy
//                                         when the answer is SERVING
//   loom-probe http HOST:PORT [PATH]      HTTP/1.0 GET (PATH defaults to
//                                         /metrics); healthy on status 200
//
// Exit status: 0 healthy, 1 unhealthy (one-line reason on stderr), 2 usage.
// Kubernetes does not need it (it has native grpc and httpGet probes); podman
// and docker HEALTHCHECKs do.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"

namespace {

constexpr int kTimeoutSeconds = 3;

int Unhealthy(const std::string& why) {
  std::cerr << "loom-probe: " << why << std::endl;
  return 1;
}

int ProbeGrpc(const std::string& address, const std::string& service) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kTimeoutSeconds));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return Unhealthy(address + ": " + s.error_message());
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return Unhealthy(address + ": " +
                     grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()));
  }
  std::cout << "SERVING" << std::endl;
  return 0;
}

// Reads until EOF or the deadline; returns false on timeout or error.
bool ReadAll(int fd, std::string* out, std::chrono::steady_clock::time_point deadline) {
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) return false;
    if (n == 0) return true;
    out->append(buf, n);
  }
}

int ProbeHttp(const std::string& address, const std::string& path) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return Unhealthy(address + ": want HOST:PORT");
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return Unhealthy(address + ": cannot resolve " + host);
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool connected = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  if (!connected) {
    if (fd >= 0) close(fd);
    return Unhealthy(address + ": connection refused");
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kTimeoutSeconds);
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
  std::string resp;
  bool ok = write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()) &&
            ReadAll(fd, &resp, deadline);
  close(fd);
  if (!ok) return Unhealthy(address + path + ": no answer within " +
                            std::to_string(kTimeoutSeconds) + " s");
  // "HTTP/1.x 200 ..."
  auto sp = resp.find(' ');
  int status = sp == std::string::npos ? 0 : std::atoi(resp.c_str() + sp + 1);
  if (status != 200) return Unhealthy(address + path + ": HTTP " + std::to_string(status));
  std::cout << "HTTP 200" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (argc >= 3 && argc <= 4 && mode == "grpc") return ProbeGrpc(argv[2], argc > 3 ? argv[3] : "");
  if (argc >= 3 && argc <= 4 && mode == "http") {
    return ProbeHttp(argv[2], argc > 3 ? argv[3] : "/metrics");
  }
  std::cerr << "usage: loom-probe grpc HOST:PORT [SERVICE]\n"
               "       loom-probe http HOST:PORT [PATH]\n";
  return 2;
}
