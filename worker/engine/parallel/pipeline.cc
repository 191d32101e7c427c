#include "worker/engine/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>

#include <torch/autograd.h>

#include "worker/engine/parallel/p2p_placement.h"
#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {
namespace {

// Point-to-point tags: activations flow down the pipeline, gradients up.
// Gloo matches a recv to the sends of its source with the same tag, in
// order, so each direction needs only one tag.
constexpr int kActivationTag = 0x11a;
constexpr int kGradientTag = 0x11b;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Sends are posted and waited for later: a stage never blocks on a send, so
// the only blocking operations are receives, which 1F1B orders so that each
// one's matching send is already posted (Narayanan et al. 2021, sec. 2.2.1).
// Tensors travel as the group's backend takes them (p2p_placement.h): an
// NCCL group's on the rank's device, a Gloo group's through host memory.
class PointToPoint {
 public:
  explicit PointToPoint(c10d::ProcessGroup* group)
      : group_(group),
        placement_(group ? P2pPlacementOf(*group) : P2pPlacement::kHost) {}
  ~PointToPoint() {
    // Unwinding from an error: the peers may never receive, and waiting for
    // the collective timeout would only delay the real error.
    if (std::uncaught_exceptions() > 0) return;
    try {
      Drain();
    } catch (...) {
      // Destruction after an error: the error already propagates.
    }
  }

  void Send(const torch::Tensor& t, int peer, int tag) {
    torch::Tensor staged = StageForSend(t, placement_);
    std::vector<torch::Tensor> tensors = {staged};
    pending_.push_back({group_->send(tensors, peer, tag), staged});
  }

  torch::Tensor Recv(const std::vector<int64_t>& shape, const torch::Device& device, int peer,
                     int tag, double* wait_seconds) {
    // Stage boundaries carry the fp32 residual stream and its gradient.
    std::vector<torch::Tensor> tensors = {ReceiveBuffer(shape, torch::kFloat, device, placement_)};
    const double start = Now();
    group_->recv(tensors, peer, tag)->wait();
    if (wait_seconds) *wait_seconds += Now() - start;
    return tensors[0].to(device);
  }

  void Drain() {
    for (auto& p : pending_) p.work->wait();
    pending_.clear();
  }

 private:
  struct Pending {
    c10::intrusive_ptr<c10d::Work> work;
    torch::Tensor buffer;  // kept alive until the send completes
  };
  c10d::ProcessGroup* group_;
  P2pPlacement placement_;
  std::deque<Pending> pending_;
};

}  // namespace

std::vector<PipelineOp> OneFOneBSchedule(int stages, int stage, int micro_batches) {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineOp> ops;
  int forward = 0, backward = 0;
  for (; forward < warmup; ++forward) ops.push_back({PipelineOp::kForward, forward});
  while (forward < micro_batches) {
    ops.push_back({PipelineOp::kForward, forward++});
    ops.push_back({PipelineOp::kBackward, backward++});
  }
  while (backward < micro_batches) ops.push_back({PipelineOp::kBackward, backward++});
  return ops;
}

