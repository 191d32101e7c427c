# The object-store tier of checkpoints: an S3 client over libcurl (it signs
# SigV4 itself), its configuration from the AWS tools' environment and
# files, and checkpoints uploaded to and restored from a bucket. No LibTorch.
find_package(CURL REQUIRED)
# Locations and configuration alone (no libcurl): job-spec validation.
loom_library(loom_s3_config SRCS ${CMAKE_CURRENT_LIST_DIR}/s3_config.cc
  DEPS loom_file_util absl::strings absl::status absl::statusor)
loom_library(loom_object_store
  SRCS ${CMAKE_CURRENT_LIST_DIR}/s3_client.cc ${CMAKE_CURRENT_LIST_DIR}/remote_checkpoints.cc
  DEPS loom_s3_config loom_checkpoint_files loom_sha256 loom_crc32c loom_file_util CURL::libcurl absl::strings
       absl::str_format absl::time absl::status absl::statusor Threads::Threads)
# Ceph's RADOS Gateway on loopback, for tests and benchmarks (s3_test_server.h).
loom_library(loom_s3_test_server SRCS ${CMAKE_CURRENT_LIST_DIR}/s3_test_server.cc
  DEPS loom_object_store loom_file_util)
target_compile_definitions(loom_s3_test_server PRIVATE
  LOOM_RADOSGW_SCRIPT="${PROJECT_SOURCE_DIR}/tests/object_store/radosgw.sh")
loom_test(loom_s3_config_test SRCS ${CMAKE_CURRENT_LIST_DIR}/s3_config_test.cc
  DEPS loom_s3_config)
loom_test(loom_s3_client_test SRCS ${CMAKE_CURRENT_LIST_DIR}/s3_client_test.cc
  DEPS loom_s3_test_server LABELS integration)
loom_test(loom_remote_checkpoints_test SRCS ${CMAKE_CURRENT_LIST_DIR}/remote_checkpoints_test.cc
  DEPS loom_s3_test_server LABELS integration)
