# Benchmark executables, one block per benchmark; bench/run.sh builds and
# runs them by name.

# planner: planning time of the 1008B / 3072-GPU case vs. an unpruned search.
add_executable(loom_planner_bench ${CMAKE_CURRENT_LIST_DIR}/planner_bench.cc)
target_link_libraries(loom_planner_bench PRIVATE loom_planner)

# published_plans: plan time of every published run vs. unpruned.
add_executable(loom_published_plans_bench ${CMAKE_CURRENT_LIST_DIR}/published_plans_bench.cc)
target_link_libraries(loom_published_plans_bench PRIVATE loom_published_runs)

# adamw: fused AdamW vs. a same-pattern stream kernel and torch::optim::AdamW
# (absent when worker/engine leaves the fused AdamW targets out).
if(TARGET loom_fused_adamw)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  add_executable(loom_adamw_bench ${CMAKE_CURRENT_LIST_DIR}/adamw_bench.cc)
  target_link_libraries(loom_adamw_bench PRIVATE loom_fused_adamw ${TORCH_LIBRARIES}
                        OpenMP::OpenMP_CXX)
endif()

# recovery: spike detection -> first resumed step, on a real local cluster.
add_executable(loom_recovery_bench ${CMAKE_CURRENT_LIST_DIR}/recovery_bench.cc)
target_link_libraries(loom_recovery_bench PRIVATE loom_test_util loom_local_cluster loom_grpc
                      loom_data loom_file_util absl::strings absl::str_format)
add_dependencies(loom_recovery_bench loomctl loom-controller loom-worker loom-rank)

# checkpoint: Loom's checkpoint write throughput vs. the disk's write+fsync,
# and the stall per checkpoint, on a ~124M-parameter GPT.
add_executable(loom_snapshot_bench ${CMAKE_CURRENT_LIST_DIR}/snapshot_bench.cc)
target_link_libraries(loom_snapshot_bench PRIVATE loom_engine ${TORCH_LIBRARIES})
add_executable(loom_checkpoint_bench ${CMAKE_CURRENT_LIST_DIR}/checkpoint_bench.cc)
target_link_libraries(loom_checkpoint_bench PRIVATE loom_engine loom_crc32c ${TORCH_LIBRARIES})
# checkpoint-remote: Loom's upload and restore against awscli's, and
# training with and without the object-store tier's uploads (RADOS Gateway).
add_executable(loom_remote_tier_bench ${CMAKE_CURRENT_LIST_DIR}/remote_tier_bench.cc)
target_link_libraries(loom_remote_tier_bench PRIVATE loom_engine loom_checkpoint_uploader
  loom_s3_test_server ${TORCH_LIBRARIES})

# train: training tokens/s of loom::engine::Train on the shared benchmark GPT
# configuration, with the same run's sgemm rate and the model FLOPs per token
# (the PyTorch eager side is bench/train_pytorch.py).
add_executable(loom_train_bench ${CMAKE_CURRENT_LIST_DIR}/train_bench.cc)
target_link_libraries(loom_train_bench PRIVATE loom_engine loom_telemetry loom_gemm_calibration
                      ${TORCH_LIBRARIES})

# precision: tokens/s and peak memory of fp32, bf16 and bf16 + activation
# checkpointing on a d_model 512, 8-layer GPT, each in its own child process.
add_executable(loom_precision_bench ${CMAKE_CURRENT_LIST_DIR}/precision_bench.cc)
target_link_libraries(loom_precision_bench PRIVATE loom_engine absl::strings absl::str_format
                      ${TORCH_LIBRARIES})

# loader: share of the step waiting for data, with and without the
# prefetching loader, on the shared benchmark GPT configuration.
add_executable(loom_loader_bench ${CMAKE_CURRENT_LIST_DIR}/loader_bench.cc)
target_link_libraries(loom_loader_bench PRIVATE loom_engine loom_data ${TORCH_LIBRARIES})

