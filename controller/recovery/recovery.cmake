# Included from controller/CMakeLists.txt: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
loom_library(loom_spike_detector SRCS ${_dir}/spike_detector.cc DEPS absl::str_format)
loom_test(loom_spike_detector_test SRCS ${_dir}/spike_detector_test.cc DEPS loom_spike_detector)
# What a failure or a loss spike leads to (restart, rollback, give up), and
# the recovery metrics the controller exports.
loom_library(loom_recovery_metrics SRCS ${_dir}/recovery_metrics.cc DEPS loom_metrics loom_proto)
loom_library(loom_recovery_policy SRCS ${_dir}/recovery_policy.cc
  DEPS loom_spike_detector loom_slow_rank_detector loom_recovery_metrics loom_proto absl::strings)
loom_test(loom_recovery_policy_test SRCS ${_dir}/recovery_policy_test.cc DEPS loom_recovery_policy)
# Slow ranks: a rank's compute time against its peers'.
loom_library(loom_slow_rank_detector SRCS ${_dir}/slow_rank_detector.cc DEPS absl::str_format)
loom_test(loom_slow_rank_detector_test SRCS ${_dir}/slow_rank_detector_test.cc
  DEPS loom_slow_rank_detector)
# Carrying recovery out on jobs: failures and restarts, rollbacks.
loom_library(loom_failure_handler SRCS ${_dir}/failure_handler.cc
  DEPS loom_job_table loom_worker_registry loom_checkpoint_catalog loom_elastic loom_recovery_policy
       loom_recovery_metrics absl::strings absl::str_format)
loom_library(loom_rollbacks SRCS ${_dir}/rollbacks.cc
  DEPS loom_job_table loom_checkpoint_catalog loom_recovery_policy loom_recovery_metrics loom_jobspec
       absl::strings absl::str_format)
loom_test(loom_failure_handler_test SRCS ${_dir}/failure_handler_test.cc
  DEPS loom_failure_handler ${LOOM_SUBSYSTEM_TEST_DEPS})
loom_test(loom_rollbacks_test SRCS ${_dir}/rollbacks_test.cc
  DEPS loom_rollbacks ${LOOM_SUBSYSTEM_TEST_DEPS})
