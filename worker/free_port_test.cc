#include "worker/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "gtest/gtest.h"

namespace loom::worker {
namespace {

// Binds `port` on every address; the listening fd, or -1.
int Listen(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(PickFreePortTest, PicksABindablePortOutsideTheEphemeralRange) {
  int lo = 0, hi = 0;
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  ASSERT_TRUE(in >> lo >> hi);
  const bool below_range_usable = hi < 20000 || lo >= 30000;
  for (int i = 0; i < 20; ++i) {
    const int port = PickFreePort();
    ASSERT_GT(port, 0);
    if (below_range_usable) {
      EXPECT_GE(port, 20000);
      EXPECT_LT(port, 30000);
    }
    // Free: a rank can listen on it.
    const int fd = Listen(port);
    EXPECT_GE(fd, 0) << "port " << port;
    if (fd >= 0) {
      // While it is held, a new pick is another port.
      EXPECT_NE(PickFreePort(), port);
      close(fd);
    }
  }
}

}  // namespace
}  // namespace loom::worker
