loom_library(loom_sha256 SRCS sha256.cc DEPS loom_common)
loom_test(loom_sha256_test SRCS sha256_test.cc DEPS loom_sha256)
