# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# Pipeline stage splits for the nodes' speeds (pure).
loom_library(loom_stage_split SRCS ${_dir}/stage_split.cc
  DEPS loom_proto loom_jobspec loom_parallel_layout absl::strings)
# Slow ranks: report, cordon, or re-split the pipeline.
loom_library(loom_slow_rank_handler SRCS ${_dir}/slow_rank_handler.cc
  DEPS loom_stage_split loom_elastic loom_preemptor loom_worker_registry loom_scheduler loom_store
       loom_recovery_policy loom_recovery_metrics absl::strings absl::str_format)
loom_test(loom_slow_rank_handler_test SRCS ${_dir}/slow_rank_handler_test.cc
  DEPS loom_slow_rank_handler ${LOOM_SUBSYSTEM_TEST_DEPS})
