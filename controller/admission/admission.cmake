# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# Where a gang's ranks go (the planner's placement over worker offers).
loom_library(loom_scheduler SRCS ${_dir}/scheduler.cc
  DEPS loom_planner loom_parallel_layout loom_grpc absl::strings absl::str_format)
loom_test(loom_scheduler_test SRCS ${_dir}/scheduler_test.cc DEPS loom_scheduler)
# Planning a spec at submission and for `loomctl plan`.
loom_library(loom_job_planning SRCS ${_dir}/job_planning.cc ${_dir}/live_topology.cc
  DEPS loom_planner loom_scheduler loom_jobspec loom_grpc absl::strings absl::str_format)
loom_test(loom_job_planning_test SRCS ${_dir}/job_planning_test.cc DEPS loom_job_planning loom_jobspec)
loom_library(loom_path_policy SRCS ${_dir}/path_policy.cc DEPS loom_proto absl::strings absl::status absl::statusor)
loom_test(loom_path_policy_test SRCS ${_dir}/path_policy_test.cc DEPS loom_path_policy)
# Submission and the scheduling cycle.
loom_library(loom_admission SRCS ${_dir}/admitter.cc ${_dir}/submission.cc
  DEPS loom_job_table loom_worker_registry loom_checkpoint_catalog loom_preemptor loom_elastic
       loom_stage_split loom_scheduler loom_scheduling loom_job_planning loom_job_progress
       loom_path_policy loom_jobspec loom_planner absl::strings absl::str_format)
loom_test(loom_admitter_test SRCS ${_dir}/admitter_test.cc
  DEPS loom_admission ${LOOM_SUBSYSTEM_TEST_DEPS})
