#include "worker/engine/gradient_averager.h"

#include <chrono>
#include <utility>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "worker/engine/parallel/p2p_placement.h"

namespace loom::engine {

GradientAverager::GradientAverager(std::vector<torch::Tensor> parameters,
                                   c10d::ProcessGroup* group, int64_t bucket_bytes)
    : group_(group), average_(true) {
  int64_t total = 0;
  for (torch::Tensor& p : parameters) {
    slots_.push_back({p, total, 0, false});
    total += p.numel();
  }
  if (!parameters.empty()) {
    flat_ = torch::zeros({total}, parameters[0].options().requires_grad(false));
  }
  Build(bucket_bytes);
  ZeroGradients();
}

GradientAverager::GradientAverager(std::vector<GradientSlot> slots, torch::Tensor flat,
                                   c10d::ProcessGroup* group, int64_t bucket_bytes, bool average)
    : slots_(std::move(slots)), flat_(std::move(flat)), group_(group), average_(average) {
  Build(bucket_bytes);
}

void GradientAverager::Build(int64_t bucket_bytes) {
  const size_t n = slots_.size();
  bucket_of_.assign(n, 0);
  views_.resize(n);
  ready_.assign(n, false);
  if (n == 0) return;
  for (size_t i = 0; i < n; ++i) {
    const torch::Tensor& p = slots_[i].parameter;
    TORCH_CHECK(p.requires_grad() && p.is_leaf(),
                "GradientAverager: every parameter must be a leaf that requires grad");
    TORCH_CHECK(p.scalar_type() == flat_.scalar_type() && p.device() == flat_.device(),
                "GradientAverager: parameters must have the buffer's dtype and device");
    const int64_t expected = i == 0 ? slots_[0].offset
                                    : slots_[i - 1].offset + slots_[i - 1].parameter.numel();
    TORCH_CHECK(slots_[i].offset == expected && slots_[i].offset >= 0 &&
                    slots_[i].offset + p.numel() <= flat_.numel(),
                "GradientAverager: slot ", i, " at offset ", slots_[i].offset,
                " does not follow the previous one in the buffer");
    views_[i] = flat_.narrow(0, slots_[i].offset, p.numel()).view_as(p);
  }
  // Buckets of consecutive slots of one segment and one kind, cut from the
  // last slot back: first the ones backward completes, then the deferred.
  auto cut = [&](bool deferred) {
    size_t end = n;
    while (end > 0) {
      if (slots_[end - 1].deferred != deferred) {
        --end;
        continue;
      }
      size_t begin = end - 1;
      int64_t bytes = slots_[begin].parameter.nbytes();
      while (begin > 0 && slots_[begin - 1].deferred == deferred &&
             slots_[begin - 1].segment == slots_[end - 1].segment &&
             bytes + static_cast<int64_t>(slots_[begin - 1].parameter.nbytes()) <= bucket_bytes) {
        --begin;
        bytes += slots_[begin].parameter.nbytes();
      }
      Bucket bucket;
      int64_t elements = 0;
      for (size_t i = end; i-- > begin;) {
        bucket.slots.push_back(i);
        bucket_of_[i] = buckets_.size();
        elements += slots_[i].parameter.numel();
      }
      bucket.flat = flat_.narrow(0, slots_[begin].offset, elements);
      buckets_.push_back(std::move(bucket));
      end = begin;
    }
  };
  cut(/*deferred=*/false);
  cut(/*deferred=*/true);
  self_ = std::make_shared<GradientAverager*>(this);
  std::weak_ptr<GradientAverager*> weak = self_;
  accumulators_ = HookGradientAccumulators(
      slots_,
      [weak](size_t i) {
        if (std::shared_ptr<GradientAverager*> self = weak.lock()) (*self)->MarkReady(i);
      },
      "GradientAverager");
}

void WaitIgnoringFailure(const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work) return;
  try {
    work->wait();
  } catch (...) {
    // The group failed; the buffers die with their owner either way.
  }
}

