# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# Rank logs in the controller's store, and who may ship and read them.
loom_library(loom_log_store SRCS ${_dir}/log_store.cc
  DEPS loom_store absl::strings absl::str_format absl::status absl::statusor)
loom_test(loom_log_store_test SRCS ${_dir}/log_store_test.cc DEPS loom_log_store loom_postgres_test_server)
loom_library(loom_rank_logs SRCS ${_dir}/rank_logs.cc DEPS loom_log_store loom_grpc absl::strings)
loom_test(loom_rank_logs_test SRCS ${_dir}/rank_logs_test.cc DEPS loom_rank_logs)
