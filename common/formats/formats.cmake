# Token shards, the deterministic rank-sharded loader and byte-level data
# preparation. Plain C++: no LibTorch, no gRPC.
loom_library(loom_data SRCS data.cc DEPS loom_common absl::str_format)
loom_test(loom_data_test SRCS data_test.cc DEPS loom_data)
