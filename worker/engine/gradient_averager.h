// Data-parallel gradient reduction overlapped with backward, the way
// PyTorch's DistributedDataParallel reducer does it (Li et al. 2020,
// "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
// sec. 3.2.3, "Overlap Computation with Communication").
//
// The parameters' gradients are views into one flat buffer (this object's,
// or the caller's), cut into buckets of at most bucket_bytes (a larger
// tensor gets a bucket alone) of consecutive parameters, formed from the
// last parameter back, which is roughly the order backward produces them.
// A post-hook on each parameter's gradient accumulator marks it ready once
// its gradient of the armed backward has been accumulated; when every
// parameter of a bucket is ready, the bucket's all-reduce (SUM) is launched
// asynchronously while backward goes on with the earlier layers. Buckets
// are launched strictly in index order on every rank (c10d requires every
// rank to issue collectives in the same order), so a ready bucket waits for
// the ones before it. Finish() launches what is left (parameters that got
// no gradient, and deferred ones), waits for every bucket and, when asked
// to average, divides by the world size; the time it blocks is the
// communication that backward did not hide.
//
// Gradient accumulation: only the backward after Arm() triggers launches;
// earlier micro-batches accumulate into the same views (backward adds into
// a defined gradient in place), so the buffers hold the sum over all
// micro-batches when the last one's buckets go out.
//
// Results equal a blocking all-reduce of the same buckets; the sum per
// element is the backend's, so they may differ from another bucketing in the
// last bit for more than two ranks, and are deterministic run to run.
//
// Thread safety: the hooks run on the autograd engine's thread (the calling
// thread on the CPU, a device thread on a GPU); the state they share with
// the training thread is guarded by a mutex. ZeroGradients, Arm and Finish
// are called by the training thread, not concurrently with a backward that
// is not armed. Collective over `group` (Finish and the armed backward).
#ifndef LOOM_WORKER_ENGINE_GRADIENT_AVERAGER_H_
#define LOOM_WORKER_ENGINE_GRADIENT_AVERAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

namespace loom::engine {

// torch DDP's default bucket_cap_mb is 25.
constexpr int64_t kGradientBucketBytes = int64_t{25} << 20;

// One parameter of a caller-owned flat gradient buffer.
struct GradientSlot {
  torch::Tensor parameter;  // a leaf that requires grad
  int64_t offset = 0;       // of its gradient in the flat buffer
  // Buckets never mix segments. Callers whose ranks hold differently sized
  // buffers (a tensor group: vocabulary shards differ) put what is the same
  // everywhere in one segment, so those buckets, and the order in which the
  // backend sums their elements, are the same on every rank.
  int segment = 0;
  // Not marked ready by backward: the caller adds to its gradient after
  // backward (a tied embedding's other copy), and Finish sends its bucket,
  // after every other. Deferred parameters get buckets of their own.
  bool deferred = false;
};

// Adds a post-hook to the gradient accumulator of every slot not deferred:
// once the slot's gradient of a backward has been accumulated, it calls
// `ready(i)` (on the autograd engine's thread). Returns the accumulators,
// which the caller keeps (a parameter holds only a weak reference and would
// make a fresh accumulator, without hooks, each backward). `ready` must
// stay safe to call while they live: callers capture a weak reference to
// themselves and do nothing once it is gone. `who` names the caller in
// errors.
std::vector<std::shared_ptr<torch::autograd::Node>> HookGradientAccumulators(
    const std::vector<GradientSlot>& slots, std::function<void(size_t)> ready, const char* who);

// Waits for `work` (if any) and swallows its failure: for destructors,
// whose buffers a collective still in flight writes into, while the group
// may already have failed.
void WaitIgnoringFailure(const c10::intrusive_ptr<c10d::Work>& work);

class GradientAverager {
 public:
  // Owns the buffer: `parameters` (one dtype and device) get gradient views
  // into it, laid out in the given order, one segment; Finish averages.
  // `group` may be null (world size 1: nothing is communicated). It must
  // outlive this object. Callers must not set the gradients to none or
  // replace them (ZeroGradients reinstalls a replaced view).
  GradientAverager(std::vector<torch::Tensor> parameters, c10d::ProcessGroup* group,
                   int64_t bucket_bytes = kGradientBucketBytes);
  // Over the caller's buffer `flat`, whose views the slots' gradients
  // already are; slots in increasing offset order, each starting where the
  // previous one ended. average = false leaves the sum over the group in
  // the buffer (the caller divides). The caller zeroes the buffer.
  GradientAverager(std::vector<GradientSlot> slots, torch::Tensor flat,
                   c10d::ProcessGroup* group, int64_t bucket_bytes, bool average);
  ~GradientAverager();
  GradientAverager(const GradientAverager&) = delete;
  GradientAverager& operator=(const GradientAverager&) = delete;

  // Zeroes the buffer and makes each parameter's gradient its view again.
  // Call before the first micro-batch of a step.
  void ZeroGradients();

  // The next backward is the step's last: as its gradients become ready,
  // buckets are launched.
  void Arm();

  // Launches any bucket not launched yet, waits for all, divides by the
  // world size if averaging, disarms. Returns the seconds it blocked.
  double Finish();

  int buckets() const { return static_cast<int>(buckets_.size()); }
  // Buckets the last armed backward launched before it returned (the rest
  // went out in Finish). For tests and telemetry.
  int launched_during_backward() const;

 private:
  struct Bucket {
    torch::Tensor flat;               // a view of the buffer
    std::vector<size_t> slots;        // indices into slots_
    int pending = 0;                  // parameters not yet ready (armed backward)
    c10::intrusive_ptr<c10d::Work> work;  // launched all-reduce, if any
    // The host copy a group that cannot take the bucket's device reduces
    // (Gloo, CUDA gradients: parallel/p2p_placement.h), copied back into
    // `flat` by Finish; undefined when the group takes `flat` itself.
    torch::Tensor wire;
  };

  // Cuts the buckets and installs the hooks.
  void Build(int64_t bucket_bytes);
  // The hook of slot i's gradient accumulator.
  void MarkReady(size_t i);
  // Launches every bucket from next_launch_ on whose parameters are all
  // ready. Requires mu_.
  void LaunchReadyLocked();
  void LaunchLocked(Bucket& bucket);

  std::vector<GradientSlot> slots_;
  torch::Tensor flat_;
  c10d::ProcessGroup* group_;
  bool average_ = true;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;     // slot -> bucket
  std::vector<torch::Tensor> views_;  // slot -> its gradient view
  // Strong references keep the accumulators (and so the hooks) alive: a
  // parameter holds only a weak one and would make a fresh accumulator,
  // without hooks, each backward.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  // What the hooks reach this object through; reset first on destruction,
  // so that a hook on an accumulator someone else still holds does nothing.
  std::shared_ptr<GradientAverager*> self_;

  mutable std::mutex mu_;
  bool armed_ = false;
  std::vector<bool> ready_;  // slot -> ready in the armed backward
  size_t next_launch_ = 0;   // buckets before it are launched
  int launched_during_backward_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_GRADIENT_AVERAGER_H_
