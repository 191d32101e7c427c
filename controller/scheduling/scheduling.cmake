# The scheduling policy: queues with quotas and cohorts, fair
# share, gang admission with reservations and backfill, and preemption, as
# classes over a snapshot of the cluster. No gRPC, no store, no wall clock:
# the controller, the tests and the scheduler benchmark drive the same code.
set(LOOM_SCHEDULING_DIR ${CMAKE_CURRENT_LIST_DIR})
loom_library(loom_scheduling
  SRCS
    ${LOOM_SCHEDULING_DIR}/resources.cc
    ${LOOM_SCHEDULING_DIR}/queue_config.cc
    ${LOOM_SCHEDULING_DIR}/fair_share.cc
    ${LOOM_SCHEDULING_DIR}/gang_fit.cc
    ${LOOM_SCHEDULING_DIR}/preemption.cc
    ${LOOM_SCHEDULING_DIR}/admission.cc
    ${LOOM_SCHEDULING_DIR}/admission_victims.cc
    ${LOOM_SCHEDULING_DIR}/admission_evaluate.cc
    ${LOOM_SCHEDULING_DIR}/cluster_sim.cc
  DEPS loom_common loom_file_util loom_yaml_util yaml-cpp
       absl::status absl::statusor absl::strings absl::str_format absl::time)

loom_test(loom_scheduling_test
  SRCS
    ${LOOM_SCHEDULING_DIR}/queue_config_test.cc
    ${LOOM_SCHEDULING_DIR}/fair_share_test.cc
    ${LOOM_SCHEDULING_DIR}/gang_fit_test.cc
    ${LOOM_SCHEDULING_DIR}/preemption_test.cc
    ${LOOM_SCHEDULING_DIR}/admission_test.cc
    ${LOOM_SCHEDULING_DIR}/cluster_sim_test.cc
  DEPS loom_scheduling)
