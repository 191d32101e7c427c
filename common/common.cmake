loom_library(loom_file_util SRCS file_util.cc DEPS loom_common absl::strings)
loom_library(loom_grpc_util SRCS grpc_util.cc
  DEPS loom_file_util gRPC::grpc++ absl::strings absl::str_format)
loom_test(loom_grpc_util_test SRCS grpc_util_test.cc DEPS loom_grpc_util)
# The JSON writer every hand-written JSON goes through (json_writer.h,
# header-only).
loom_test(loom_json_writer_test SRCS json_writer_test.cc DEPS loom_common protobuf::libprotobuf absl::strings
          absl::str_format)
# A mutex that names a holder who kept it too long (watched_mutex.h,
# header-only): the controller's lock and its store connection.
loom_test(loom_watched_mutex_test SRCS watched_mutex_test.cc DEPS loom_common)
# Where each rank of a data x pipeline x tensor layout sits: the
# controller places ranks with it, the engine builds its groups with it.
loom_library(loom_parallel_layout SRCS parallel_layout.cc
             DEPS loom_common absl::status absl::statusor absl::strings)
loom_test(loom_parallel_layout_test SRCS parallel_layout_test.cc DEPS loom_parallel_layout)
# The accelerator catalog (datasheet peaks, memory, bandwidths): the
# planner plans with it, GPU ranks take their MFU peak from it.
loom_library(loom_device_catalog SRCS device_catalog.cc
             DEPS loom_common absl::status absl::statusor absl::strings)
loom_test(loom_device_catalog_test SRCS device_catalog_test.cc DEPS loom_device_catalog)
# The prune log of a checkpoint directory: ranks write it before deleting,
# the controller's catalog reads it (prune_log.h).
loom_library(loom_prune_log SRCS prune_log.cc DEPS loom_file_util absl::strings)
loom_test(loom_prune_log_test SRCS prune_log_test.cc DEPS loom_prune_log)
loom_library(loom_health SRCS health_service.cc DEPS loom_grpc)
loom_test(loom_health_test SRCS health_service_test.cc DEPS loom_health)
# The shape of a decoder-only transformer, its parameters and FLOPs: one
# description for the planner, the engine and the telemetry.
loom_library(loom_model_shape SRCS model_shape.cc DEPS absl::status absl::strings)
# Tokenizers of prepared data: byte-level and SentencePiece BPE.
# SentencePiece runs in its own process, loom-sentencepiece, linked with
# nothing but it (its copy of protobuf's symbols crashes any process that
# also loads libprotobuf: see sentencepiece_bridge.h).
add_executable(loom-sentencepiece sentencepiece_main.cc)
target_link_libraries(loom-sentencepiece PRIVATE ${SENTENCEPIECE_TRAIN_LIBRARY}
  ${SENTENCEPIECE_LIBRARY})
loom_library(loom_tokenizer SRCS tokenizer.cc sentencepiece_bridge.cc
  DEPS absl::status absl::statusor absl::strings Threads::Threads)
add_dependencies(loom_tokenizer loom-sentencepiece)
loom_test(loom_tokenizer_test SRCS tokenizer_test.cc DEPS loom_tokenizer loom_file_util)
# Where the PostgreSQL server programs are (local up --ha, tests' servers).
loom_library(loom_postgres_install SRCS postgres_install.cc DEPS absl::strings)
# CPU lists ("0-3,8") and pinning a thread to one: the worker's upload CPUs.
loom_library(loom_cpu_list SRCS cpu_list.cc DEPS absl::strings absl::status absl::statusor)
loom_test(loom_cpu_list_test SRCS cpu_list_test.cc DEPS loom_cpu_list)
