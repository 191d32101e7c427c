# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# Identities and roles.
loom_library(loom_access SRCS ${_dir}/access.cc
  DEPS loom_grpc_util loom_file_util loom_sha256 absl::strings)
loom_test(loom_access_test SRCS ${_dir}/access_test.cc DEPS loom_access loom_file_util)
# The gRPC services over the job manager.
loom_library(loom_controller_service SRCS ${_dir}/rpc_admission.cc ${_dir}/job_service.cc ${_dir}/worker_service.cc
  DEPS loom_leader loom_access loom_job_manager loom_grpc loom_grpc_util loom_metrics loom_log_store
       loom_rank_logs loom_step_series_index loom_series_warmer
       loom_goodput_board loom_retention_planner)
