#include "worker/engine/replicated_engine.h"

#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "common/status_macros.h"
#include "worker/engine/autocast.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/ops/fused_adamw_torch.h"
#include "worker/engine/gpt.h"
#include "worker/engine/gradient_averager.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/parallel/sharded_checkpoint.h"

namespace loom::engine {

GptConfig ModelConfigFor(const TrainerConfig& c, const torch::Device& device) {
  GptConfig model = c.model;
  model.on_gpu = device.is_cuda();
  return model;
}

namespace {

// The model's loss on a micro-batch already on the model's device. fp16
// (CUDA only): GptImpl::Hidden opens an autocast region for bf16 only, so the
// fp16 region is opened here, around the whole forward. In effect only the
// blocks run in fp16 as with bf16: embeddings are no autocast operations,
// LayerNorm runs in fp32 under autocast, and the fused loss excludes
// autocast.
torch::Tensor ModelLoss(GptImpl& model, const torch::Tensor& x, const torch::Tensor& y) {
  std::optional<AutocastGuard> fp16;
  if (model.config().precision == Precision::kFp16 && x.is_cuda()) {
    fp16.emplace(c10::kCUDA, AutocastState{true, torch::kHalf});
  }
  return model.Loss(x, y);
}

// The replicated engine (rank_engine.h): the whole Gpt and the fused AdamW
// on every rank, on the training device; gradients all-reduced over the
// world. Checkpoints are written from the live model and optimizer.
class ReplicatedEngine : public RankEngine {
 public:
  // Builds the model; call under ModelInitMutex right after seeding.
  static absl::StatusOr<std::unique_ptr<ReplicatedEngine>> Create(const TrainerConfig& config,
                                                                  const torch::Device& device,
                                                                  Collectives* collectives) {
    std::unique_ptr<ReplicatedEngine> engine(new ReplicatedEngine(config, device, collectives));
    // Built on the CPU (the same initial weights on every device), then moved.
    engine->model_ = Gpt(ModelConfigFor(config, device));
    if (!device.is_cpu()) engine->model_->to(device);
    engine->model_->train();
    engine->parameters_ = engine->model_->parameters();
    // Gradients become views into the averager's buckets, reduced over the
    // world while backward runs.
    engine->averager_ =
        std::make_unique<GradientAverager>(engine->parameters_, collectives->group());
    // The fused AdamW step (fused_adamw_torch.h): clipping, the non-finite
    // check and the update in one pass; same groups, state and archive
    // format as MakeAdamW's torch::optim::AdamW, so checkpoints are
    // interchangeable.
    ASSIGN_OR_RETURN(
        engine->optimizer_,
        MakeFusedAdamW(*engine->model_,
                       torch::optim::AdamWOptions(config.optimizer.lr)
                           .betas(std::make_tuple(config.optimizer.beta1, config.optimizer.beta2))
                           .eps(config.optimizer.eps)
                           .weight_decay(config.optimizer.weight_decay)));
    if (collectives->rank() == 0 && !device.is_cpu() && !FusedAdamW::HasCudaKernel()) {
      std::cerr << "loom trainer: fused AdamW on " << device.str()
                << " runs as LibTorch operations: this build has no CUDA AdamW kernel (LibTorch "
                   "without CUDA, or no nvcc when it was configured)"
                << std::endl;
    }
    return engine;
  }

  int data_rank() const override { return collectives_->rank(); }
  int data_ranks() const override { return collectives_->world_size(); }

  void SynchronizeInitialWeights() override { collectives_->BroadcastFromRank0(parameters_); }

