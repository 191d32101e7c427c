loom_library(loom_local_cluster SRCS local_cluster.cc cluster_ca.cc
  DEPS loom_access loom_file_util loom_grpc_util loom_proto absl::strings absl::time)
loom_library(loom_plan_command SRCS plan_command.cc DEPS loom_planner loom_job_planning loom_proto absl::strings)
loom_library(loom_cli_help SRCS help.cc DEPS absl::strings)
loom_library(loom_report SRCS report.cc DEPS loom_proto absl::strings absl::str_format absl::time)
loom_test(loom_report_test SRCS report_test.cc DEPS loom_report)
loom_test(loom_cli_help_test SRCS help_test.cc DEPS loom_cli_help)
add_executable(loomctl loomctl_main.cc)
target_link_libraries(loomctl PRIVATE loom_cli_help loom_report loom_tokenizer loom_access loom_local_cluster loom_plan_command loom_diagnosis loom_grpc loom_grpc_util loom_jobspec
  loom_data absl::strings absl::str_format absl::time)
