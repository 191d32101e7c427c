# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# Operators' node actions: cordon, uncordon, drain.
loom_library(loom_drains SRCS ${_dir}/drains.cc
  DEPS loom_job_table loom_worker_registry loom_preemptor loom_elastic loom_checkpoint_catalog
       loom_store loom_grpc absl::strings absl::str_format)
loom_test(loom_drains_test SRCS ${_dir}/drains_test.cc DEPS loom_drains ${LOOM_SUBSYSTEM_TEST_DEPS})
