# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# Checkpoint-then-preempt and every save-and-stop move of a running job.
loom_library(loom_preemptor SRCS ${_dir}/preemptor.cc
  DEPS loom_job_table loom_checkpoint_catalog loom_recovery_metrics loom_scheduling loom_common
       absl::strings absl::str_format)
loom_test(loom_preemptor_test SRCS ${_dir}/preemptor_test.cc
  DEPS loom_preemptor ${LOOM_SUBSYSTEM_TEST_DEPS})
