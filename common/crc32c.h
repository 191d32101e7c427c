// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), the
// checksum of iSCSI (RFC 3720, appendix B.4), ext4 metadata and LevelDB
// blocks. Loom uses it for checkpoint files (worker/engine/checkpoint/checkpoint.h).
//
// Detects torn and bit-flipped files; it is not a cryptographic hash. On
// x86-64 CPUs with SSE4.2 the CRC32 instruction computes it (about 3 bytes
// per cycle with three interleaved streams); elsewhere a slicing-by-8 table
// does (about 1 byte per cycle). Both give identical results. Thread-safe:
// the functions are pure.
#ifndef LOOM_COMMON_CRC32C_H_
#define LOOM_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace loom {

// The CRC-32C of the bytes that `crc` covers followed by data[0, size):
// Crc32cExtend(Crc32c(a), b) == Crc32c(a + b). Crc32cExtend(0, ...) starts
// a new checksum.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }
inline uint32_t Crc32c(absl::string_view data) { return Crc32c(data.data(), data.size()); }

// Eight lowercase hex digits, most significant first: Crc32cHex(0xE3069283)
// == "e3069283".
std::string Crc32cHex(uint32_t crc);

// True if Crc32cExtend uses the SSE4.2 instruction on this CPU.
bool Crc32cIsHardwareAccelerated();

namespace crc32c_internal {
// The two implementations behind Crc32cExtend, for tests and benchmarks.
// ExtendHardware must only be called when Crc32cIsHardwareAccelerated().
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t size);
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t size);
}  // namespace crc32c_internal

}  // namespace loom

#endif  // LOOM_COMMON_CRC32C_H_
