// Multi-tensor fused AdamW on CUDA: FusedAdamWStep of
// fused_adamw.h for tensors in device memory, with the same arithmetic, so
// that a CUDA step equals the CPU kernel's bit for bit whenever both compute
// the same clip factor (the grad norm's last bits depend on summation order).
//
// One step is three launches on the caller's stream and no host
// synchronisation:
//   1. per-chunk partial sums of grad^2 in double (chunks of kChunkElements
//      within one tensor, one block each);
//   2. one block adds the partials in a fixed order and writes the step's
//      verdict to device memory: finite or not, the norm, the clip factor;
//   3. the update, which every block skips when the verdict says a gradient
//      was inf/NaN — so a skipped step writes nothing, like the CPU kernel.
// The verdict stays on the device; LastResult() fetches it when the caller
// wants it (e.g. for telemetry, or to adjust a loss scale).
//
// Compiled only when CMake finds CUDA (worker/engine/fused_adamw.cmake) or by
// hand, see fused_adamw_cuda_test.cu.
#ifndef LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_CUDA_H_
#define LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "worker/engine/ops/fused_adamw.h"

namespace loom::engine {

// Owns the device and pinned host buffers that carry one step's tensor table
// to the GPU; they grow to the largest step seen and are reused, which is
// safe because consecutive steps are ordered on the stream: pass the same
// stream to every Step() of an instance. Not safe for concurrent use.
class FusedAdamWCuda {
 public:
  // Elements per chunk (one thread block handles one chunk).
  static constexpr int64_t kChunkElements = 65536;

  FusedAdamWCuda() = default;
  // Waits for the last step's work, then frees the buffers.
  ~FusedAdamWCuda();
  FusedAdamWCuda(const FusedAdamWCuda&) = delete;
  FusedAdamWCuda& operator=(const FusedAdamWCuda&) = delete;

  // Enqueues one fused step on `stream`. Every AdamWTensor pointer is a
  // device pointer that must stay valid until the stream has run the step;
  // AdamWKernelOptions do not apply. Returns the first CUDA error, if any.
  cudaError_t Step(absl::Span<const AdamWGroup> groups, const AdamWStepOptions& options,
                   cudaStream_t stream);

  // Waits for the last Step() and copies its result. Before any step,
  // returns cudaSuccess and leaves *result as it was.
  cudaError_t LastResult(AdamWStepResult* result);

 private:
  cudaError_t Reserve(size_t table_bytes, size_t chunks);

  void* host_table_ = nullptr;    // pinned; tensor table + chunk list
  void* device_table_ = nullptr;  // device copy of host_table_
  size_t table_capacity_bytes_ = 0;
  double* partials_ = nullptr;  // one per chunk
  size_t partials_capacity_ = 0;
  void* verdict_ = nullptr;             // device; written by launch 2
  cudaEvent_t table_copied_ = nullptr;  // host_table_ may be rewritten after it
  cudaEvent_t step_done_ = nullptr;
  bool stepped_ = false;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_CUDA_H_
