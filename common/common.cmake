loom_library(loom_file_util SRCS file_util.cc DEPS loom_common absl::strings)
loom_library(loom_grpc_util SRCS grpc_util.cc
  DEPS loom_file_util gRPC::grpc++ absl::strings absl::str_format)
loom_test(loom_grpc_util_test SRCS grpc_util_test.cc DEPS loom_grpc_util)
