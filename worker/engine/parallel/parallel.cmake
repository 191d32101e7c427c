# Issue 11: executing the planner's layouts. Layout arithmetic (no LibTorch),
# c10d process groups per layout, tensor-parallel layers and the partitioned
# GPT.
set(LOOM_PARALLEL_DIR ${CMAKE_CURRENT_LIST_DIR})
loom_library(loom_parallel_layout SRCS ${LOOM_PARALLEL_DIR}/layout.cc
             DEPS absl::status absl::statusor absl::strings)
loom_test(loom_parallel_layout_test SRCS ${LOOM_PARALLEL_DIR}/layout_test.cc
          DEPS loom_parallel_layout)

loom_library(loom_parallel
  SRCS ${LOOM_PARALLEL_DIR}/process_groups.cc ${LOOM_PARALLEL_DIR}/tensor_parallel.cc
       ${LOOM_PARALLEL_DIR}/parallel_gpt.cc ${LOOM_PARALLEL_DIR}/reduce_scatter.cc
       ${LOOM_PARALLEL_DIR}/sharded_adamw.cc ${LOOM_PARALLEL_DIR}/pipeline.cc
  DEPS loom_parallel_layout loom_engine loom_fused_adamw ${TORCH_LIBRARIES})
loom_test(loom_reduce_scatter_test SRCS ${LOOM_PARALLEL_DIR}/reduce_scatter_test.cc
          DEPS loom_parallel)
loom_test(loom_parallel_gpt_test SRCS ${LOOM_PARALLEL_DIR}/parallel_gpt_test.cc
          DEPS loom_parallel TIMEOUT 600)
