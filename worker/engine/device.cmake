# Device memory figures from LibTorch's CUDA caching allocator
# (device_memory.h); compiled with LOOM_HAVE_TORCH_CUDA when fused_adamw.cmake
# found a LibTorch with CUDA, else it reports none.
loom_library(loom_device_memory SRCS ${CMAKE_CURRENT_LIST_DIR}/device_memory.cc
             DEPS ${TORCH_LIBRARIES})
if(LOOM_HAVE_TORCH_CUDA)
  target_compile_definitions(loom_device_memory PRIVATE LOOM_HAVE_TORCH_CUDA=1)
  # c10/cuda headers include the CUDA runtime's (fused_adamw.cmake found CUDAToolkit).
  target_link_libraries(loom_device_memory PRIVATE CUDA::cudart)
endif()