double RunOneFOneB(ParallelGptImpl& model, c10d::ProcessGroup* pipeline_group,
                   const std::vector<torch::Tensor>& inputs,
                   const std::vector<torch::Tensor>& targets, PipelineTimes* times,
                   const std::function<void()>& before_last_backward) {
  const int m = static_cast<int>(inputs.size());
  TORCH_CHECK(m >= 1 && targets.size() == inputs.size(),
              "RunOneFOneB needs as many targets as inputs, and at least one");
  const int stages = pipeline_group ? pipeline_group->getSize() : 1;
  const int stage = pipeline_group ? pipeline_group->getRank() : 0;
  const bool first = stage == 0, last = stage == stages - 1;
  TORCH_CHECK(model.partition().embedding == first && model.partition().head == last,
              "stage ", stage, " of ", stages, " holds the wrong part of the model");
  const torch::Device device = inputs[0].device();
  PointToPoint p2p(pipeline_group);
  PipelineTimes local;

  // Per micro-batch in flight: the stage's input (a leaf that receives the
  // gradient to send up) and output (or the loss on the last stage).
  std::vector<torch::Tensor> stage_input(m), stage_output(m);
  torch::Tensor loss_sum = torch::zeros({}, torch::kDouble);
  for (const PipelineOp& op : OneFOneBSchedule(stages, stage, m)) {
    const int i = op.micro_batch;
    const std::vector<int64_t> activation_shape = {inputs[i].size(0), inputs[i].size(1),
                                                   model.config().d_model};
    if (op.kind == PipelineOp::kForward) {
      torch::Tensor x;
      if (first) {
        const double start = Now();
        x = model.Embed(inputs[i]);
        local.forward_seconds += Now() - start;
      } else {
        x = p2p.Recv(activation_shape, device, stage - 1, kActivationTag, &local.wait_seconds)
                .requires_grad_(true);
        stage_input[i] = x;
      }
      const double start = Now();
      torch::Tensor y = model.Blocks(x);
      if (last) {
        y = model.HeadLoss(y, targets[i]) / m;
        loss_sum += y.detach().to(torch::kDouble).cpu();
      }
      local.forward_seconds += Now() - start;
      stage_output[i] = y;
      if (!last) p2p.Send(y, stage + 1, kActivationTag);
    } else {
      torch::Tensor grad;
      if (!last) {
        grad = p2p.Recv(activation_shape, device, stage + 1, kGradientTag, &local.wait_seconds);
      }
      if (i == m - 1 && before_last_backward) before_last_backward();
      const double start = Now();
      if (last) {
        stage_output[i].backward();
      } else {
        torch::autograd::backward({stage_output[i]}, {grad});
      }
      local.backward_seconds += Now() - start;
      stage_output[i] = torch::Tensor();  // frees the micro-batch's graph
      if (!first) {
        p2p.Send(stage_input[i].grad(), stage - 1, kGradientTag);
        stage_input[i] = torch::Tensor();
      }
    }
  }
  p2p.Drain();
  // The last stage's loss, on every stage (a sum in which only it is
  // non-zero: one all-reduce instead of a broadcast from a non-zero root).
  if (!last) loss_sum.zero_();
  AllReduceInPlace(loss_sum, pipeline_group);
  if (times) *times = local;
  return loss_sum.item<double>();
}

double PipelineForwardLoss(ParallelGptImpl& model, c10d::ProcessGroup* pipeline_group,
                           const torch::Tensor& inputs, const torch::Tensor& targets) {
  torch::NoGradGuard no_grad;
  const int stages = pipeline_group ? pipeline_group->getSize() : 1;
  const int stage = pipeline_group ? pipeline_group->getRank() : 0;
  const bool first = stage == 0, last = stage == stages - 1;
  PointToPoint p2p(pipeline_group);
  torch::Tensor x = first ? model.Embed(inputs)
                          : p2p.Recv({inputs.size(0), inputs.size(1), model.config().d_model},
                                     inputs.device(), stage - 1, kActivationTag, nullptr);
  torch::Tensor y = model.Blocks(x);
  torch::Tensor loss = torch::zeros({}, torch::kDouble);
  if (last) {
    loss += model.HeadLoss(y, targets).to(torch::kDouble).cpu();
  } else {
    p2p.Send(y, stage + 1, kActivationTag);
  }
  p2p.Drain();
  AllReduceInPlace(loss, pipeline_group);
  return loss.item<double>();
}

void SumTiedEmbeddingGradients(ParallelGptImpl& model, c10d::ProcessGroup* embedding_group) {
  if (embedding_group == nullptr) return;
  // The dictionary is held: find() points into it (a temporary here was
  // read after its end, which ASan found).
  auto parameters = model.named_parameters(/*recurse=*/true);
  torch::Tensor* wte = parameters.find("wte.weight");
  TORCH_CHECK(wte != nullptr, "SumTiedEmbeddingGradients on a stage without wte");
  torch::Tensor grad = wte->mutable_grad();
  if (!grad.defined()) grad = wte->mutable_grad() = torch::zeros_like(*wte);
  AllReduceInPlace(grad, embedding_group);
}

}  // namespace loom::engine
