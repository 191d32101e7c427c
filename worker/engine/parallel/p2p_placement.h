// Where a pipeline's point-to-point tensors travel (pipeline.cc), by the
// process group's backend. NCCL sends and receives only device (CUDA)
// tensors and refuses host ones; Gloo moves only host memory (its transport
// reads the raw pointer, and on LibTorch 2.x Loom registers it for the CPU
// device type alone). So an NCCL group exchanges the rank's device tensors
// directly, and a Gloo group stages them through host memory (a CPU rank's
// tensors are host tensors already: no copy).
#ifndef LOOM_WORKER_ENGINE_PARALLEL_P2P_PLACEMENT_H_
#define LOOM_WORKER_ENGINE_PARALLEL_P2P_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "absl/strings/string_view.h"

namespace loom::engine {

enum class P2pPlacement {
  kDevice,  // the rank's own device tensors (NCCL)
  kHost,    // host copies (Gloo, and any backend not known to take devices)
};

// "nccl" -> kDevice; anything else ("gloo", "undefined") -> kHost.
P2pPlacement P2pPlacementFor(absl::string_view backend_name);
// For `group`'s default backend (ProcessGroup::getBackendName()).
P2pPlacement P2pPlacementOf(const c10d::ProcessGroup& group);

// What to post for sending `t`: itself, detached and contiguous, for
// kDevice; a contiguous host copy for kHost. The caller keeps it alive until
// the send completes.
torch::Tensor StageForSend(const torch::Tensor& t, P2pPlacement placement);

// An uninitialized receive buffer of `shape` and `dtype`: on `device` for
// kDevice, on the host for kHost (then moved to `device` by the caller).
torch::Tensor ReceiveBuffer(const std::vector<int64_t>& shape, torch::ScalarType dtype,
                            const torch::Device& device, P2pPlacement placement);

// Collectives follow the same rule as point-to-point (tensor_parallel.h
// AllReduceInPlace and BroadcastInPlace, reduce_scatter.h, the ZeRO-2
// partitioner): whether a tensor on `device` must be copied before a
// collective of `placement` runs on it. kHost needs host memory; kDevice
// needs CUDA memory.
bool NeedsCopy(P2pPlacement placement, const torch::Device& device);

// The tensor a collective of `placement` runs on for `t`: `t` itself when it
// is contiguous, on the right side, and (with `widen`) not a 16-bit float;
// else a contiguous copy on the host (kHost) or the current CUDA device
// (kDevice, for a host tensor), with bf16 and fp16 widened to fp32 when
// `widen` (Gloo has no bf16 reduction). Copies are made without autograd.
torch::Tensor StageForCollective(const torch::Tensor& t, P2pPlacement placement,
                                 bool widen = false);

// After the collective: copies `staged` back into `t` (keeping t's device and
// dtype) unless StageForCollective returned `t` itself.
void FinishStaged(torch::Tensor& t, const torch::Tensor& staged);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_P2P_PLACEMENT_H_
