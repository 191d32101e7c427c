# libFuzzer targets, built only with -DLOOM_FUZZ=ON by a clang
# build whose flags instrument every object (scripts/fuzz.sh passes
# -fsanitize=address,undefined,fuzzer-no-link). Each target's seed corpus
# is tests/fuzz/<name>/; scripts/fuzz.sh runs them all.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "LOOM_FUZZ needs clang (CXX=clang++-14): libFuzzer is clang's")
endif()

# loom_fuzzer(NAME SRCS a_fuzz.cc DEPS x y)
function(loom_fuzzer name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  add_dependencies(loom_fuzzers ${name})
endfunction()

add_custom_target(loom_fuzzers)
loom_fuzzer(loom_jobspec_fuzz SRCS ${PROJECT_SOURCE_DIR}/common/jobspec_fuzz.cc DEPS loom_jobspec)
loom_fuzzer(loom_topology_yaml_fuzz
  SRCS ${PROJECT_SOURCE_DIR}/controller/planner/topology_yaml_fuzz.cc DEPS loom_planner)
# The checkpoint readers alone (not the LibTorch-heavy writer and engine):
# the shard format, over the manifest and verification (no LibTorch).
loom_library(loom_checkpoint_format_for_fuzz
  SRCS ${PROJECT_SOURCE_DIR}/worker/engine/checkpoint/checkpoint_format.cc
  DEPS loom_checkpoint_files loom_crc32c loom_common yaml-cpp absl::str_format ${TORCH_LIBRARIES})
loom_fuzzer(loom_checkpoint_format_fuzz
  SRCS ${PROJECT_SOURCE_DIR}/worker/engine/checkpoint/checkpoint_format_fuzz.cc
  DEPS loom_checkpoint_format_for_fuzz)
loom_fuzzer(loom_data_fuzz SRCS ${PROJECT_SOURCE_DIR}/common/formats/data_fuzz.cc DEPS loom_data)
loom_fuzzer(loom_job_manager_fuzz
  SRCS ${PROJECT_SOURCE_DIR}/controller/job_manager_fuzz.cc DEPS loom_job_manager)
loom_fuzzer(loom_queue_config_fuzz
  SRCS ${PROJECT_SOURCE_DIR}/controller/scheduling/queue_config_fuzz.cc DEPS loom_scheduling)
loom_fuzzer(loom_access_fuzz SRCS ${PROJECT_SOURCE_DIR}/controller/service/access_fuzz.cc DEPS loom_access)
