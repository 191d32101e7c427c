#include "worker/engine/parallel/p2p_placement.h"

namespace loom::engine {

P2pPlacement P2pPlacementFor(absl::string_view backend_name) {
  return backend_name == "nccl" ? P2pPlacement::kDevice : P2pPlacement::kHost;
}

P2pPlacement P2pPlacementOf(const c10d::ProcessGroup& group) {
  return P2pPlacementFor(group.getBackendName());
}

torch::Tensor StageForSend(const torch::Tensor& t, P2pPlacement placement) {
  torch::Tensor detached = t.detach();
  if (placement == P2pPlacement::kHost && !detached.device().is_cpu()) {
    detached = detached.to(torch::kCPU);
  }
  return detached.contiguous();
}

torch::Tensor ReceiveBuffer(const std::vector<int64_t>& shape, torch::ScalarType dtype,
                            const torch::Device& device, P2pPlacement placement) {
  const torch::Device where = placement == P2pPlacement::kDevice ? device : torch::Device(torch::kCPU);
  return torch::empty(shape, torch::TensorOptions().dtype(dtype).device(where));
}

bool NeedsCopy(P2pPlacement placement, const torch::Device& device) {
  return placement == P2pPlacement::kHost ? !device.is_cpu() : !device.is_cuda();
}

torch::Tensor StageForCollective(const torch::Tensor& t, P2pPlacement placement, bool widen) {
  torch::NoGradGuard no_grad;
  torch::Tensor staged = t;
  if (NeedsCopy(placement, staged.device())) {
    staged = staged.to(placement == P2pPlacement::kHost ? torch::Device(torch::kCPU)
                                                        : torch::Device(torch::kCUDA));
  }
  const auto type = staged.scalar_type();
  if (widen && (type == torch::kBFloat16 || type == torch::kHalf)) staged = staged.to(torch::kFloat);
  if (!staged.is_contiguous()) staged = staged.contiguous();
  return staged;
}

void FinishStaged(torch::Tensor& t, const torch::Tensor& staged) {
  if (staged.is_same(t)) return;
  torch::NoGradGuard no_grad;
  t.copy_(staged);
}

}  // namespace loom::engine
