// The c10d process groups one rank of a 3-D layout (layout.h) trains with:
// the world, and its tensor, pipeline and data groups. Gloo on the CPU,
// NCCL for CUDA ranks when LibTorch has it; one code path above this.
//
// Every subgroup is its own backend over a PrefixStore
// ("loom/<kind>/<first member>") of the world's store, so a rank builds only
// the groups it belongs to and rendezvous with exactly their members (no
// global "every rank creates every group" step as torch.distributed's
// new_group needs).
#ifndef LOOM_WORKER_ENGINE_PARALLEL_PROCESS_GROUPS_H_
#define LOOM_WORKER_ENGINE_PARALLEL_PROCESS_GROUPS_H_

#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "common/parallel_layout.h"
#include "worker/engine/trainer_config.h"

namespace loom::engine {

// Groups of one rank. `world` always exists; a subgroup of one member is
// null (the helpers of tensor_parallel.h and reduce_scatter.h treat null as
// a group of one).
struct ParallelGroups {
  ParallelLayout layout;
  int rank = 0;  // in the world
  RankCoordinates coordinates;
  std::shared_ptr<c10d::ProcessGroup> world;
  std::shared_ptr<c10d::ProcessGroup> tensor;    // rank in it = coordinates.tp
  std::shared_ptr<c10d::ProcessGroup> pipeline;  // rank in it = coordinates.pp
  std::shared_ptr<c10d::ProcessGroup> data;      // rank in it = coordinates.dp
  // With pipeline > 1, on the first and last stage only: those two stages'
  // ranks of this replica and TP rank, which both hold the tied wte shard
  // (pipeline.h, SumTiedEmbeddingGradients). Null elsewhere.
  std::shared_ptr<c10d::ProcessGroup> embedding;
};

struct ParallelGroupOptions {
  // Collectives and rendezvous fail after this long.
  double timeout_seconds = 300;
  // Gloo: the address this host binds and advertises; empty = Gloo's
  // default (the address the hostname resolves to, else loopback).
  std::string local_addr;
  // NCCL instead of Gloo (the caller has a CUDA device and a LibTorch built
  // with USE_C10D_NCCL; INVALID_ARGUMENT otherwise).
  bool nccl = false;
};

// Builds rank `rank`'s groups over `store` (shared by all ranks of the job;
// a TCPStore across processes, a HashStore in tests). Blocks until every
// member of each group this rank belongs to has joined. Every rank of the
// job must call it with the same layout. INVALID_ARGUMENT for a bad layout
// or rank; INTERNAL when a backend cannot be set up.
absl::StatusOr<ParallelGroups> CreateParallelGroups(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, const ParallelLayout& layout,
                                                    const ParallelGroupOptions& options);

// Across processes: the job's store is a c10d TCPStore that world rank 0
// hosts at rendezvous.master_addr:master_port (GlooGroupOptions' fields:
// rank, world_size, local_addr, timeout), and the backend is NCCL when
// `device` is CUDA and LibTorch has NCCL, else Gloo. `layout` must cover
// rendezvous.world_size ranks. Errors as above.
absl::StatusOr<ParallelGroups> CreateParallelGroups(const GlooGroupOptions& rendezvous,
                                                    const std::string& device,
                                                    const ParallelLayout& layout);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_PROCESS_GROUPS_H_
