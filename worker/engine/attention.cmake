# Blocked causal self-attention for CPU fp32 (issue 6, causal_attention.h):
# the kernel LibTorch 1.13 lacks. Its matrix products call the Fortran BLAS
# that LibTorch itself uses (libblas.so.3, OpenBLAS by scripts/install-deps.sh).
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(BLAS REQUIRED)
loom_library(loom_causal_attention SRCS ${CMAKE_CURRENT_LIST_DIR}/causal_attention.cc
             DEPS loom_fused_adamw ${BLAS_LIBRARIES} ${TORCH_LIBRARIES} ${CMAKE_DL_LIBS})
# Propagates inf/NaN: no -ffast-math family.
target_compile_options(loom_causal_attention PRIVATE -fno-fast-math)
target_link_libraries(loom_causal_attention PRIVATE OpenMP::OpenMP_CXX)
loom_test(loom_causal_attention_test
          SRCS ${CMAKE_CURRENT_LIST_DIR}/causal_attention_test.cc
          DEPS loom_causal_attention)
