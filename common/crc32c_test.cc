#include "common/crc32c.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

using crc32c_internal::ExtendHardware;
using crc32c_internal::ExtendPortable;

// Known answers: the "check" value of the CRC catalogue (CRC-32/ISCSI) and
// the test vectors of RFC 3720, appendix B.4.
TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
  // An iSCSI SCSI Read (10) command PDU, RFC 3720 B.4.
  const uint8_t pdu[48] = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                           0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
                           0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
                           0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(Crc32c(pdu, sizeof(pdu)), 0xD9963A56u);
  EXPECT_EQ(ExtendPortable(0, "123456789", 9), 0xE3069283u);
  if (Crc32cIsHardwareAccelerated()) {
    EXPECT_EQ(ExtendHardware(0, "123456789", 9), 0xE3069283u);
  }
}

TEST(Crc32cTest, HexIsEightLowercaseDigits) {
  EXPECT_EQ(Crc32cHex(0xE3069283u), "e3069283");
  EXPECT_EQ(Crc32cHex(0x1u), "00000001");
}

// Extending by pieces equals checksumming the whole, at every split point
// and misalignment.
TEST(Crc32cTest, ExtendComposes) {
  std::mt19937 rng(7);
  std::string data(300, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = Crc32c(data);
  for (size_t split = 0; split <= data.size(); ++split) {
    const uint32_t first = Crc32c(data.data(), split);
    ASSERT_EQ(Crc32cExtend(first, data.data() + split, data.size() - split), whole) << split;
  }
}

// The hardware path (three interleaved streams over 8 KiB blocks plus the
// tails) agrees with the table, at lengths around the block boundaries and
// every start alignment.
// Without SSE4.2 there is no hardware path to compare: the test then checks
// the dispatched entry point (which must fall back to the table) instead of
// skipping.
TEST(Crc32cTest, HardwareMatchesPortable) {
  const bool hardware = Crc32cIsHardwareAccelerated();
  auto fast = [hardware](uint32_t crc, const void* data, size_t size) {
    return hardware ? ExtendHardware(crc, data, size) : Crc32cExtend(crc, data, size);
  };
  std::mt19937 rng(11);
  std::vector<uint8_t> data(3 * 3 * 8192 + 64);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  const std::vector<size_t> lengths = {0,         1,         7,         8,         9,
                                       63,        8191,      3 * 8192 - 1, 3 * 8192,
                                       3 * 8192 + 1, 3 * 8192 + 13, 6 * 8192,  6 * 8192 + 7,
                                       9 * 8192};
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t length : lengths) {
      ASSERT_EQ(fast(0x12345678u, data.data() + offset, length),
                ExtendPortable(0x12345678u, data.data() + offset, length))
          << "offset " << offset << " length " << length;
    }
  }
}

// Not a timed assertion: prints the throughput of both paths, for the log.
TEST(Crc32cTest, PrintsThroughput) {
  std::vector<uint8_t> data(64 << 20, 0xab);
  auto rate = [&](auto fn) {
    const auto start = std::chrono::steady_clock::now();
    volatile uint32_t sink = fn(0, data.data(), data.size());
    (void)sink;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return data.size() / s / 1e9;
  };
  std::printf("crc32c portable: %.2f GB/s\n", rate(ExtendPortable));
  if (Crc32cIsHardwareAccelerated()) std::printf("crc32c sse4.2: %.2f GB/s\n", rate(ExtendHardware));
}

}  // namespace
}  // namespace loom
