// Collectives of one training rank over an optional c10d process group:
// broadcasts in buckets and small reductions of
// loop-control values. Header-only; used by the training loop (trainer.cc)
// and its checkpoint coordination (checkpoint_coordinator.h).
#ifndef LOOM_WORKER_ENGINE_COLLECTIVES_H_
#define LOOM_WORKER_ENGINE_COLLECTIVES_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

namespace loom::engine {

// Broadcast bucket size (as torch DDP's default bucket_cap_mb, 25).
constexpr int64_t kBucketBytes = int64_t{25} << 20;

// ---------------------------------------------------------------------------
// Collectives of one rank over an optional process group; with no group
// (world size 1) they are identities. c10d's contract applies: every rank
// calls the same collectives in the same order. Errors and timeouts throw
// c10::Error / std::exception, which Train() turns into INTERNAL.
//
// Tensors of any device may be passed: an NCCL group's collectives run on
// `device` (the rank's GPU), any other group's on the CPU, and a tensor
// elsewhere is staged through a copy there (so a Gloo group serves CUDA
// ranks too). On the CPU with Gloo nothing is copied.
class Collectives {
 public:
  Collectives(std::shared_ptr<c10d::ProcessGroup> group, const torch::Device& device)
      : group_(std::move(group)),
        comm_device_(group_ && group_->getBackendName() == "nccl" ? device
                                                                   : torch::Device(torch::kCPU)) {}

  // The group (null for a world of one).
  c10d::ProcessGroup* group() const { return group_.get(); }
  int rank() const { return group_ ? group_->getRank() : 0; }
  int world_size() const { return group_ ? group_->getSize() : 1; }

  // Overwrites `tensors` on every rank with rank 0's values.
  void BroadcastFromRank0(const std::vector<torch::Tensor>& tensors) {
    if (!group_) return;
    torch::NoGradGuard no_grad;
    ForEachBucket(tensors, [&](torch::Tensor& flat) { Broadcast(flat); });
  }

  // Element-wise sum over ranks.
  std::vector<double> Sum(std::vector<double> values) {
    if (!group_) return values;
    torch::Tensor t = torch::tensor(values, torch::kDouble);
    AllReduce(t, c10d::ReduceOp::SUM);
    for (size_t i = 0; i < values.size(); ++i) values[i] = t[i].item<double>();
    return values;
  }

  double Mean(double value) { return Sum({value})[0] / world_size(); }

  // Rank 0's `values`, on every rank (other ranks' must have the same size).
  std::vector<int64_t> BroadcastInts(std::vector<int64_t> values) {
    if (!group_) return values;
    torch::Tensor t = torch::tensor(values, torch::kLong);
    Broadcast(t);
    for (size_t i = 0; i < values.size(); ++i) values[i] = t[i].item<int64_t>();
    return values;
  }

  // Element-wise sum over ranks, exact.
  std::vector<int64_t> SumInts(std::vector<int64_t> values) {
    if (!group_) return values;
    torch::Tensor t = torch::tensor(values, torch::kLong);
    AllReduce(t, c10d::ReduceOp::SUM);
    for (size_t i = 0; i < values.size(); ++i) values[i] = t[i].item<int64_t>();
    return values;
  }

  // Element-wise maximum over ranks.
  std::vector<int64_t> Max(std::vector<int64_t> values) {
    if (!group_) return values;
    torch::Tensor t = torch::tensor(values, torch::kLong);
    AllReduce(t, c10d::ReduceOp::MAX);
    for (size_t i = 0; i < values.size(); ++i) values[i] = t[i].item<int64_t>();
    return values;
  }

  // Rank `root`'s `bytes`, on every rank (other ranks' arguments are
  // ignored).
  std::string BroadcastBytes(std::string bytes, int root = 0) {
    if (!group_) return bytes;
    torch::Tensor size = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kLong);
    Broadcast(size, root);
    const int64_t n = size.item<int64_t>();
    if (n == 0) return "";
    torch::Tensor buffer = torch::empty({n}, torch::kUInt8);
    if (rank() == root) std::memcpy(buffer.data_ptr(), bytes.data(), n);
    Broadcast(buffer, root);
    return std::string(static_cast<const char*>(buffer.data_ptr()), n);
  }

 private:
  void AllReduce(torch::Tensor& t, c10d::ReduceOp::RedOpType op) {
    std::vector<torch::Tensor> tensors = {Staged(t)};
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    group_->allreduce(tensors, options)->wait();
    Unstage(tensors[0], t);
  }

  void Broadcast(torch::Tensor& t, int root = 0) {
    std::vector<torch::Tensor> tensors = {Staged(t)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group_->broadcast(tensors, options)->wait();
    Unstage(tensors[0], t);
  }

  // `t` itself when it is on the collectives' device, else a copy there.
  torch::Tensor Staged(const torch::Tensor& t) const {
    return t.device() == comm_device_ ? t : t.to(comm_device_);
  }
  static void Unstage(const torch::Tensor& staged, torch::Tensor& t) {
    if (!staged.is_same(t)) t.copy_(staged);
  }

  // Calls fn on flat copies of consecutive runs of same-dtype tensors (at
  // most kBucketBytes each, at least one tensor), then copies the results
  // back into the tensors.
  template <typename Fn>
  static void ForEachBucket(const std::vector<torch::Tensor>& tensors, Fn fn) {
    size_t begin = 0;
    while (begin < tensors.size()) {
      size_t end = begin;
      int64_t bytes = 0;
      while (end < tensors.size() &&
             tensors[end].scalar_type() == tensors[begin].scalar_type() &&
             (end == begin || bytes + tensors[end].nbytes() <= kBucketBytes)) {
        bytes += tensors[end].nbytes();
        ++end;
      }
      std::vector<torch::Tensor> parts;
      for (size_t i = begin; i < end; ++i) parts.push_back(tensors[i].reshape({-1}));
      torch::Tensor flat = torch::cat(parts);
      fn(flat);
      int64_t offset = 0;
      for (size_t i = begin; i < end; ++i) {
        torch::Tensor t = tensors[i];
        t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
        offset += t.numel();
      }
      begin = end;
    }
  }

  std::shared_ptr<c10d::ProcessGroup> group_;
  torch::Device comm_device_;
};


}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_COLLECTIVES_H_