# attention: Loom's blocked causal attention kernel vs. the unfused LibTorch
# expression, forward + backward, one layer of the shared benchmark GPT.
add_executable(loom_attention_bench ${CMAKE_CURRENT_LIST_DIR}/attention_bench.cc)
target_link_libraries(loom_attention_bench PRIVATE loom_causal_attention ${TORCH_LIBRARIES})

# llama: a Llama-family step against GPT-2's of the same size, and the
# shares of its unfused parts (rotary + K/V expansion, RMSNorm, SwiGLU).
add_executable(loom_llama_bench ${CMAKE_CURRENT_LIST_DIR}/llama_bench.cc)
target_link_libraries(loom_llama_bench PRIVATE loom_engine loom_model_shape ${TORCH_LIBRARIES})

# gpu: the GPU benchmark (bench/gpu/gpu_bench.cc). Built here only so that it
# keeps compiling against the engine (on a machine without a GPU it exits 77,
# "no CUDA device"); bench/gpu/run.sh builds and runs it on a GPU machine
# against PyTorch's LibTorch through bench/gpu/CMakeLists.txt.
add_executable(loom_gpu_bench ${CMAKE_CURRENT_LIST_DIR}/gpu/gpu_bench.cc)
target_link_libraries(loom_gpu_bench PRIVATE loom_engine ${TORCH_LIBRARIES})
if(TARGET torch_cuda)
  target_compile_definitions(loom_gpu_bench PRIVATE LOOM_HAVE_TORCH_CUDA=1)
endif()

# zero: ZeRO's reduce-scatter (a ring from Gloo's send/recv) + all-gather
# against data parallelism's all-reduce, on Gloo over loopback.
add_executable(loom_zero_bench ${CMAKE_CURRENT_LIST_DIR}/zero_bench.cc)
target_link_libraries(loom_zero_bench PRIVATE loom_engine ${TORCH_LIBRARIES})

# plan-accuracy: the planner's step time for the spec's own layout against
# the measured one, for every kind of layout the engine executes.
add_executable(loom_plan_accuracy_bench ${CMAKE_CURRENT_LIST_DIR}/plan_accuracy_bench.cc)
target_link_libraries(loom_plan_accuracy_bench PRIVATE loom_test_util loom_local_cluster
                      loom_grpc loom_file_util absl::strings)
add_dependencies(loom_plan_accuracy_bench loomctl loom-controller loom-worker loom-rank)

# parallel: the largest GPT that trains under a per-rank memory limit with
# pure data parallelism and with the planner's layout.
add_executable(loom_parallel_bench ${CMAKE_CURRENT_LIST_DIR}/parallel_bench.cc)
target_link_libraries(loom_parallel_bench PRIVATE loom_test_util loom_grpc absl::strings
                      absl::str_format)
add_dependencies(loom_parallel_bench loomctl loom-controller loom-worker loom-rank)

# overlap: data-parallel gradient averaging overlapped with backward against
# the same buckets all-reduced after it, 2 in-process Gloo ranks.
add_executable(loom_overlap_bench ${CMAKE_CURRENT_LIST_DIR}/overlap_bench.cc)
target_link_libraries(loom_overlap_bench PRIVATE loom_engine ${TORCH_LIBRARIES})

# chaos: kill -9 / partition / disk-full trials on a real local cluster in
# network namespaces; every job must finish bit-exact. Root only.
# Its elastic trials' loss check, with its own test.
loom_library(loom_elastic_check SRCS ${CMAKE_CURRENT_LIST_DIR}/elastic_check.cc
  DEPS loom_grpc absl::strings)
loom_test(loom_elastic_check_test SRCS ${CMAKE_CURRENT_LIST_DIR}/elastic_check_test.cc
  DEPS loom_elastic_check)
add_executable(loom_chaos_bench ${CMAKE_CURRENT_LIST_DIR}/chaos_bench.cc)
target_link_libraries(loom_chaos_bench PRIVATE loom_elastic_check loom_test_util loom_local_cluster loom_grpc
                      loom_file_util absl::strings absl::str_format)
