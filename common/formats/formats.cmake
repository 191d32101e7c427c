# Formats the worker writes and the controller and loomctl read, in plain
# C++ (no LibTorch, no gRPC): checkpoint directories (layout, listing,
# retention, the manifest and its verification) and llm.c token shards (the
# deterministic rank-sharded loader and byte-level data preparation).
loom_library(loom_checkpoint_files
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_files.cc ${CMAKE_CURRENT_LIST_DIR}/checkpoint_manifest.cc
       ${CMAKE_CURRENT_LIST_DIR}/checkpoint_legacy.cc ${CMAKE_CURRENT_LIST_DIR}/retention.cc
  DEPS loom_crc32c loom_sha256 loom_file_util loom_prune_log yaml-cpp absl::str_format
       absl::strings absl::status absl::statusor)
loom_test(loom_retention_test SRCS ${CMAKE_CURRENT_LIST_DIR}/retention_test.cc
  DEPS loom_checkpoint_files)
loom_library(loom_data SRCS ${CMAKE_CURRENT_LIST_DIR}/data.cc DEPS loom_common absl::str_format)
loom_test(loom_data_test SRCS ${CMAKE_CURRENT_LIST_DIR}/data_test.cc DEPS loom_data)
