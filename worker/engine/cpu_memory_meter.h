// Bytes of LibTorch CPU tensor storage live in this process, and their
// high-water mark: a measure of peak training memory that, unlike the
// process RSS, leaves out the libraries, the allocator's retained pages and
// everything that is not a tensor (so that tests can check that peak memory falls).
//
// Install() wraps LibTorch's CPU allocator (c10::SetCPUAllocator) once per
// process; from then on every CPU storage LibTorch allocates through it is
// counted while it lives. Storage allocated before Install(), wrapped
// foreign memory (torch::from_blob) and scratch buffers that kernels take
// from elsewhere (oneDNN, OpenBLAS) are not counted.
//
// Thread-safe: the counters are atomics, updated on whichever thread
// allocates or frees.
#ifndef LOOM_WORKER_ENGINE_CPU_MEMORY_METER_H_
#define LOOM_WORKER_ENGINE_CPU_MEMORY_METER_H_

#include <cstdint>

namespace loom::engine {

class CpuMemoryMeter {
 public:
  // The process's meter, installed on first call (later calls return it).
  // Fails (c10::Error) if another allocator with a higher priority has been
  // registered.
  static CpuMemoryMeter& Install();

  // Bytes of counted storage alive now.
  int64_t current_bytes() const;
  // Highest current_bytes() since Install() or the last ResetPeak().
  int64_t peak_bytes() const;
  // Starts a new high-water mark at current_bytes().
  void ResetPeak();

 private:
  CpuMemoryMeter() = default;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CPU_MEMORY_METER_H_
