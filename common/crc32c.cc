#include "common/crc32c.h"

#include <array>
#include <cstring>

#include "absl/strings/str_format.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOOM_CRC32C_X86 1
#include <nmmintrin.h>
#endif

namespace loom {
namespace {

// Reflected CRC-32C polynomial.
constexpr uint32_t kPolynomial = 0x82F63B78u;

// Slicing-by-8 tables (Kounavis & Berry, "A Systematic Approach to Building
// High Performance Software-based CRC Generators", 2005): kTables[0][b] is
// the register after shifting in byte b; kTables[k][b] is kTables[k-1][b]
// shifted through one more zero byte.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // little-endian: x86-64 and the usual ARM
  return v;
}

// The raw register (no pre/post inversion) after `n` zero bytes, starting
// from `reg`: reg * x^(8n) mod P in the reflected representation.
uint32_t ShiftThroughZeros(uint32_t reg, size_t n) {
  for (size_t i = 0; i < n; ++i) reg = kTables[0][reg & 0xff] ^ (reg >> 8);
  return reg;
}

#ifdef LOOM_CRC32C_X86
// Hardware path: three independent CRC32 instruction streams over adjacent
// kStride-byte blocks hide the instruction's 3-cycle latency (Intel,
// "Fast CRC Computation for iSCSI Polynomial Using CRC32 Instruction",
// 2011). The register is linear over GF(2), so for blocks A, B, C of kStride
// bytes:  R(r, A|B|C) = S(S(R(r, A)) ^ R(0, B)) ^ R(0, C),  with S = the
// shift through kStride zero bytes, applied by four table look-ups.
constexpr size_t kStride = 8192;

struct ShiftTables {
  std::array<std::array<uint32_t, 256>, 4> t;
  ShiftTables() {
    uint32_t basis[32];
    for (int bit = 0; bit < 32; ++bit) basis[bit] = ShiftThroughZeros(uint32_t{1} << bit, kStride);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if (b & (1u << bit)) v ^= basis[8 * k + bit];
        }
        t[k][b] = v;
      }
    }
  }
  uint32_t Shift(uint32_t reg) const {
    return t[0][reg & 0xff] ^ t[1][(reg >> 8) & 0xff] ^ t[2][(reg >> 16) & 0xff] ^ t[3][reg >> 24];
  }
};

const ShiftTables& StrideShift() {
  static const ShiftTables tables;
  return tables;
}

bool CpuHasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p,
                                                       size_t n) {
  const ShiftTables& shift = StrideShift();
  uint64_t r = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    r = _mm_crc32_u8(static_cast<uint32_t>(r), *p++);
    --n;
  }
  while (n >= 3 * kStride) {
    uint64_t r1 = 0, r2 = 0;
    const uint8_t* p1 = p + kStride;
    const uint8_t* p2 = p + 2 * kStride;
    for (size_t i = 0; i < kStride; i += 8) {
      r = _mm_crc32_u64(r, Load64(p + i));
      r1 = _mm_crc32_u64(r1, Load64(p1 + i));
      r2 = _mm_crc32_u64(r2, Load64(p2 + i));
    }
    r = shift.Shift(shift.Shift(static_cast<uint32_t>(r)) ^ static_cast<uint32_t>(r1)) ^
        static_cast<uint32_t>(r2);
    p += 3 * kStride;
    n -= 3 * kStride;
  }
  while (n >= 8) {
    r = _mm_crc32_u64(r, Load64(p));
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    r = _mm_crc32_u8(static_cast<uint32_t>(r), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(r);
}
#endif  // LOOM_CRC32C_X86

}  // namespace

namespace crc32c_internal {

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t size) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t r = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    r = kTables[0][(r ^ *p++) & 0xff] ^ (r >> 8);
    --size;
  }
  while (size >= 8) {
    const uint64_t v = Load64(p) ^ r;
    r = kTables[7][v & 0xff] ^ kTables[6][(v >> 8) & 0xff] ^ kTables[5][(v >> 16) & 0xff] ^
        kTables[4][(v >> 24) & 0xff] ^ kTables[3][(v >> 32) & 0xff] ^
        kTables[2][(v >> 40) & 0xff] ^ kTables[1][(v >> 48) & 0xff] ^ kTables[0][v >> 56];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    r = kTables[0][(r ^ *p++) & 0xff] ^ (r >> 8);
    --size;
  }
  return ~r;
}

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t size) {
#ifdef LOOM_CRC32C_X86
  return ExtendSse42(crc, static_cast<const uint8_t*>(data), size);
#else
  return ExtendPortable(crc, data, size);
#endif
}

}  // namespace crc32c_internal

bool Crc32cIsHardwareAccelerated() {
#ifdef LOOM_CRC32C_X86
  return CpuHasSse42();
#else
  return false;
#endif
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  return Crc32cIsHardwareAccelerated() ? crc32c_internal::ExtendHardware(crc, data, size)
                                       : crc32c_internal::ExtendPortable(crc, data, size);
}

std::string Crc32cHex(uint32_t crc) { return absl::StrFormat("%08x", crc); }

}  // namespace loom
