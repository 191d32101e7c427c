// A c10d backend (Gloo, NCCL) as the std::shared_ptr<c10d::ProcessGroup>
// that Train() takes, on LibTorch 1.13 and 2.x alike. Header-only; includes
// c10d, so only for code that builds with LibTorch.
//
// LibTorch 2.x split c10d's ProcessGroup (the front end) from the backends,
// to which it dispatches by the tensors' device type; in 1.13 a backend is a
// ProcessGroup itself. Either way the result is a shared_ptr whose deleter
// owns one intrusive reference, so the group dies when both the last
// shared_ptr and any intrusive_ptr are gone.
#ifndef LOOM_WORKER_ENGINE_PROCESS_GROUP_HANDLE_H_
#define LOOM_WORKER_ENGINE_PROCESS_GROUP_HANDLE_H_

#include <memory>
#include <utility>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

namespace loom::engine {

// `backend` is rank `rank` of `world_size` on `store`; `nccl` says which
// backend type it is (a CUDA backend on 2.x), else Gloo (CPU).
template <typename BackendImpl>
std::shared_ptr<c10d::ProcessGroup> AsProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                   c10::intrusive_ptr<BackendImpl> backend,
                                                   int rank, int world_size, bool nccl) {
#if TORCH_VERSION_MAJOR >= 2
  const auto type =
      nccl ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setBackend(nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU, type,
                    c10::intrusive_ptr<c10d::Backend>(std::move(backend)));
  group->setDefaultBackend(type);
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)nccl;
  c10::intrusive_ptr<c10d::ProcessGroup> group = std::move(backend);
#endif
  c10d::ProcessGroup* raw = group.get();
  return std::shared_ptr<c10d::ProcessGroup>(
      raw, [owner = std::move(group)](c10d::ProcessGroup*) mutable { owner.reset(); });
}

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PROCESS_GROUP_HANDLE_H_
