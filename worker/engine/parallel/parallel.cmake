# Executing the planner's layouts. The layout arithmetic is
# common/parallel_layout.h (the controller places ranks with it); the rest is
# part of loom_engine:
# process groups per layout, tensor-parallel layers, the partitioned GPT, the
# 1F1B pipeline, ZeRO's sharded AdamW, and the layout engine Train drives.
set(LOOM_PARALLEL_DIR ${CMAKE_CURRENT_LIST_DIR})
target_sources(loom_engine PRIVATE
  ${LOOM_PARALLEL_DIR}/process_groups.cc ${LOOM_PARALLEL_DIR}/tensor_parallel.cc
  ${LOOM_PARALLEL_DIR}/parallel_gpt.cc ${LOOM_PARALLEL_DIR}/reduce_scatter.cc
  ${LOOM_PARALLEL_DIR}/sharded_adamw.cc ${LOOM_PARALLEL_DIR}/gradient_partitioner.cc
  ${LOOM_PARALLEL_DIR}/pipeline.cc
  ${LOOM_PARALLEL_DIR}/sharded_checkpoint.cc ${LOOM_PARALLEL_DIR}/layout_engine.cc
  ${LOOM_PARALLEL_DIR}/p2p_placement.cc)
target_link_libraries(loom_engine PUBLIC loom_parallel_layout loom_fused_adamw)

# NCCL's failure contract (nccl_errors.h): environment only, no LibTorch.
loom_library(loom_nccl_errors SRCS ${LOOM_PARALLEL_DIR}/nccl_errors.cc)
target_link_libraries(loom_engine PUBLIC loom_nccl_errors)
loom_test(loom_nccl_errors_test SRCS ${LOOM_PARALLEL_DIR}/nccl_errors_test.cc DEPS loom_nccl_errors)
loom_test(loom_p2p_placement_test SRCS ${LOOM_PARALLEL_DIR}/p2p_placement_test.cc DEPS loom_engine)

loom_test(loom_reduce_scatter_test SRCS ${LOOM_PARALLEL_DIR}/reduce_scatter_test.cc
          DEPS loom_engine)
loom_test(loom_gradient_partitioner_test SRCS ${LOOM_PARALLEL_DIR}/gradient_partitioner_test.cc
          DEPS loom_engine)
loom_test(loom_parallel_gpt_test SRCS ${LOOM_PARALLEL_DIR}/parallel_gpt_test.cc
          DEPS loom_engine TIMEOUT 600)
loom_test(loom_layout_trainer_test SRCS ${LOOM_PARALLEL_DIR}/layout_trainer_test.cc
          DEPS loom_engine loom_checkpoint_inspect TIMEOUT 900)
# In-process ranks: deterministic OpenBLAS needs one OpenMP thread
# process-wide (engine.cmake, loom_trainer_test).
set_tests_properties(loom_parallel_gpt_test loom_layout_trainer_test loom_reduce_scatter_test
                     loom_gradient_partitioner_test
                     PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
