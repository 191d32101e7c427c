# Included from controller/CMakeLists.txt: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# The job's state machine: every legal transition in one place.
loom_library(loom_job_state_machine SRCS ${_dir}/job_state_machine.cc
  DEPS loom_proto absl::strings)
loom_test(loom_job_state_machine_test SRCS ${_dir}/job_state_machine_test.cc
  DEPS loom_job_state_machine)
# The job table: every job, its state changes and their durable writes.
loom_library(loom_job_table SRCS ${_dir}/job_table.cc
  DEPS loom_job_state_machine loom_store loom_proto loom_spike_detector loom_slow_rank_detector
       loom_common absl::strings absl::status)
loom_test(loom_job_table_test SRCS ${_dir}/job_table_test.cc DEPS loom_job_table loom_store
  SQLite::SQLite3)
# What the subsystems' own tests link beside their subsystem
# (jobs/jobs_test_fixture.h): the real table, registry, catalog and store.
set(LOOM_SUBSYSTEM_TEST_DEPS loom_job_table loom_rank_commands loom_worker_registry
    loom_checkpoint_catalog loom_store SQLite::SQLite3)
