#include "common/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifdef LOOM_SHA256_OPENSSL
#include <openssl/evp.h>
#endif

namespace loom {
namespace {

// FIPS 180-4 4.2.2: first 32 bits of the fractional parts of the cube roots
// of the first 64 primes.
constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t RotateRight(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// FIPS 180-4 4.1.2, functions (4.2)-(4.7).
inline uint32_t Ch(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (~x & z); }
inline uint32_t Maj(uint32_t x, uint32_t y, uint32_t z) {
  return (x & y) ^ (x & z) ^ (y & z);
}
inline uint32_t BigSigma0(uint32_t x) {
  return RotateRight(x, 2) ^ RotateRight(x, 13) ^ RotateRight(x, 22);
}
inline uint32_t BigSigma1(uint32_t x) {
  return RotateRight(x, 6) ^ RotateRight(x, 11) ^ RotateRight(x, 25);
}
inline uint32_t SmallSigma0(uint32_t x) {
  return RotateRight(x, 7) ^ RotateRight(x, 18) ^ (x >> 3);
}
inline uint32_t SmallSigma1(uint32_t x) {
  return RotateRight(x, 17) ^ RotateRight(x, 19) ^ (x >> 10);
}

}  // namespace

Sha256::~Sha256() {
#ifdef LOOM_SHA256_OPENSSL
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(openssl_));
#endif
}

void Sha256::Reset() {
#ifdef LOOM_SHA256_OPENSSL
  if (openssl_ == nullptr) openssl_ = EVP_MD_CTX_new();
  if (openssl_ != nullptr &&
      EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(openssl_), EVP_sha256(), nullptr) == 1) {
    return;
  }
  // No context (out of memory): the portable code below serves.
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(openssl_));
  openssl_ = nullptr;
#endif
  // FIPS 180-4 5.3.3: initial hash value H(0).
  state_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
            0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  buffered_ = 0;
  total_bytes_ = 0;
}

// FIPS 180-4 6.2.2, steps 1-4, for one 512-bit block.
void Sha256::Compress(const uint8_t* block) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) {
    w[t] = (uint32_t{block[4 * t]} << 24) | (uint32_t{block[4 * t + 1]} << 16) |
           (uint32_t{block[4 * t + 2]} << 8) | uint32_t{block[4 * t + 3]};
  }
  for (int t = 16; t < 64; ++t) {
    w[t] = SmallSigma1(w[t - 2]) + w[t - 7] + SmallSigma0(w[t - 15]) + w[t - 16];
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = h + BigSigma1(e) + Ch(e, f, g) + kRoundConstants[t] + w[t];
    const uint32_t t2 = BigSigma0(a) + Maj(a, b, c);
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::Update(const void* data, size_t size) {
#ifdef LOOM_SHA256_OPENSSL
  if (openssl_ != nullptr) {
    EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(openssl_), data, size);
    return;
  }
#endif
  const auto* bytes = static_cast<const uint8_t*>(data);
  total_bytes_ += size;
  if (buffered_ > 0) {
    const size_t take = std::min(size, kBlockBytes - buffered_);
    std::memcpy(buffer_.data() + buffered_, bytes, take);
    buffered_ += take;
    bytes += take;
    size -= take;
    if (buffered_ < kBlockBytes) return;
    Compress(buffer_.data());
    buffered_ = 0;
  }
  for (; size >= kBlockBytes; size -= kBlockBytes, bytes += kBlockBytes) {
    Compress(bytes);
  }
  if (size > 0) {
    std::memcpy(buffer_.data(), bytes, size);
    buffered_ = size;
  }
}

Sha256::Digest Sha256::Finish() {
#ifdef LOOM_SHA256_OPENSSL
  if (openssl_ != nullptr) {
    Digest digest;
    unsigned int n = 0;
    EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(openssl_), digest.data(), &n);
    Reset();
    return digest;
  }
#endif
  // FIPS 180-4 5.1.1: append bit '1', zeros up to 448 mod 512 bits, then the
  // message length in bits as a 64-bit big-endian integer.
  const uint64_t total_bits = total_bytes_ * 8;
  uint8_t padding[kBlockBytes + 8] = {0x80};
  const size_t pad_bytes =
      (buffered_ < 56) ? (56 - buffered_) : (kBlockBytes + 56 - buffered_);
  Update(padding, pad_bytes);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(total_bits >> (56 - 8 * i));
  Update(length, 8);
  // buffered_ is now 0: the padded message is a whole number of blocks.
  Digest digest;
  for (int i = 0; i < 8; ++i) {
    digest[4 * i] = static_cast<uint8_t>(state_[i] >> 24);
    digest[4 * i + 1] = static_cast<uint8_t>(state_[i] >> 16);
    digest[4 * i + 2] = static_cast<uint8_t>(state_[i] >> 8);
    digest[4 * i + 3] = static_cast<uint8_t>(state_[i]);
  }
  Reset();
  return digest;
}

std::string ToHex(const uint8_t* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * size, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return out;
}

std::string Sha256Hex(absl::string_view data) {
  Sha256 hasher;
  hasher.Update(data);
  return ToHex(hasher.Finish());
}

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(err)));
  }
  Sha256 hasher;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), file)) > 0) hasher.Update(chunk, n);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) return absl::InternalError(absl::StrCat("read ", path, " failed"));
  return ToHex(hasher.Finish());
}

}  // namespace loom
