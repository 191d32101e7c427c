# Bounded YAML loading (yaml_util.h): every YAML parse of untrusted text.
loom_library(loom_yaml_util SRCS yaml_util.cc DEPS yaml-cpp absl::strings)
loom_test(loom_yaml_util_test SRCS yaml_util_test.cc DEPS loom_yaml_util)
loom_library(loom_jobspec SRCS jobspec_parse.cc jobspec_model.cc jobspec_defaults.cc
  jobspec_rules.cc jobspec_validate_run.cc jobspec_validate_plan.cc
  DEPS loom_proto loom_common loom_model_shape loom_parallel_layout loom_yaml_util loom_s3_config yaml-cpp
       absl::status absl::statusor
       absl::strings absl::str_format absl::flat_hash_map)
loom_test(loom_jobspec_test SRCS jobspec_test.cc DEPS loom_jobspec)
