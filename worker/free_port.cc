#include "worker/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <utility>

namespace loom::worker {

namespace {

// Whether a TCP listener could bind `port` on every address right now.
bool PortBindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// The kernel's ephemeral range (net.ipv4.ip_local_port_range); Linux's
// default when unreadable.
std::pair<int, int> EphemeralPorts() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (in >> lo >> hi && lo > 0 && hi >= lo) return {lo, hi};
  return {32768, 60999};
}

}  // namespace

int PickFreePort() {
  // A port from outside the ephemeral range: between this heartbeat and the
  // rank that listens on it (seconds later), the kernel hands ephemeral
  // ports to every outgoing connection and every bind to port 0 on the
  // machine (other jobs' Gloo pairs among them), so one picked from there
  // may be taken by then, failing the rendezvous. Nothing takes a port
  // below the range unless asked for it by number. [20000, 30000) keeps
  // clear of Kubernetes' NodePorts (30000-32767) and of well-known ports.
  constexpr int kLow = 20000, kHigh = 30000;
  const auto [ephemeral_lo, ephemeral_hi] = EphemeralPorts();
  if (ephemeral_hi < kLow || ephemeral_lo >= kHigh) {
    thread_local std::mt19937 gen{std::random_device{}()};
    std::uniform_int_distribution<int> pick(kLow, kHigh - 1);
    for (int i = 0; i < 32; ++i) {
      const int port = pick(gen);
      if (PortBindable(port)) return port;
    }
  }
  // The range is ephemeral here (or crowded): any free port, as before.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace loom::worker
