// ZeRO-2's gradient reduction (Rajbhandari et al. 2020, sec. 5.2, "P_g:
// gradient partitioning"): no rank holds the whole model's gradients. While
// each backward runs, every gradient goes, bucket by bucket, to the one
// data-parallel rank that owns its slice of the optimizer's flat index
// space, and the other ranks free it.
//
// The flat space is ShardedAdamW's: parameter i's elements are
// [offset_i, offset_i + numel_i), and data-parallel rank r owns
// [r * S, (r + 1) * S). It is cut into buckets: contiguous ranges of at most
// bucket_bytes of fp32, never crossing a shard boundary (so each has one
// owner), a segment boundary (see GradientSlot) or the boundary between
// deferred and ordinary parameters, cut from the end of the space back
// (roughly the order backward produces gradients). A parameter may span
// several buckets.
//
// A post-hook on each ordinary parameter's gradient accumulator runs once
// its gradient of a backward is complete: it adds the gradient into the
// staging buffers of the buckets it overlaps (allocated on first use) and
// releases the parameter's gradient (sets it to none), so the next backward
// allocates a fresh one. When every parameter overlapping a bucket has
// contributed since the bucket's last launch, the bucket's staging buffer is
// reduced (SUM) to its owner, asynchronously. Buckets are launched round
// robin in index order, the same on every rank (c10d matches collectives by
// order): a complete bucket waits for the ones before it. At most
// `max_in_flight` reductions are outstanding; launching one more first
// waits for the oldest (the wait is counted as exposed communication).
// When a reduction completes the owner adds the result into its
// `accumulator` slice and every rank drops the staging buffer.
//
// Deferred parameters (a tied embedding's copy, completed after backward by
// the caller) keep their gradient through backward; Finish() takes it.
//
// Memory: at most the staging buffers of the buckets being filled plus
// `max_in_flight` in flight, instead of the whole gradient; the owned
// accumulator is the optimizer's [S].
//
// The sums are linear, so launching a bucket with several backwards'
// contributions, or one's in two launches, gives the same accumulated
// gradient up to the order of additions. Every rank of the group must run
// the same backwards over the same parameters (data-parallel replicas do):
// then the launch sequence is the same everywhere.
//
// Thread safety: hooks run on the autograd engine's thread; the state they
// share with the caller's thread is guarded by a mutex. Finish is called by
// the caller between backwards. Collective over `group`.
#ifndef LOOM_WORKER_ENGINE_PARALLEL_GRADIENT_PARTITIONER_H_
#define LOOM_WORKER_ENGINE_PARALLEL_GRADIENT_PARTITIONER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "worker/engine/gradient_averager.h"

namespace loom::engine {

class GradientPartitioner {
 public:
  // `slots`: the parameters in increasing offset order, each starting where
  // the previous ended (fp32, on one device). `accumulator`: this rank's
  // [shard_elements] sum, added into (the caller zeroes it). `group` may be
  // null (a group of one: the owner is this rank, nothing is sent); it must
  // outlive this object. max_in_flight >= 1.
  GradientPartitioner(std::vector<GradientSlot> slots, int64_t shard_elements,
                      torch::Tensor accumulator, c10d::ProcessGroup* group,
                      int64_t bucket_bytes = kGradientBucketBytes, int max_in_flight = 2);
  ~GradientPartitioner();
  GradientPartitioner(const GradientPartitioner&) = delete;
  GradientPartitioner& operator=(const GradientPartitioner&) = delete;

  // Takes the deferred parameters' gradients (and releases them), launches
  // every bucket that holds contributions not yet sent, in order, waits for
  // every reduction and adds the owned results into the accumulator.
  // Returns the seconds spent waiting on communication since the previous
  // Finish (in the hooks and here). Call once per optimizer step, after the
  // step's last backward, on every rank alike.
  double Finish();

  int buckets() const { return static_cast<int>(buckets_.size()); }
  // The most bytes of staging buffers alive at once since construction.
  int64_t peak_staging_bytes() const;
  // Reductions launched from hooks (during backward) since construction.
  int64_t launched_during_backward() const;

 private:
  struct Piece {
    size_t bucket;
    int64_t parameter_offset;  // element offset in the parameter
    int64_t bucket_offset;     // element offset in the bucket
    int64_t size;
  };
  struct Bucket {
    int64_t begin = 0;  // in the flat space
    int64_t size = 0;
    int owner = 0;
    bool deferred = false;
    std::vector<size_t> slots;   // overlapping slots
    std::vector<bool> contributed;  // per entry of `slots`, since the last launch
    int contributions = 0;
    torch::Tensor staging;  // undefined until the first contribution
  };
  struct InFlight {
    size_t bucket;
    torch::Tensor staging;
    // The host copy the group reduces when it cannot take staging's device
    // (Gloo, CUDA gradients: p2p_placement.h); undefined otherwise.
    torch::Tensor wire;
    c10::intrusive_ptr<c10d::Work> work;  // null: a group of one
  };

  void Build(int64_t bucket_bytes);
  void MarkReady(size_t slot);
  // Requires mu_. Adds slot's gradient into its buckets and releases it.
  void ContributeLocked(size_t slot);
  // Requires mu_. Launches buckets from next_ on while they are complete.
  void LaunchReadyLocked(bool from_hook);
  void LaunchLocked(Bucket& bucket, size_t index, bool from_hook);
  // Requires mu_. Waits for the oldest reduction and applies it.
  void CompleteOldestLocked();

  std::vector<GradientSlot> slots_;
  std::vector<std::vector<Piece>> pieces_;  // per slot
  int64_t shard_;
  torch::Tensor accumulator_;
  c10d::ProcessGroup* group_;
  int rank_ = 0;
  int max_in_flight_;
  std::vector<Bucket> buckets_;  // ordinary ones first, then deferred
  size_t ordinary_ = 0;          // buckets_[0, ordinary_) are not deferred
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::shared_ptr<GradientPartitioner*> self_;

  mutable std::mutex mu_;
  size_t next_ = 0;  // the ordinary bucket to launch next (round robin)
  std::deque<InFlight> in_flight_;
  int64_t staging_bytes_ = 0, peak_staging_bytes_ = 0;
  int64_t launched_during_backward_ = 0;
  double blocked_seconds_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_GRADIENT_PARTITIONER_H_
