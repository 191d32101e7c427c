#include "worker/engine/device_memory.h"

#if LOOM_HAVE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace loom::engine {

std::optional<DeviceMemory> CudaAllocatorMemory(int index) {
#if LOOM_HAVE_TORCH_CUDA
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  // Index 0 is StatType::AGGREGATE (all pools), in 1.13 and 2.x alike.
  DeviceMemory m;
  m.allocated_bytes = stats.allocated_bytes[0].current;
  m.reserved_bytes = stats.reserved_bytes[0].current;
  m.peak_allocated_bytes = stats.allocated_bytes[0].peak;
  return m;
#else
  (void)index;
  return std::nullopt;
#endif
}

}  // namespace loom::engine
