loom_library(loom_local_cluster SRCS local_cluster.cc local_postgres.cc cluster_ca.cc
  DEPS loom_access loom_file_util loom_grpc_util loom_proto loom_postgres_install
       PostgreSQL::PostgreSQL absl::strings absl::str_format absl::time)
loom_library(loom_plan_command SRCS plan_command.cc DEPS loom_planner loom_job_planning loom_proto absl::strings)
loom_library(loom_cli_help SRCS help.cc bash_completion.cc DEPS absl::strings)
loom_library(loom_report SRCS report.cc DEPS loom_proto loom_goodput absl::strings absl::str_format absl::time)
loom_test(loom_report_test SRCS report_test.cc DEPS loom_report)
loom_test(loom_cli_help_test SRCS help_test.cc DEPS loom_cli_help)
# loomctl's commands, one file per command group (cli/commands/commands.h).
loom_library(loom_cli_commands
  SRCS commands/common.cc commands/jobs.cc commands/watch.cc commands/logs.cc
    commands/checkpoints.cc commands/plan.cc commands/workers.cc commands/data.cc
    commands/local.cc commands/users.cc commands/ca.cc commands/model.cc commands/report.cc
    commands/completion.cc
  DEPS loom_cli_help loom_report loom_tokenizer loom_access loom_local_cluster loom_plan_command
    loom_diagnosis loom_goodput loom_data_ledger loom_grpc loom_grpc_util loom_jobspec loom_data absl::strings
    absl::str_format absl::time)
add_executable(loomctl loomctl_main.cc)
target_link_libraries(loomctl PRIVATE loom_cli_commands loom_cli_help)
loom_test(loom_plan_command_test SRCS plan_command_test.cc DEPS loom_plan_command loom_jobspec)
target_compile_definitions(loom_plan_command_test PRIVATE LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
