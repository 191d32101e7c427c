loom_library(loom_file_util SRCS file_util.cc DEPS loom_common absl::strings)
loom_library(loom_grpc_util SRCS grpc_util.cc DEPS loom_file_util gRPC::grpc++ absl::strings)
