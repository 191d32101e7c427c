# CPU kernels of the fused step. Blocked causal self-attention for
# CPU fp32 (causal_attention.h), the kernel LibTorch 1.13 lacks; its matrix
# products call the Fortran BLAS that LibTorch itself uses (libblas.so.3,
# OpenBLAS by scripts/install-deps.sh).
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(BLAS REQUIRED)
loom_library(loom_causal_attention SRCS ${CMAKE_CURRENT_LIST_DIR}/causal_attention.cc
             DEPS loom_cpu_features ${BLAS_LIBRARIES} ${TORCH_LIBRARIES} ${CMAKE_DL_LIBS})
# Propagates inf/NaN: no -ffast-math family.
target_compile_options(loom_causal_attention PRIVATE -fno-fast-math)
target_link_libraries(loom_causal_attention PRIVATE OpenMP::OpenMP_CXX)
loom_test(loom_causal_attention_test
          SRCS ${CMAKE_CURRENT_LIST_DIR}/causal_attention_test.cc
          DEPS loom_causal_attention)

# GELU (tanh approximation) fused for CPU fp32 (gelu.h).
loom_library(loom_gelu SRCS ${CMAKE_CURRENT_LIST_DIR}/gelu.cc
             DEPS loom_cpu_features ${TORCH_LIBRARIES})
target_compile_options(loom_gelu PRIVATE -fno-fast-math)
target_link_libraries(loom_gelu PRIVATE OpenMP::OpenMP_CXX)
loom_test(loom_gelu_test SRCS ${CMAKE_CURRENT_LIST_DIR}/gelu_test.cc DEPS loom_gelu)

# RMSNorm fused for CPU fp32 (rms_norm.h).
loom_library(loom_rms_norm SRCS ${CMAKE_CURRENT_LIST_DIR}/rms_norm.cc DEPS ${TORCH_LIBRARIES})
target_compile_options(loom_rms_norm PRIVATE -fno-fast-math)
target_link_libraries(loom_rms_norm PRIVATE OpenMP::OpenMP_CXX)
loom_test(loom_rms_norm_test SRCS ${CMAKE_CURRENT_LIST_DIR}/rms_norm_test.cc DEPS loom_rms_norm)
# SwiGLU's gating fused for CPU fp32 (swiglu.h).
loom_library(loom_swiglu SRCS ${CMAKE_CURRENT_LIST_DIR}/swiglu.cc DEPS ${TORCH_LIBRARIES})
target_compile_options(loom_swiglu PRIVATE -fno-fast-math)
target_link_libraries(loom_swiglu PRIVATE OpenMP::OpenMP_CXX)
loom_test(loom_swiglu_test SRCS ${CMAKE_CURRENT_LIST_DIR}/swiglu_test.cc DEPS loom_swiglu)
