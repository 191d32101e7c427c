# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# The checkpoint catalog: every checkpoint of every job, with its status.
loom_library(loom_checkpoint_catalog SRCS ${_dir}/checkpoint_catalog.cc ${_dir}/checkpoint_verifier.cc
  DEPS loom_store loom_proto loom_prune_log loom_checkpoint_files absl::strings)
loom_test(loom_checkpoint_catalog_test SRCS ${_dir}/checkpoint_catalog_test.cc
  DEPS loom_checkpoint_catalog loom_checkpoint loom_engine)
# What retention would delete now from each tier of a job, and why
# (loomctl checkpoints gc --dry-run): reads the directory and the store.
loom_library(loom_retention_planner SRCS ${_dir}/retention_planner.cc
  DEPS loom_object_store loom_checkpoint_files loom_grpc loom_proto absl::strings)
loom_test(loom_retention_planner_test SRCS ${_dir}/retention_planner_test.cc
  DEPS loom_retention_planner loom_crc32c)
