#include "worker/engine/parallel/gradient_partitioner.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <torch/torch.h>

#include "worker/engine/parallel/p2p_placement.h"

namespace loom::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

GradientPartitioner::GradientPartitioner(std::vector<GradientSlot> slots, int64_t shard_elements,
                                         torch::Tensor accumulator, c10d::ProcessGroup* group,
                                         int64_t bucket_bytes, int max_in_flight)
    : slots_(std::move(slots)),
      shard_(shard_elements),
      accumulator_(std::move(accumulator)),
      group_(group),
      max_in_flight_(max_in_flight) {
  TORCH_CHECK(shard_ > 0, "GradientPartitioner: shard_elements must be positive");
  TORCH_CHECK(max_in_flight_ >= 1, "GradientPartitioner: max_in_flight must be at least 1");
  TORCH_CHECK(accumulator_.defined() && accumulator_.numel() == shard_,
              "GradientPartitioner: the accumulator must have shard_elements elements");
  if (group_ != nullptr && group_->getSize() > 1) rank_ = group_->getRank();
  Build(bucket_bytes);
}

void GradientPartitioner::Build(int64_t bucket_bytes) {
  const size_t n = slots_.size();
  pieces_.resize(n);
  if (n == 0) return;
  const int64_t ranks = group_ != nullptr ? group_->getSize() : 1;
  for (size_t i = 0; i < n; ++i) {
    const torch::Tensor& p = slots_[i].parameter;
    TORCH_CHECK(p.requires_grad() && p.is_leaf(),
                "GradientPartitioner: every parameter must be a leaf that requires grad");
    TORCH_CHECK(p.scalar_type() == accumulator_.scalar_type() &&
                    p.device() == accumulator_.device(),
                "GradientPartitioner: parameters must have the accumulator's dtype and device");
    const int64_t expected =
        i == 0 ? slots_[0].offset : slots_[i - 1].offset + slots_[i - 1].parameter.numel();
    TORCH_CHECK(slots_[i].offset == expected && slots_[i].offset >= 0,
                "GradientPartitioner: slot ", i, " at offset ", slots_[i].offset,
                " does not follow the previous one");
  }
  const int64_t end_of_space = slots_.back().offset + slots_.back().parameter.numel();
  TORCH_CHECK(end_of_space <= shard_ * ranks, "GradientPartitioner: ", end_of_space,
              " elements do not fit ", ranks, " shards of ", shard_);
  const int64_t bucket_elements =
      std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(accumulator_.element_size()));

  // Runs of consecutive slots of one segment and kind, cut into buckets from
  // the end back; ordinary buckets first, then deferred ones.
  for (const bool deferred : {false, true}) {
    size_t end = n;
    while (end > 0) {
      if (slots_[end - 1].deferred != deferred) {
        --end;
        continue;
      }
      size_t begin = end - 1;
      while (begin > 0 && slots_[begin - 1].deferred == deferred &&
             slots_[begin - 1].segment == slots_[end - 1].segment) {
        --begin;
      }
      const int64_t run_begin = slots_[begin].offset;
      int64_t cut = slots_[end - 1].offset + slots_[end - 1].parameter.numel();
      while (cut > run_begin) {
        const int owner = static_cast<int>((cut - 1) / shard_);
        const int64_t start = std::max({run_begin, cut - bucket_elements, owner * shard_});
        Bucket bucket;
        bucket.begin = start;
        bucket.size = cut - start;
        bucket.owner = owner;
        bucket.deferred = deferred;
        buckets_.push_back(std::move(bucket));
        cut = start;
      }
      end = begin;
    }
    if (!deferred) ordinary_ = buckets_.size();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    for (size_t i = 0; i < n; ++i) {
      const int64_t p_begin = slots_[i].offset;
      const int64_t p_end = p_begin + slots_[i].parameter.numel();
      const int64_t lo = std::max(p_begin, bucket.begin);
      const int64_t hi = std::min(p_end, bucket.begin + bucket.size);
      if (lo >= hi) continue;
      bucket.slots.push_back(i);
      pieces_[i].push_back({b, lo - p_begin, lo - bucket.begin, hi - lo});
    }
    bucket.contributed.assign(bucket.slots.size(), false);
  }

  self_ = std::make_shared<GradientPartitioner*>(this);
  std::weak_ptr<GradientPartitioner*> weak = self_;
  accumulators_ = HookGradientAccumulators(
      slots_,
      [weak](size_t i) {
        if (std::shared_ptr<GradientPartitioner*> self = weak.lock()) (*self)->MarkReady(i);
      },
      "GradientPartitioner");
}

GradientPartitioner::~GradientPartitioner() {
  self_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  // Reductions in flight (an exception between backward and Finish) still
  // read their staging buffers.
  for (InFlight& f : in_flight_) WaitIgnoringFailure(f.work);
}

void GradientPartitioner::MarkReady(size_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  ContributeLocked(slot);
  LaunchReadyLocked(/*from_hook=*/true);
}

