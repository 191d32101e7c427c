# OpenSSL's SHA-256 (the CPU's SHA extensions) behind loom::Sha256; the
# portable code stays for builds that compile sha256.cc alone.
find_package(OpenSSL REQUIRED)
loom_library(loom_sha256 SRCS sha256.cc DEPS loom_common OpenSSL::Crypto)
target_compile_definitions(loom_sha256 PRIVATE LOOM_SHA256_OPENSSL)
loom_test(loom_sha256_test SRCS sha256_test.cc DEPS loom_sha256)
# The portable code, as the GPU bench's build compiles it, against the same
# vectors.
loom_test(loom_sha256_portable_test SRCS sha256_test.cc sha256.cc
          DEPS loom_common absl::strings absl::status absl::statusor)
