#include "worker/engine/gradient_averager.h"

#include <chrono>
#include <utility>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

namespace loom::engine {

GradientAverager::GradientAverager(std::vector<torch::Tensor> parameters,
                                   c10d::ProcessGroup* group, int64_t bucket_bytes)
    : parameters_(std::move(parameters)), group_(group) {
  const size_t n = parameters_.size();
  bucket_of_.assign(n, 0);
  views_.resize(n);
  ready_.assign(n, false);
  if (n == 0) return;
  const torch::TensorOptions options = parameters_[0].options().requires_grad(false);
  for (const torch::Tensor& p : parameters_) {
    TORCH_CHECK(p.requires_grad() && p.is_leaf(),
                "GradientAverager: every parameter must be a leaf that requires grad");
    TORCH_CHECK(p.scalar_type() == parameters_[0].scalar_type() &&
                    p.device() == parameters_[0].device(),
                "GradientAverager: parameters must share one dtype and device");
  }
  // Buckets in reverse parameter order, each at most bucket_bytes (at least
  // one tensor).
  size_t end = n;
  while (end > 0) {
    Bucket bucket;
    int64_t bytes = 0;
    size_t begin = end;
    while (begin > 0 &&
           (begin == end || bytes + parameters_[begin - 1].nbytes() <= bucket_bytes)) {
      bytes += parameters_[begin - 1].nbytes();
      --begin;
    }
    int64_t elements = 0;
    for (size_t i = end; i-- > begin;) {
      bucket.parameters.push_back(i);
      elements += parameters_[i].numel();
    }
    bucket.flat = torch::zeros({elements}, options);
    int64_t offset = 0;
    for (size_t i : bucket.parameters) {
      bucket_of_[i] = buckets_.size();
      views_[i] = bucket.flat.narrow(0, offset, parameters_[i].numel()).view_as(parameters_[i]);
      offset += parameters_[i].numel();
    }
    buckets_.push_back(std::move(bucket));
    end = begin;
  }
  self_ = std::make_shared<GradientAverager*>(this);
  std::weak_ptr<GradientAverager*> weak = self_;
  for (size_t i = 0; i < n; ++i) {
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(parameters_[i]);
    TORCH_CHECK(accumulator != nullptr, "GradientAverager: parameter ", i,
                " has no gradient accumulator");
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list&) {
          if (std::shared_ptr<GradientAverager*> self = weak.lock()) (*self)->MarkReady(i);
          return outputs;
        }));
    accumulators_.push_back(std::move(accumulator));
  }
  ZeroGradients();
}

GradientAverager::~GradientAverager() {
  // Hooks of accumulators someone else still holds become no-ops.
  self_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  // A bucket in flight (an exception between Arm and Finish) is waited for:
  // its backend still writes into the buffer.
  for (Bucket& bucket : buckets_) {
    if (!bucket.work) continue;
    try {
      bucket.work->wait();
    } catch (...) {
      // The group failed; the buffers die with us either way.
    }
  }
}

void GradientAverager::ZeroGradients() {
  torch::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) bucket.flat.zero_();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    torch::Tensor p = parameters_[i];
    if (!p.grad().defined() || !p.grad().is_same(views_[i])) p.mutable_grad() = views_[i];
  }
}

void GradientAverager::Arm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  ready_.assign(parameters_.size(), false);
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int>(bucket.parameters.size());
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
  TORCH_CHECK(parameters_[i].grad().is_same(views_[i]),
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
  std::vector<torch::Tensor> tensors = {bucket.flat};
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
  if (group_ != nullptr && group_->getSize() > 1) {
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
