# Fused AdamW: the LibTorch-free CPU kernel, its torch::optim
# adapter, and (when CMake finds nvcc) the CUDA multi-tensor kernel's
# standalone check against the CPU kernel.
find_package(OpenMP REQUIRED COMPONENTS CXX)

# CPU feature detection (cpu_features.h), shared by every run-time-dispatched
# kernel.
loom_library(loom_cpu_features SRCS ${CMAKE_CURRENT_LIST_DIR}/cpu_features.cc)

loom_library(loom_fused_adamw SRCS ${CMAKE_CURRENT_LIST_DIR}/fused_adamw.cc
             DEPS loom_cpu_features absl::span)
# The kernel detects inf/NaN and promises bit-identical results at every SIMD
# level, so: no -ffast-math family (the source also #errors on it), and no
# contraction of mul+add into FMA.
target_compile_options(loom_fused_adamw PRIVATE -ffp-contract=off -fno-fast-math)
# OpenMP only inside the kernel; dependents get the runtime at link time.
target_link_libraries(loom_fused_adamw PRIVATE OpenMP::OpenMP_CXX)
loom_test(loom_fused_adamw_test SRCS ${CMAKE_CURRENT_LIST_DIR}/fused_adamw_test.cc
          DEPS loom_fused_adamw)

loom_library(loom_fused_adamw_torch SRCS ${CMAKE_CURRENT_LIST_DIR}/fused_adamw_torch.cc
             DEPS loom_fused_adamw absl::status absl::statusor absl::str_format
                  ${TORCH_LIBRARIES})
loom_test(loom_fused_adamw_torch_test SRCS ${CMAKE_CURRENT_LIST_DIR}/fused_adamw_torch_test.cc
          DEPS loom_fused_adamw_torch)

# The CUDA multi-tensor kernel (fused_adamw_cuda.h), built whenever CMake
# finds nvcc; configure with -DLOOM_CUDA=OFF to leave it out. Its check is a
# plain main that compares it with the CPU kernel on a GPU (exit 77 where
# there is none).
option(LOOM_CUDA "Build Loom's CUDA kernels when a CUDA compiler is found" ON)
if(LOOM_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
endif()
if(LOOM_CUDA AND CMAKE_CUDA_COMPILER)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)  # H100 / H200
  endif()
  enable_language(CUDA)
  loom_library(loom_fused_adamw_cuda SRCS ${CMAKE_CURRENT_LIST_DIR}/fused_adamw_cuda.cu
               DEPS loom_fused_adamw absl::span)
  set_target_properties(loom_fused_adamw_cuda PROPERTIES CUDA_STANDARD 17
                        CUDA_STANDARD_REQUIRED ON)
  add_executable(loom_fused_adamw_cuda_test ${CMAKE_CURRENT_LIST_DIR}/fused_adamw_cuda_test.cu)
  set_target_properties(loom_fused_adamw_cuda_test PROPERTIES CUDA_STANDARD 17
                        CUDA_STANDARD_REQUIRED ON)
  target_link_libraries(loom_fused_adamw_cuda_test PRIVATE loom_fused_adamw_cuda)
  # Not a ctest entry: CI has no GPU, and a skipped test must not count as a
  # pass. scripts/device-check.sh runs it on a machine with one.
endif()

# FusedAdamW (fused_adamw_torch.h) runs CUDA parameters through the CUDA
# kernel when LibTorch was built with CUDA (its torch_cuda target exists) and
# nvcc built the kernel; otherwise CUDA parameters take its LibTorch-
# operations path. Debian 12's LibTorch is CPU-only, so this is OFF there;
# Debian 13's libtorch-cuda-dev has CUDA.
set(LOOM_HAVE_TORCH_CUDA OFF)
if(TARGET loom_fused_adamw_cuda AND (TARGET torch_cuda OR TORCH_CUDA_LIBRARIES))
  set(LOOM_HAVE_TORCH_CUDA ON)
  # One CUDA runtime in the process: the shared libcudart LibTorch uses too
  # (CUDA::cudart also gives the C++ sources the CUDA headers).
  find_package(CUDAToolkit REQUIRED)
  set_target_properties(loom_fused_adamw_cuda PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  target_link_libraries(loom_fused_adamw_cuda PUBLIC CUDA::cudart)
  target_compile_definitions(loom_fused_adamw_torch PRIVATE LOOM_HAVE_TORCH_CUDA=1)
  target_link_libraries(loom_fused_adamw_torch PUBLIC loom_fused_adamw_cuda)
endif()
message(STATUS "Loom: fused AdamW CUDA kernel for CUDA tensors: ${LOOM_HAVE_TORCH_CUDA}")

# Fused, chunked LM head + cross-entropy (fused_loss.h). Tests for
# inf/NaN, so no -ffast-math family here either.
loom_library(loom_fused_loss SRCS ${CMAKE_CURRENT_LIST_DIR}/fused_loss.cc
             DEPS loom_cpu_features ${TORCH_LIBRARIES})
target_compile_options(loom_fused_loss PRIVATE -fno-fast-math)
target_link_libraries(loom_fused_loss PRIVATE OpenMP::OpenMP_CXX)
loom_test(loom_fused_loss_test SRCS ${CMAKE_CURRENT_LIST_DIR}/fused_loss_test.cc
          DEPS loom_fused_loss loom_engine)  # loom_engine: AutocastGuard
