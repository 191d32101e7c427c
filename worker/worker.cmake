loom_library(loom_blas_info SRCS blas_info.cc DEPS ${CMAKE_DL_LIBS})
# Links the OpenBLAS Debian's LibTorch links (libopenblas.so.0, libopenblas-dev).
find_library(LOOM_OPENBLAS_LIBRARY NAMES openblas REQUIRED)
loom_test(loom_blas_info_test SRCS blas_info_test.cc DEPS loom_blas_info ${LOOM_OPENBLAS_LIBRARY})
loom_library(loom_cpu_probe SRCS cpu_probe.cc DEPS loom_blas_info absl::strings absl::status absl::statusor ${CMAKE_DL_LIBS})
loom_test(loom_cpu_probe_test SRCS cpu_probe_test.cc DEPS loom_cpu_probe ${CMAKE_DL_LIBS})
# The host's probe results, reused by the next worker started on the host.
loom_library(loom_probe_cache SRCS probe_cache.cc DEPS loom_cpu_probe loom_cpu_list loom_file_util absl::strings absl::status
  absl::time)
loom_test(loom_probe_cache_test SRCS probe_cache_test.cc DEPS loom_probe_cache)
# A CPU rank's calibrated GEMM peak, reused by the next rank started on the
# host.
loom_library(loom_gemm_peak_cache SRCS gemm_peak_cache.cc DEPS loom_probe_cache loom_file_util absl::strings
  absl::str_format absl::status absl::time)
# Where a node keeps its jobs' in-memory snapshots, and their clean-up.
loom_library(loom_snapshot_dirs SRCS snapshot_dirs.cc DEPS absl::strings absl::time Threads::Threads)
loom_test(loom_snapshot_dirs_test SRCS snapshot_dirs_test.cc DEPS loom_snapshot_dirs)
# What the rank process does around training that needs no LibTorch (a warm
# rank's wait, loom-ckpt fetch).
loom_library(loom_rank_process SRCS rank_process.cc DEPS loom_telemetry loom_snapshot_dirs absl::strings
  absl::str_format absl::status absl::statusor)
loom_test(loom_gemm_peak_cache_test SRCS gemm_peak_cache_test.cc DEPS loom_gemm_peak_cache)
# The remote tier: committed checkpoints uploaded to the object store in the
# background (checkpoint_uploader.h).
loom_library(loom_checkpoint_uploader SRCS checkpoint_uploader.cc
  DEPS loom_object_store loom_cpu_list loom_proto absl::strings absl::str_format Threads::Threads)
loom_test(loom_checkpoint_uploader_test SRCS checkpoint_uploader_test.cc
  DEPS loom_checkpoint_uploader loom_s3_test_server loom_test_util LABELS integration)
loom_library(loom_worker_agent SRCS rank_supervisor.cc worker_agent.cc worker_agent_delivery.cc free_port.cc log_shipper.cc controller_link.cc
  DEPS loom_grpc loom_grpc_util loom_file_util loom_metrics loom_common loom_checkpoint_uploader
       absl::strings Threads::Threads)
loom_test(loom_free_port_test SRCS free_port_test.cc DEPS loom_worker_agent)
loom_test(loom_log_shipper_test SRCS log_shipper_test.cc DEPS loom_worker_agent)


add_executable(loom-worker worker_main.cc)
target_link_libraries(loom-worker PRIVATE loom_worker_agent loom_node_notice loom_health loom_blas_info
  loom_snapshot_dirs loom_cpu_probe loom_probe_cache loom_nvml absl::flags absl::flags_parse absl::flags_usage absl::synchronization)

# The rank process links LibTorch and protobuf messages, but no gRPC.
add_executable(loom-rank rank_main.cc)
target_link_libraries(loom-rank PRIVATE loom_engine loom_blas_info loom_proto loom_file_util
  loom_telemetry loom_gemm_calibration loom_gemm_peak_cache loom_rank_process loom_nvml
  loom_device_catalog loom_jobspec loom_snapshot_dirs)

loom_test(loom_rank_supervisor_test SRCS rank_supervisor_test.cc DEPS loom_worker_agent)

add_executable(loom-ckpt ckpt_main.cc)
target_link_libraries(loom-ckpt PRIVATE loom_checkpoint_inspect loom_tokenizer loom_object_store)

# `loom-rank --probe` through the worker's ProbeBlocks (cpu_probe.h).
add_dependencies(loom_cpu_probe_test loom-rank)
target_compile_definitions(loom_cpu_probe_test PRIVATE LOOM_RANK_BINARY="$<TARGET_FILE:loom-rank>")
loom_test(loom_controller_link_test SRCS controller_link_test.cc DEPS loom_worker_agent)
# What tells a worker its node is going away (a file, a cloud's metadata,
# read with cpp-httplib's client).
find_package(PkgConfig REQUIRED)
find_package(OpenSSL REQUIRED)
pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
loom_library(loom_node_notice SRCS node_notice.cc
  DEPS loom_grpc PkgConfig::CPP_HTTPLIB OpenSSL::SSL OpenSSL::Crypto absl::strings absl::time
       Threads::Threads)
loom_test(loom_node_notice_test SRCS node_notice_test.cc DEPS loom_node_notice)
