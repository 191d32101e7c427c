# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# The registry of workers: leases, slots, GPUs, cordons.
loom_library(loom_worker_registry SRCS ${_dir}/worker_registry.cc
  DEPS loom_scheduler loom_common absl::strings absl::str_format)
loom_test(loom_worker_registry_test SRCS ${_dir}/worker_registry_test.cc DEPS loom_worker_registry)
# Commands to a job's ranks, queued on their workers' heartbeat answers.
loom_library(loom_rank_commands SRCS ${_dir}/worker_rank_commands.cc
  DEPS loom_worker_registry loom_proto)
# Worker liveness and what it means for jobs.
loom_library(loom_workers
  SRCS ${_dir}/worker_liveness.cc ${_dir}/rank_reconciler.cc
  DEPS loom_job_table loom_worker_registry loom_rank_commands loom_failure_handler loom_elastic
       loom_recovery_metrics loom_common absl::strings absl::str_format)
loom_test(loom_rank_reconciler_test SRCS ${_dir}/rank_reconciler_test.cc DEPS loom_workers
  SQLite::SQLite3)
loom_test(loom_worker_liveness_test SRCS ${_dir}/worker_liveness_test.cc
  DEPS loom_workers ${LOOM_SUBSYSTEM_TEST_DEPS})
