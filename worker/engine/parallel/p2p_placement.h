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

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_P2P_PLACEMENT_H_
