#include "worker/engine/parallel/process_groups.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/engine/parallel/nccl_errors.h"
#include "worker/engine/process_group_handle.h"

namespace loom::engine {
namespace {

// Rank `index` of the group of `size` members whose rendezvous keys live
// under `prefix` in `store`.
std::shared_ptr<c10d::ProcessGroup> MakeBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                const std::string& prefix, int index, int size,
                                                const ParallelGroupOptions& options) {
  auto scoped = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000));
#ifdef USE_C10D_NCCL
  if (options.nccl) {
    // A timeout or NCCL error then throws in the waiting thread, as Gloo's
    // do, instead of aborting the process from the watchdog (nccl_errors.h).
    ConfigureNcclErrorHandling();
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    // The job's collective timeout (LibTorch's default is 10 or 30 minutes).
    nccl_options->timeout = timeout;
    return AsProcessGroup(
        scoped, c10::make_intrusive<c10d::ProcessGroupNCCL>(scoped, index, size, nccl_options),
        index, size, /*nccl=*/true, timeout);
  }
#endif
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
  gloo_options->devices.push_back(
      options.local_addr.empty()
          ? c10d::ProcessGroupGloo::createDefaultDevice()
          : c10d::ProcessGroupGloo::createDeviceForHostname(options.local_addr));
  return AsProcessGroup(
      scoped, c10::make_intrusive<c10d::ProcessGroupGloo>(scoped, index, size, gloo_options),
      index, size, /*nccl=*/false, timeout);
}

}  // namespace

absl::StatusOr<ParallelGroups> CreateParallelGroups(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, const ParallelLayout& layout,
                                                    const ParallelGroupOptions& options) {
  RETURN_IF_ERROR(ValidateLayout(layout, layout.world_size()));
  if (rank < 0 || rank >= layout.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside [0, ", layout.world_size(), ")"));
  }
  if (!(options.timeout_seconds > 0)) {
    return absl::InvalidArgumentError("timeout_seconds must be > 0");
  }
#ifndef USE_C10D_NCCL
  if (options.nccl) {
    return absl::InvalidArgumentError(
        "NCCL process groups need a LibTorch built with NCCL (USE_C10D_NCCL); this one has none");
  }
#endif
  ParallelGroups groups;
  groups.layout = layout;
  groups.rank = rank;
  groups.coordinates = CoordinatesOf(layout, rank);
  try {
    groups.world = MakeBackend(store, "loom/world", rank, layout.world_size(), options);
    // Always in the order tensor, pipeline, data, embedding: creation blocks until the
    // group's members have joined, and every rank creates its groups in the
    // same order, so no rank waits on a peer stuck in another rendezvous.
    const struct {
      GroupKind kind;
      std::shared_ptr<c10d::ProcessGroup>* slot;
    } kinds[] = {{GroupKind::kTensor, &groups.tensor},
                 {GroupKind::kPipeline, &groups.pipeline},
                 {GroupKind::kData, &groups.data}};
    for (const auto& k : kinds) {
      const std::vector<int> members = k.kind == GroupKind::kTensor ? TensorGroupOf(layout, rank)
                                       : k.kind == GroupKind::kPipeline
                                           ? PipelineGroupOf(layout, rank)
                                           : DataGroupOf(layout, rank);
      if (members.size() < 2) continue;
      const int index = static_cast<int>(
          std::find(members.begin(), members.end(), rank) - members.begin());
      *k.slot = MakeBackend(store, absl::StrCat("loom/", GroupKindName(k.kind), "/", members[0]),
                            index, static_cast<int>(members.size()), options);
    }
    const RankCoordinates me = groups.coordinates;
    if (layout.pipeline > 1 && (me.pp == 0 || me.pp == layout.pipeline - 1)) {
      const int first = RankOf(layout, {me.dp, 0, me.tp});
      groups.embedding = MakeBackend(store, absl::StrCat("loom/embedding/", first),
                                     me.pp == 0 ? 0 : 1, 2, options);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("creating the process groups of rank ", rank, " (",
                                            LayoutName(layout), "): ", e.what()));
  }
  return groups;
}

absl::StatusOr<ParallelGroups> CreateParallelGroups(const GlooGroupOptions& rendezvous,
                                                    const std::string& device,
                                                    const ParallelLayout& layout) {
  RETURN_IF_ERROR(ValidateLayout(layout, rendezvous.world_size));
  if (rendezvous.rank < 0 || rendezvous.rank >= rendezvous.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rendezvous.rank, " outside [0, ",
                                                   rendezvous.world_size, ")"));
  }
  if (rendezvous.master_port < 1 || rendezvous.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("master_port ", rendezvous.master_port, " outside [1, 65535]"));
  }
  if (!(rendezvous.timeout_seconds > 0)) {
    return absl::InvalidArgumentError("timeout_seconds must be > 0");
  }
  ParallelGroupOptions options;
  options.timeout_seconds = rendezvous.timeout_seconds;
  options.local_addr = rendezvous.local_addr;
  options.nccl = absl::StartsWith(device, "cuda");
#ifndef USE_C10D_NCCL
  options.nccl = false;  // Gloo serves CUDA ranks through host staging
#endif
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(rendezvous.master_port);
    store_options.isServer = rendezvous.rank == 0;
    store_options.numWorkers = rendezvous.world_size;
    store_options.waitWorkers = true;
    store_options.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(rendezvous.timeout_seconds * 1000));
#if LOOM_TORCH_AT_LEAST(2, 4)
    // From 2.4 the store defaults to its libuv server, which a LibTorch built
    // without libuv (Debian's 2.6) refuses at construction; the classic
    // server is in every build.
    store_options.useLibUV = false;
#endif
    store = c10::make_intrusive<c10d::TCPStore>(rendezvous.master_addr, store_options);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("joining the store of rank ", rendezvous.rank,
                                            " of ", rendezvous.world_size, " at ",
                                            rendezvous.master_addr, ":", rendezvous.master_port,
                                            ": ", e.what()));
  }
  if (!rendezvous.store_namespace.empty()) {
    store = c10::make_intrusive<c10d::PrefixStore>(rendezvous.store_namespace, store);
  }
  return CreateParallelGroups(store, rendezvous.rank, layout, options);
}

}  // namespace loom::engine
