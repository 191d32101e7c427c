// Memory of a CUDA device as LibTorch's caching allocator sees it (for
// telemetry: caching-allocator allocated/reserved/peak on GPU).
#ifndef LOOM_WORKER_ENGINE_DEVICE_MEMORY_H_
#define LOOM_WORKER_ENGINE_DEVICE_MEMORY_H_

#include <cstdint>
#include <optional>

namespace loom::engine {

struct DeviceMemory {
  int64_t allocated_bytes = 0;       // held by live tensors now
  int64_t reserved_bytes = 0;        // taken from the driver by the allocator (>= allocated)
  int64_t peak_allocated_bytes = 0;  // most ever allocated since the process started
};

// The caching allocator's figures for CUDA device `index`. nullopt when
// this build's LibTorch has no CUDA (LOOM_HAVE_TORCH_CUDA unset), which is
// Debian's. Cheap (no device synchronisation); call from any thread.
std::optional<DeviceMemory> CudaAllocatorMemory(int index);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_DEVICE_MEMORY_H_
