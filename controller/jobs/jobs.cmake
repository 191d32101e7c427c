# Included from controller/CMakeLists.txt: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# The job's state machine: every legal transition in one place.
loom_library(loom_job_state_machine SRCS ${_dir}/job_state_machine.cc
  DEPS loom_proto absl::strings)
loom_test(loom_job_state_machine_test SRCS ${_dir}/job_state_machine_test.cc
  DEPS loom_job_state_machine)
