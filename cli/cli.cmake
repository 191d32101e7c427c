loom_library(loom_local_cluster SRCS local_cluster.cc cluster_ca.cc
  DEPS loom_access loom_file_util loom_grpc_util loom_proto absl::strings absl::time)
loom_library(loom_plan_command SRCS plan_command.cc DEPS loom_planner loom_job_planning loom_proto absl::strings)
add_executable(loomctl loomctl_main.cc)
target_link_libraries(loomctl PRIVATE loom_access loom_local_cluster loom_plan_command loom_diagnosis loom_grpc loom_grpc_util loom_jobspec
  loom_data absl::strings absl::str_format absl::time)