add_dependencies(loom_chaos_bench loomctl loom-controller loom-worker loom-rank loom-ckpt)

# failover: the Jepsen-style run of active/standby controllers over
# PostgreSQL (tests/failover_cluster.h). Root only.
add_executable(loom_failover_bench ${CMAKE_CURRENT_LIST_DIR}/failover_bench.cc)
target_link_libraries(loom_failover_bench PRIVATE loom_failover_cluster absl::str_format)
add_dependencies(loom_failover_bench loomctl loom-controller loom-worker loom-rank loom-ckpt)

# control-plane: 10,000 simulated workers heartbeating, 100 jobs reporting
# steps at 10 Hz and 20 watchers against a real controller, over real gRPC
# from one process; p50/p99 of heartbeats and step reports.
add_executable(loom_control_plane_bench ${CMAKE_CURRENT_LIST_DIR}/control_plane_bench.cc
               ${CMAKE_CURRENT_LIST_DIR}/control_plane_fleet.cc
               ${CMAKE_CURRENT_LIST_DIR}/control_plane_report.cc)
target_link_libraries(loom_control_plane_bench PRIVATE loom_test_util loom_local_cluster loom_grpc
                      loom_grpc_util loom_file_util loom_jobspec loom_data loom_postgres_test_server
                      absl::strings absl::str_format absl::synchronization)
add_dependencies(loom_control_plane_bench loom-controller)

# console: Loom Console against a store of 10,000 jobs, a 1,000,000-step job
# with 10 million log lines, and a live job on simulated workers; the jobs
# page's server time, the big chart's paint in Chromium, step-to-page delay,
# log search. (cpp-httplib comes with loom_console.)
add_executable(loom_console_bench ${CMAKE_CURRENT_LIST_DIR}/console_bench.cc
               ${CMAKE_CURRENT_LIST_DIR}/control_plane_fleet.cc
               ${CMAKE_CURRENT_LIST_DIR}/control_plane_report.cc)
target_link_libraries(loom_console_bench PRIVATE loom_test_util loom_local_cluster loom_grpc
                      loom_grpc_util loom_file_util loom_jobspec loom_data loom_store loom_log_store
                      loom_access loom_console absl::strings absl::str_format
                      absl::synchronization)
add_dependencies(loom_console_bench loom-controller)

# scheduler: the real scheduling policy through ClusterSim over a synthetic
# 15,000-job trace on 1,000 workers; waits, utilisation, goodput,
# preemptions and decisions/s against bench/scheduler_thresholds.txt.
add_executable(loom_scheduler_bench ${CMAKE_CURRENT_LIST_DIR}/scheduler_bench.cc)
target_link_libraries(loom_scheduler_bench PRIVATE loom_scheduling absl::strings absl::str_format
                      absl::time)

# elastic: one elastic job through a worker kill, its return, a partial
# preemption, a slow rank (a CPU-quota cgroup) and a controller kill on 4
# local workers; recovery times, steps lost, ETTR. Root only.
add_executable(loom_elastic_bench ${CMAKE_CURRENT_LIST_DIR}/elastic_bench.cc)
target_link_libraries(loom_elastic_bench PRIVATE loom_test_util loom_local_cluster loom_grpc
                      loom_goodput absl::strings absl::str_format)
add_dependencies(loom_elastic_bench loomctl loom-controller loom-worker loom-rank loom-ckpt)

# logs: `loomctl logs --grep` over LOGS_LINES (10,000,000) log lines of one
# job in the controller's store, SQLite and PostgreSQL side by side, against
# a full scan of the same bytes.
add_executable(loom_logs_bench ${CMAKE_CURRENT_LIST_DIR}/logs_bench.cc)
target_link_libraries(loom_logs_bench PRIVATE loom_log_store loom_store loom_postgres_test_server
                      absl::strings absl::str_format)