void GradientPartitioner::ContributeLocked(size_t slot) {
  torch::Tensor parameter = slots_[slot].parameter;
  const torch::Tensor grad = parameter.grad();
  if (!grad.defined()) return;  // no gradient this time: nothing to send
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = grad.contiguous().view({-1});
  for (const Piece& piece : pieces_[slot]) {
    Bucket& bucket = buckets_[piece.bucket];
    if (!bucket.staging.defined()) {
      bucket.staging = torch::zeros({bucket.size}, accumulator_.options());
      staging_bytes_ += bucket.staging.nbytes();
      peak_staging_bytes_ = std::max(peak_staging_bytes_, staging_bytes_);
    }
    bucket.staging.narrow(0, piece.bucket_offset, piece.size)
        .add_(flat.narrow(0, piece.parameter_offset, piece.size));
    const size_t entry = static_cast<size_t>(
        std::find(bucket.slots.begin(), bucket.slots.end(), slot) - bucket.slots.begin());
    if (!bucket.contributed[entry]) {
      bucket.contributed[entry] = true;
      ++bucket.contributions;
    }
  }
  // The gradient now lives in the staging buffers; the next backward
  // allocates a fresh one.
  parameter.mutable_grad() = torch::Tensor();
}

void GradientPartitioner::LaunchReadyLocked(bool from_hook) {
  if (ordinary_ == 0) return;
  // At most one round per call: a bucket launched stays unready until all
  // of its slots contribute again.
  for (size_t k = 0; k < ordinary_; ++k) {
    Bucket& bucket = buckets_[next_];
    if (bucket.contributions != static_cast<int>(bucket.slots.size())) return;
    LaunchLocked(bucket, next_, from_hook);
    next_ = (next_ + 1) % ordinary_;
  }
}

void GradientPartitioner::LaunchLocked(Bucket& bucket, size_t index, bool from_hook) {
  while (static_cast<int>(in_flight_.size()) >= max_in_flight_) CompleteOldestLocked();
  InFlight f;
  f.bucket = index;
  f.staging = std::move(bucket.staging);
  bucket.staging = torch::Tensor();
  bucket.contributed.assign(bucket.slots.size(), false);
  bucket.contributions = 0;
  if (!f.staging.defined()) {
    // Launched by Finish with nothing in it on this rank: every rank sends
    // the same sequence, so send zeros.
    f.staging = torch::zeros({bucket.size}, accumulator_.options());
    staging_bytes_ += f.staging.nbytes();
    peak_staging_bytes_ = std::max(peak_staging_bytes_, staging_bytes_);
  }
  if (group_ != nullptr && group_->getSize() > 1) {
    torch::Tensor sent = f.staging;
    if (NeedsCopy(P2pPlacementOf(*group_), sent.device())) {
      torch::NoGradGuard no_grad;
      sent = f.wire = StageForCollective(f.staging, P2pPlacementOf(*group_));
    }
    std::vector<torch::Tensor> tensors = {sent};
    c10d::ReduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.rootRank = bucket.owner;
    options.rootTensor = 0;
    f.work = group_->reduce(tensors, options);
  }
  if (from_hook) ++launched_during_backward_;
  in_flight_.push_back(std::move(f));
}

void GradientPartitioner::CompleteOldestLocked() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (f.work) {
    const auto start = std::chrono::steady_clock::now();
    f.work->wait();
    blocked_seconds_ += SecondsSince(start);
  }
  const Bucket& bucket = buckets_[f.bucket];
  if (bucket.owner == rank_) {
    torch::NoGradGuard no_grad;
    accumulator_.narrow(0, bucket.begin - bucket.owner * shard_, bucket.size)
        .add_(f.wire.defined() ? f.wire.to(accumulator_.device()) : f.staging);
  }
  staging_bytes_ -= f.staging.nbytes();
}

double GradientPartitioner::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].deferred) ContributeLocked(i);
  }
  // What backward left: one pass over the ordinary buckets from where the
  // round robin stands, then the deferred ones, each only if it holds
  // something (the same on every rank: the same backwards ran).
  for (size_t k = 0; k < ordinary_; ++k) {
    const size_t index = (next_ + k) % ordinary_;
    if (buckets_[index].contributions > 0) LaunchLocked(buckets_[index], index, false);
  }
  next_ = 0;
  for (size_t index = ordinary_; index < buckets_.size(); ++index) {
    if (buckets_[index].contributions > 0) LaunchLocked(buckets_[index], index, false);
  }
  while (!in_flight_.empty()) CompleteOldestLocked();
  const double seconds = blocked_seconds_;
  blocked_seconds_ = 0;
  return seconds;
}

int64_t GradientPartitioner::peak_staging_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_staging_bytes_;
}

int64_t GradientPartitioner::launched_during_backward() const {
  std::lock_guard<std::mutex> lock(mu_);
  return launched_during_backward_;
}

}  // namespace loom::engine
