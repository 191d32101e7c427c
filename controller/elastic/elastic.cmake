# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# Elastic jobs: the gangs a job may shrink or grow to, and re-planning onto
# the live cluster.
loom_library(loom_elastic SRCS ${_dir}/elastic.cc ${_dir}/replanner.cc
  DEPS loom_job_table loom_worker_registry loom_preemptor loom_job_planning loom_job_progress
       loom_checkpoint_catalog loom_recovery_metrics loom_scheduling absl::strings absl::str_format)
loom_test(loom_elastic_test SRCS ${_dir}/elastic_test.cc DEPS loom_elastic)
loom_test(loom_replanner_test SRCS ${_dir}/replanner_test.cc
  DEPS loom_elastic ${LOOM_SUBSYSTEM_TEST_DEPS})
