// Reduce-scatter and all-gather of one flat buffer over a c10d group: the
// two collectives of sharded data parallelism (ZeRO, sharded_adamw.h).
//
// LibTorch 1.13's Gloo backend has no reduce_scatter. kRing builds it from
// Gloo's point-to-point send/recv as the ring algorithm (Patarasuk & Yuan
// 2009; the first half of ring all-reduce): n - 1 steps, in each of which
// every rank sends one chunk to its successor and adds the chunk it
// receives from its predecessor, so each rank moves (n-1)/n of the buffer
// once, half of what an all-reduce moves. kAllReduce is the fallback that
// all-reduces the whole buffer and keeps a slice (twice the traffic);
// `bench/run.sh zero` measures both. On NCCL, kNative calls the backend's
// reduce_scatter.
#ifndef LOOM_WORKER_ENGINE_PARALLEL_REDUCE_SCATTER_H_
#define LOOM_WORKER_ENGINE_PARALLEL_REDUCE_SCATTER_H_

#include <cstdint>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

namespace loom::engine {

enum class ReduceScatterAlgorithm {
  kAuto,       // kNative on NCCL, kRing otherwise
  kNative,     // the backend's reduce_scatter (NCCL)
  kRing,       // built from send/recv
  kAllReduce,  // all-reduce of the whole buffer, then a slice
};
const char* ReduceScatterAlgorithmName(ReduceScatterAlgorithm algorithm);

// `flat` is a contiguous 1-D buffer of n * chunk elements, the same size on
// every rank of `group` (n = group size). On return, chunk r of this rank's
// `flat` (r = its rank in the group) holds the element-wise sum of chunk r
// over all ranks; the other chunks hold partial sums and are garbage to the
// caller. A null group or one of size 1 leaves `flat` as it is. Collective;
// throws on failure or timeout.
//
// `scratch` (optional) is a buffer the ring may keep between calls: it is
// (re)allocated to one chunk when its size differs. Gloo transfers into
// memory it has not moved before run several times slower (the first of
// bench/zero_bench.cc's rounds), so callers that reduce every step (the
// optimizer) keep theirs, and keep `flat` too.
void ReduceScatterInPlace(torch::Tensor& flat, c10d::ProcessGroup* group,
                          ReduceScatterAlgorithm algorithm = ReduceScatterAlgorithm::kAuto,
                          torch::Tensor* scratch = nullptr);

// The inverse layout: chunk r of `flat` comes from rank r's chunk r; every
// rank ends with the whole buffer. Collective; throws on failure.
void AllGatherInPlace(torch::Tensor& flat, c10d::ProcessGroup* group);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_REDUCE_SCATTER_H_
