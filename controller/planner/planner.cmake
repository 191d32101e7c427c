# The parallelism planner: a pure library (no gRPC), its unit tests, and
# nothing else; loomctl and the controller link loom_planner.
set(LOOM_PLANNER_DIR ${CMAKE_CURRENT_LIST_DIR})
loom_library(loom_planner
  SRCS
    ${LOOM_PLANNER_DIR}/model.cc
    ${LOOM_PLANNER_DIR}/topology.cc
    ${LOOM_PLANNER_DIR}/topology_yaml.cc
    ${LOOM_PLANNER_DIR}/iron_law.cc
    ${LOOM_PLANNER_DIR}/formulas.cc
    ${LOOM_PLANNER_DIR}/cost_model.cc
    ${LOOM_PLANNER_DIR}/cost_model_time.cc
    ${LOOM_PLANNER_DIR}/placement.cc
    ${LOOM_PLANNER_DIR}/planner.cc
    ${LOOM_PLANNER_DIR}/device_sweep.cc
    ${LOOM_PLANNER_DIR}/report.cc
    ${LOOM_PLANNER_DIR}/report_json.cc
  DEPS loom_common loom_device_catalog loom_model_shape loom_parallel_layout loom_file_util loom_yaml_util yaml-cpp
       absl::status absl::statusor
       absl::strings absl::str_format)

loom_test(loom_planner_test
  SRCS
    ${LOOM_PLANNER_DIR}/model_test.cc
    ${LOOM_PLANNER_DIR}/topology_test.cc
    ${LOOM_PLANNER_DIR}/iron_law_test.cc
    ${LOOM_PLANNER_DIR}/formulas_test.cc
    ${LOOM_PLANNER_DIR}/cost_model_test.cc
    ${LOOM_PLANNER_DIR}/placement_test.cc
    ${LOOM_PLANNER_DIR}/planner_test.cc
    ${LOOM_PLANNER_DIR}/device_sweep_test.cc
    ${LOOM_PLANNER_DIR}/report_test.cc
  DEPS loom_planner)
# The topology tests read the example files under examples/.
target_compile_definitions(loom_planner_test PRIVATE
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# Published large runs as planner inputs: the regression suite and
# the published-plans bench read testdata/published_runs.yaml through it.
loom_library(loom_published_runs SRCS ${LOOM_PLANNER_DIR}/published_runs.cc
  DEPS loom_planner loom_jobspec yaml-cpp absl::status absl::statusor absl::strings)
loom_test(loom_published_runs_test SRCS ${LOOM_PLANNER_DIR}/published_runs_test.cc
  DEPS loom_published_runs loom_jobspec absl::str_format)
target_compile_definitions(loom_published_runs_test PRIVATE
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
