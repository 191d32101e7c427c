// A c10d backend (Gloo, NCCL) as the std::shared_ptr<c10d::ProcessGroup>
// that Train() takes, on LibTorch 1.13 and 2.0 or later alike. Header-only; includes
// c10d, so only for code that builds with LibTorch.
//
// LibTorch 2.x split c10d's ProcessGroup (the front end) from the backends,
// to which it dispatches by the tensors' device type; in 1.13 a backend is a
// ProcessGroup itself. Either way the result is a shared_ptr whose deleter
// owns one intrusive reference, so the group dies when both the last
// shared_ptr and any intrusive_ptr are gone.
#ifndef LOOM_WORKER_ENGINE_PROCESS_GROUP_HANDLE_H_
#define LOOM_WORKER_ENGINE_PROCESS_GROUP_HANDLE_H_

#include <chrono>
#include <memory>
#include <utility>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

namespace loom::engine {

// True when the LibTorch being compiled against is at least M.m.
#define LOOM_TORCH_AT_LEAST(M, m) \
  (TORCH_VERSION_MAJOR > (M) || (TORCH_VERSION_MAJOR == (M) && TORCH_VERSION_MINOR >= (m)))

// `backend` is rank `rank` of `world_size` on `store`; `nccl` says which
// backend type it is (a CUDA backend on 2.x), else Gloo (CPU). `timeout` is
// the group's default collective timeout on 2.0-2.5, whose front end takes
// it with its backend name (the backend has its own either way).
//
// The front end by version (PyTorch's c10d/ProcessGroup.hpp):
//   1.13      the backend is the ProcessGroup;
//   2.0-2.5   ProcessGroup(store, rank, size, Options{backend name, timeout})
//             names the default backend;
//   2.6-      ProcessGroup(store, rank, size), then setDefaultBackend.
// setBackend registers the backend for its device type from 2.0 on.
template <typename BackendImpl>
std::shared_ptr<c10d::ProcessGroup> AsProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                   c10::intrusive_ptr<BackendImpl> backend,
                                                   int rank, int world_size, bool nccl,
                                                   std::chrono::milliseconds timeout) {
#if TORCH_VERSION_MAJOR >= 2
  const auto type =
      nccl ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
#if LOOM_TORCH_AT_LEAST(2, 6)
  (void)timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setDefaultBackend(type);
#else
  auto group = c10::make_intrusive<c10d::ProcessGroup>(
      store, rank, world_size,
      c10::make_intrusive<c10d::ProcessGroup::Options>(nccl ? "nccl" : "gloo", timeout));
#endif
  group->setBackend(nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU, type,
                    c10::intrusive_ptr<c10d::Backend>(std::move(backend)));
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)nccl;
  (void)timeout;
  c10::intrusive_ptr<c10d::ProcessGroup> group = std::move(backend);
#endif
  c10d::ProcessGroup* raw = group.get();
  return std::shared_ptr<c10d::ProcessGroup>(
      raw, [owner = std::move(group)](c10d::ProcessGroup*) mutable { owner.reset(); });
}

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PROCESS_GROUP_HANDLE_H_
