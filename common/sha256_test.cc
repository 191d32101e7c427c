#include "common/sha256.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace loom {
namespace {

// Vectors from NIST "SHA-256 examples" (csrc.nist.gov, FIPS 180-4 examples)
// and the empty-string digest.
constexpr char kEmpty[] =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kAbc[] =
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr char k448Bit[] =
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
constexpr char k448BitMessage[] =
    "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
constexpr char kMillionA[] =
    "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";

TEST(Sha256Test, StandardVectors) {
  EXPECT_EQ(Sha256Hex(""), kEmpty);
  EXPECT_EQ(Sha256Hex("abc"), kAbc);
  EXPECT_EQ(Sha256Hex(k448BitMessage), k448Bit);
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')), kMillionA);
}

TEST(Sha256Test, StreamingMatchesOneShotForEverySplit) {
  // 56..64 bytes straddle the padding boundary, where an extra block is needed.
  const std::string message(130, 'x');
  for (size_t len : {55u, 56u, 63u, 64u, 65u, 119u, 120u, 130u}) {
    const std::string m = message.substr(0, len);
    const std::string expected = Sha256Hex(m);
    for (size_t split = 0; split <= len; ++split) {
      Sha256 hasher;
      hasher.Update(m.substr(0, split));
      hasher.Update(m.substr(split));
      ASSERT_EQ(ToHex(hasher.Finish()), expected) << "len " << len << " split " << split;
    }
  }
}

TEST(Sha256Test, FinishResetsForReuse) {
  Sha256 hasher;
  hasher.Update("garbage");
  hasher.Finish();
  hasher.Update("abc");
  EXPECT_EQ(ToHex(hasher.Finish()), kAbc);
}

TEST(Sha256Test, ToHexIsLowercase) {
  const uint8_t bytes[] = {0x00, 0x0f, 0xa0, 0xff};
  EXPECT_EQ(ToHex(bytes, sizeof(bytes)), "000fa0ff");
}

TEST(Sha256Test, HashesFiles) {
  char path[] = "/tmp/loom_sha256_testXXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "abc", 3), 3);
  close(fd);
  absl::StatusOr<std::string> digest = Sha256File(path);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, kAbc);
  std::remove(path);
  EXPECT_EQ(Sha256File(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom
