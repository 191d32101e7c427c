loom_library(loom_crc32c SRCS crc32c.cc DEPS loom_common absl::str_format)
loom_test(loom_crc32c_test SRCS crc32c_test.cc DEPS loom_crc32c)
