// SHA-256 (FIPS 180-4, section 6.2), for checkpoint and artifact integrity.
//
// Not a general crypto library: no HMAC, no constant-time guarantees. Use it
// to detect torn or corrupted files, not to authenticate untrusted peers.
//
// Built with LOOM_SHA256_OPENSSL (the project's own build: loom_sha256), the
// blocks go through OpenSSL's SHA-256, which uses the CPU's SHA extensions
// where it has them: 1.85 GB/s against 0.32 GB/s for the portable code on
// this project's 2-core machines, which matters for every checkpoint the
// object-store tier uploads or restores. Without it (a build that compiles
// this file alone, as the GPU bench's does), the portable code below.
#ifndef LOOM_COMMON_SHA256_H_
#define LOOM_COMMON_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// Streaming SHA-256. Feed bytes with Update() any number of times, then call
// Finish() once; after Finish() the object is reset and may be reused.
// Thread-compatible (one thread at a time per object).
class Sha256 {
 public:
  static constexpr size_t kDigestBytes = 32;
  static constexpr size_t kBlockBytes = 64;
  using Digest = std::array<uint8_t, kDigestBytes>;

  Sha256() { Reset(); }

  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();

  void Reset();
  void Update(const void* data, size_t size);
  void Update(absl::string_view data) { Update(data.data(), data.size()); }
  // Pads the message (FIPS 180-4 5.1.1), returns the digest, and resets.
  Digest Finish();

 private:
  void Compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, kBlockBytes> buffer_;
  size_t buffered_ = 0;          // bytes pending in buffer_, < kBlockBytes
  uint64_t total_bytes_ = 0;     // message length so far
  void* openssl_ = nullptr;      // EVP_MD_CTX with LOOM_SHA256_OPENSSL
};

// Lowercase hex of `size` bytes.
std::string ToHex(const uint8_t* data, size_t size);
inline std::string ToHex(const Sha256::Digest& digest) {
  return ToHex(digest.data(), digest.size());
}

// Lowercase hex SHA-256 of `data` (64 characters).
std::string Sha256Hex(absl::string_view data);

// Lowercase hex SHA-256 of a file's contents, read in chunks.
// Errors: NOT_FOUND if the file does not exist, INTERNAL on other I/O errors.
absl::StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace loom

#endif  // LOOM_COMMON_SHA256_H_
