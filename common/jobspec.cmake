loom_library(loom_jobspec SRCS jobspec.cc
  DEPS loom_proto loom_common loom_parallel_layout yaml-cpp absl::status absl::statusor
       absl::strings absl::str_format absl::flat_hash_map)
loom_test(loom_jobspec_test SRCS jobspec_test.cc DEPS loom_jobspec)