  // Each micro-batch loss is a mean over micro_batch * seq_len tokens;
  // scaling it by 1/micro_steps makes this rank's gradient the mean over its
  // rows, and averaging over ranks then gives the mean over the global batch.
  double ForwardBackward(const torch::Tensor& inputs, const torch::Tensor& targets,
                         int micro_batch, double loss_scale,
                         ForwardBackwardTimes* times) override {
    // Backward accumulates into the averager's zeroed bucket views; the
    // last micro-batch's backward launches each bucket's all-reduce as soon
    // as its gradients are complete.
    averager_->ZeroGradients();
    const int micro_steps = static_cast<int>(inputs.size(0)) / micro_batch;
    double loss_sum = 0;
    for (int m = 0; m < micro_steps; ++m) {
      const torch::Tensor x = inputs.narrow(0, m * micro_batch, micro_batch);
      const torch::Tensor y = targets.narrow(0, m * micro_batch, micro_batch);
      auto micro = std::chrono::steady_clock::now();
      torch::Tensor loss = ModelLoss(*model_, x, y);
      // Kernels run asynchronously on a GPU: wait for the forward's before
      // reading the clock, so that the split is honest (the backward's are
      // waited for by loss.item below).
      if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
      times->forward += Since(micro);
      micro = std::chrono::steady_clock::now();
      if (m == micro_steps - 1) averager_->Arm();
      ((loss_scale != 1.0 ? loss * loss_scale : loss) / micro_steps).backward();
      loss_sum += loss.item<double>();
      times->backward += Since(micro);
    }
    return loss_sum / micro_steps;
  }

  double ReduceGradients(double replica_loss) override {
    // Waits for the buckets backward launched (and launches any left): the
    // communication backward did not hide, which the trainer times as comm.
    averager_->Finish();
    return collectives_->Mean(replica_loss);
  }

  absl::StatusOr<AdamWStepResult> Step(double lr, const AdamWStepOptions& options) override {
    SetLearningRate(*optimizer_, lr);
    return optimizer_->Step(options);
  }

  // Split round-robin over ranks. Collective.
  double Evaluate(const TokenDataset& val, int64_t eval_batches, int micro) override {
    torch::NoGradGuard no_grad;
    model_->eval();
    const int64_t seq_len = config_.model.seq_len;
    std::vector<int64_t> inputs(micro * seq_len), targets(micro * seq_len);
    double loss_sum = 0, batches = 0;
    for (int64_t i = collectives_->rank(); i < eval_batches; i += collectives_->world_size()) {
      for (int row = 0; row < micro; ++row) {
        val.CopySample((i * micro + row) % val.num_samples(), &inputs[row * seq_len],
                       &targets[row * seq_len]);
      }
      torch::Tensor x = torch::from_blob(inputs.data(), {micro, seq_len}, torch::kLong);
      torch::Tensor y = torch::from_blob(targets.data(), {micro, seq_len}, torch::kLong);
      if (!device_.is_cpu()) {
        x = x.to(device_);
        y = y.to(device_);
      }
      loss_sum += ModelLoss(*model_, x, y).item<double>();
      batches += 1;
    }
    model_->train();
    const std::vector<double> totals = collectives_->Sum({loss_sum, batches});
    return totals[0] / totals[1];
  }

  bool sharded_checkpoints() const override { return false; }

  absl::StatusOr<ShardContents> CheckpointShard() override {
    return ReplicatedShardContents(*model_, *optimizer_);
  }

  absl::Status Restore(absl::string_view bytes, const CheckpointShape& shape,
                       TrainingState* state) override {
    return RestoreCheckpoint(bytes, shape, *model_, *optimizer_, state);
  }

  // A layout's sharded checkpoint, whole tensor by whole tensor.
  absl::Status RestoreFrom(const CheckpointReader& reader, const CheckpointShape& shape,
                           TrainingState* state, RestoreScope scope) override {
    return RestoreWholeModel(reader, shape, *model_, *optimizer_, state, scope);
  }

  torch::nn::Module& module() override { return *model_; }

  std::string optimizer_implementation() const override {
    return optimizer_->ImplementationFor(device_);
  }

 private:
  ReplicatedEngine(const TrainerConfig& config, const torch::Device& device,
                   Collectives* collectives)
      : config_(config), device_(device), collectives_(collectives) {}

  static double Since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  const TrainerConfig& config_;
  torch::Device device_;
  Collectives* collectives_;
  Gpt model_{nullptr};
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<GradientAverager> averager_;
  std::unique_ptr<FusedAdamW> optimizer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RankEngine>> MakeReplicatedEngine(const TrainerConfig& config,
                                                                 const torch::Device& device,
                                                                 Collectives* collectives) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReplicatedEngine> engine,
                   ReplicatedEngine::Create(config, device, collectives));
  return std::unique_ptr<RankEngine>(std::move(engine));
}

}  // namespace loom::engine
