# Included from controller/CMakeLists.txt: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# The event log's readers: cursors over the store's job_events and the
# newest entries in memory, and one job's watch stream.
loom_library(loom_event_hub SRCS ${_dir}/event_hub.cc ${_dir}/job_watch.cc
  DEPS loom_store loom_job_state_machine loom_proto absl::strings absl::time absl::status)
loom_test(loom_event_hub_test SRCS ${_dir}/event_hub_test.cc
  DEPS loom_event_hub loom_store)