std::vector<std::shared_ptr<torch::autograd::Node>> HookGradientAccumulators(
    const std::vector<GradientSlot>& slots, std::function<void(size_t)> ready, const char* who) {
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  auto shared_ready = std::make_shared<std::function<void(size_t)>>(std::move(ready));
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].deferred) continue;
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(slots[i].parameter);
    TORCH_CHECK(accumulator != nullptr, who, ": parameter ", i, " has no gradient accumulator");
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [shared_ready, i](const torch::autograd::variable_list& outputs,
                          const torch::autograd::variable_list&) {
          (*shared_ready)(i);
          return outputs;
        }));
    accumulators.push_back(std::move(accumulator));
  }
  return accumulators;
}

GradientAverager::~GradientAverager() {
  // Hooks of accumulators someone else still holds become no-ops.
  self_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  // A bucket in flight (an exception between Arm and Finish) is waited for:
  // its backend still writes into the buffer.
  for (Bucket& bucket : buckets_) WaitIgnoringFailure(bucket.work);
}

void GradientAverager::ZeroGradients() {
  torch::NoGradGuard no_grad;
  if (flat_.defined()) flat_.zero_();
  for (size_t i = 0; i < slots_.size(); ++i) {
    torch::Tensor p = slots_[i].parameter;
    if (!p.grad().defined() || p.grad().data_ptr() != views_[i].data_ptr()) {
      p.mutable_grad() = views_[i];
    }
  }
}

void GradientAverager::Arm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  ready_.assign(slots_.size(), false);
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int>(bucket.slots.size());
    bucket.work.reset();
  }
  next_launch_ = 0;
  launched_during_backward_ = 0;
}

void GradientAverager::MarkReady(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_ || ready_[i]) return;
  // Backward replaced the view (it would only do so for a gradient that was
  // not defined): the reduction would miss it. ZeroGradients prevents this.
  const torch::Tensor& grad = slots_[i].parameter.grad();
  TORCH_CHECK(grad.defined() && grad.data_ptr() == views_[i].data_ptr(),
              "GradientAverager: parameter ", i, "'s gradient is no longer its bucket view");
  ready_[i] = true;
  Bucket& bucket = buckets_[bucket_of_[i]];
  --bucket.pending;
  if (bucket.pending == 0) {
    const size_t before = next_launch_;
    LaunchReadyLocked();
    launched_during_backward_ += static_cast<int>(next_launch_ - before);
  }
}

void GradientAverager::LaunchReadyLocked() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    LaunchLocked(buckets_[next_launch_]);
    ++next_launch_;
  }
}

void GradientAverager::LaunchLocked(Bucket& bucket) {
  if (group_ == nullptr || group_->getSize() == 1) return;
  torch::Tensor sent = bucket.flat;
  if (NeedsCopy(P2pPlacementOf(*group_), sent.device())) {
    torch::NoGradGuard no_grad;
    sent = bucket.wire = StageForCollective(bucket.flat, P2pPlacementOf(*group_));
  }
  std::vector<torch::Tensor> tensors = {sent};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  bucket.work = group_->allreduce(tensors, options);
}

double GradientAverager::Finish() {
  const auto start = std::chrono::steady_clock::now();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(armed_, "GradientAverager::Finish without Arm");
    // Parameters that got no gradient this backward keep zeros: their
    // buckets go out now, in order.
    for (Bucket& bucket : buckets_) bucket.pending = 0;
    LaunchReadyLocked();
    armed_ = false;
    for (Bucket& bucket : buckets_) {
      if (bucket.work) works.push_back(std::move(bucket.work));
      bucket.work.reset();
    }
  }
  for (auto& work : works) work->wait();
  for (Bucket& bucket : buckets_) {
    if (!bucket.wire.defined()) continue;
    FinishStaged(bucket.flat, bucket.wire);
    bucket.wire = torch::Tensor();
  }
  if (average_ && group_ != nullptr && group_->getSize() > 1) {
    torch::NoGradGuard no_grad;
    const double world = group_->getSize();
    for (Bucket& bucket : buckets_) bucket.flat.div_(world);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int GradientAverager::launched_during_backward() const {
  std::lock_guard<std::mutex> lock(mu_);
  return launched_during_backward_;
}

}  // namespace loom::engine
