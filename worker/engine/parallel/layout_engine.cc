#include "worker/engine/parallel/layout_engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <c10/core/AutogradState.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine/process_group_handle.h"
#include "worker/engine/gpt.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/parallel/sharded_checkpoint.h"
#include "worker/engine/parallel/parallel_gpt.h"
#include "worker/engine/parallel/pipeline.h"
#include "worker/engine/parallel/sharded_adamw.h"
#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs this thread's backward passes on this thread while it lives (when
// `on`). LibTorch's autograd engine runs CUDA work on one worker thread per
// device, shared by every graph task of the process; tensor parallelism
// calls collectives inside backward nodes, so two in-process ranks on one
// GPU (the GPU check's TP2, TrainInProcess) would wait on each other's
// collectives behind that one thread until the group's timeout. Separate
// processes are not affected. LibTorch 1.13 has no such switch (and no GPU
// build on Debian 12): there it does nothing.
class CallingThreadBackward {
 public:
  explicit CallingThreadBackward(bool on) {
#if LOOM_TORCH_AT_LEAST(2, 0)
    previous_ = c10::AutogradState::get_tls_state().get_multithreading_enabled();
    if (on) c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
#else
    (void)on;
#endif
  }
  ~CallingThreadBackward() {
#if LOOM_TORCH_AT_LEAST(2, 0)
    c10::AutogradState::get_tls_state().set_multithreading_enabled(previous_);
#endif
  }
  CallingThreadBackward(const CallingThreadBackward&) = delete;
  CallingThreadBackward& operator=(const CallingThreadBackward&) = delete;

 private:
  bool previous_ = true;
};

class LayoutEngine : public RankEngine {
 public:
  LayoutEngine(const TrainerConfig& config, const ParallelGroups& groups,
               const torch::Device& device)
      : config_(config), groups_(groups), device_(device) {
    const RankCoordinates me = groups_.coordinates;
    partition_ = PartitionFor(config_.model, groups_.layout, me, config_.stage_layers);
    // Drawn on the CPU from the seeded generator (the same draws on every
    // device), then moved before the optimizer makes the parameters views
    // of its flat buffers.
    model_ = ParallelGpt(config_.model, partition_, groups_.tensor);
    if (!device_.is_cpu()) model_->to(device_);
    model_->train();
    // With a tied LM head and several stages, the first and the last stage
    // each hold the wte shard (the embedding group joins them); an untied
    // head is the last stage's own lm_head.
    tied_across_stages_ = groups_.embedding != nullptr && config_.model.tied_embeddings;
    std::vector<ShardedParameter> parameters;
    // The last stage's copy of the tied wte is counted in the norm by the
    // first stage.
    const bool skip_wte = tied_across_stages_ && partition_.head;
    for (const auto& item : model_->named_parameters()) {
      // Both pipeline ends' wte copies are summed after backward
      // (SumTiedEmbeddingGradients), so it is reduced after that.
      const bool tied_wte = tied_across_stages_ && item.key() == "wte.weight";
      parameters.push_back({item.key(), item.value(), item.value().dim() >= 2,
                            !(skip_wte && item.key() == "wte.weight"), tied_wte,
                            ReplicatedSpanOf(item.key(), config_.model, partition_.tp_size)});
    }
    // The largest element count in this rank's tensor group: only the
    // vocabulary rows of wte (and lm_head) differ between its ranks.
    int64_t elements = 0, vocab_split = 0;
    for (const ShardedParameter& p : parameters) {
      elements += p.tensor.numel();
      if (TensorParallelSplitOf(p.name) == TensorParallelSplit::kVocabRows) ++vocab_split;
    }
    if (vocab_split > 0) {
      int64_t most_rows = 0;
      for (int r = 0; r < partition_.tp_size; ++r) {
        const VocabRange range = VocabRangeOf(config_.model.vocab_size, r, partition_.tp_size);
        most_rows = std::max(most_rows, range.end - range.begin);
      }
      const VocabRange mine =
          VocabRangeOf(config_.model.vocab_size, partition_.tp_rank, partition_.tp_size);
      elements += vocab_split * (most_rows - (mine.end - mine.begin)) * config_.model.d_model;
    }
    optimizer_ = std::make_unique<ShardedAdamW>(
        std::move(parameters), config_.optimizer, config_.zero_stage, groups_.data.get(),
        groups_.tensor.get(), groups_.pipeline.get(), ReduceScatterAlgorithm::kAuto, elements);
  }

  int data_rank() const override { return groups_.coordinates.dp; }
  int data_ranks() const override { return groups_.layout.data; }

  void SynchronizeInitialWeights() override {
    if (!groups_.data) return;
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> parts;
    for (const torch::Tensor& p : model_->parameters()) parts.push_back(p.reshape({-1}));
    torch::Tensor flat = torch::cat(parts);
    BroadcastInPlace(flat, groups_.data.get(), 0);
    int64_t offset = 0;
    for (torch::Tensor p : model_->parameters()) {
      p.view({-1}).copy_(flat.narrow(0, offset, p.numel()));
      offset += p.numel();
    }
  }

  double ForwardBackward(const torch::Tensor& inputs, const torch::Tensor& targets,
                         int micro_batch, double loss_scale,
                         ForwardBackwardTimes* times) override {
    TORCH_CHECK(loss_scale == 1.0, "loss scaling is not executed under parallel layouts");
    const CallingThreadBackward on_this_thread(device_.is_cuda());
    const int micro_steps = static_cast<int>(inputs.size(0)) / micro_batch;
    if (groups_.layout.pipeline > 1) {
      std::vector<torch::Tensor> xs, ys;
      for (int m = 0; m < micro_steps; ++m) {
        xs.push_back(inputs.narrow(0, m * micro_batch, micro_batch));
        ys.push_back(targets.narrow(0, m * micro_batch, micro_batch));
      }
      PipelineTimes pipeline;
      const double loss = RunOneFOneB(*model_, groups_.pipeline.get(), xs, ys, &pipeline,
                                      [this] { optimizer_->BeginLastBackward(); });
      if (tied_across_stages_) SumTiedEmbeddingGradients(*model_, groups_.embedding.get());
      times->forward += pipeline.forward_seconds;
      times->backward += pipeline.backward_seconds;
      times->pipeline_wait += pipeline.wait_seconds;
      return loss;
    }
    double loss_sum = 0;
    for (int m = 0; m < micro_steps; ++m) {
      double start = Now();
      torch::Tensor loss = model_->Loss(inputs.narrow(0, m * micro_batch, micro_batch),
                                        targets.narrow(0, m * micro_batch, micro_batch));
      times->forward += Now() - start;
      start = Now();
      // ZeRO-0: the last backward all-reduces the gradients as they are ready.
      if (m == micro_steps - 1) optimizer_->BeginLastBackward();
      (loss / micro_steps).backward();
      loss_sum += loss.item<double>();
      times->backward += Now() - start;
    }
    return loss_sum / micro_steps;
  }

  double ReduceGradients(double replica_loss) override {
    // ZeRO-0 and 2: what backward did not hide (and the tied wte, reduced
    // last).
    optimizer_->FinishGradientReduction();
    torch::Tensor loss = torch::tensor({replica_loss}, torch::kDouble);
    AllReduceInPlace(loss, groups_.data.get());
    return loss.item<double>() / groups_.layout.data;
  }

  absl::StatusOr<AdamWStepResult> Step(double lr, const AdamWStepOptions& options) override {
    if (options.inv_scale != 1.0) {
      return absl::UnimplementedError("loss scaling is not executed under parallel layouts");
    }
    const ShardedStepResult stepped = optimizer_->Step(lr, options.max_grad_norm);
    // The two copies of the tied wte took the same update, but their data-
    // parallel sums ran in different orders (different buffer layouts on the
    // two stages), so the last stage takes the first's values again: they
    // stay bit-identical, as checkpoints (which store the first's) assume.
    // Costs one broadcast of the wte shard a step.
    if (stepped.applied && tied_across_stages_) {
      torch::Tensor wte = *model_->named_parameters(/*recurse=*/true).find("wte.weight");
      BroadcastInPlace(wte, groups_.embedding.get(), 0);
    }
    AdamWStepResult result;
    result.applied = stepped.applied;
    result.grad_norm = stepped.grad_norm;
    result.clip_coef = !stepped.applied ? 0.0
                       : options.max_grad_norm > 0 && stepped.grad_norm > options.max_grad_norm
                           ? options.max_grad_norm / (stepped.grad_norm + 1e-6)
                           : 1.0;
    return result;
  }

  double Evaluate(const TokenDataset& val, int64_t eval_batches, int micro) override {
    torch::NoGradGuard no_grad;
    model_->eval();
    const int64_t seq_len = config_.model.seq_len;
    torch::Tensor x = torch::empty({micro, seq_len}, torch::kLong);
    torch::Tensor y = torch::empty({micro, seq_len}, torch::kLong);
    torch::Tensor totals = torch::zeros({2}, torch::kDouble);  // loss sum, batches
    for (int64_t i = data_rank(); i < eval_batches; i += data_ranks()) {
      for (int row = 0; row < micro; ++row) {
        val.CopySample((i * micro + row) % val.num_samples(), x.data_ptr<int64_t>() + row * seq_len,
                       y.data_ptr<int64_t>() + row * seq_len);
      }
      // Filled on the host, run where the model is.
      const torch::Tensor xd = x.to(device_), yd = y.to(device_);
      const double loss = groups_.layout.pipeline > 1
                              ? PipelineForwardLoss(*model_, groups_.pipeline.get(), xd, yd)
                              : model_->Loss(xd, yd).item<double>();
      totals[0] += loss;
      totals[1] += 1;
    }
    model_->train();
    AllReduceInPlace(totals, groups_.data.get());
    return totals[0].item<double>() / totals[1].item<double>();
  }

  // Every rank writes its own pieces (sharded_checkpoint.h).
  bool sharded_checkpoints() const override { return true; }

  absl::StatusOr<ShardContents> CheckpointShard() override {
    return LayoutShardContents(*optimizer_, groups_, config_.optimizer);
  }

  CheckpointManifest CheckpointLayout() const override {
    return ShardedLayoutOf(groups_, config_.zero_stage);
  }

  // Layouts read every checkpoint piecewise (RestoreFrom).
  absl::Status Restore(absl::string_view, const CheckpointShape&, TrainingState*) override {
    return absl::FailedPreconditionError(
        "a parallel layout restores from the checkpoint directory, not from bytes");
  }

  absl::Status RestoreFrom(const CheckpointReader& reader, const CheckpointShape& shape,
                           TrainingState* state, RestoreScope scope) override {
    return RestoreLayoutRank(reader, shape, *model_, *optimizer_, state, scope);
  }

  torch::nn::Module& module() override { return *model_; }

  std::string optimizer_implementation() const override {
    return absl::StrCat(optimizer_->update_implementation(), ", ZeRO-", config_.zero_stage,
                        " over ", groups_.layout.data, " replica(s)");
  }

 private:
  TrainerConfig config_;
  const ParallelGroups& groups_;
  torch::Device device_;
  GptPartition partition_;
  bool tied_across_stages_ = false;
  ParallelGpt model_{nullptr};
  std::unique_ptr<ShardedAdamW> optimizer_;
};

}  // namespace

absl::Status ValidateLayoutConfig(const TrainerConfig& c, const ParallelLayout& layout) {
  auto invalid = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  RETURN_IF_ERROR(ValidateTensorParallel(c.model, layout.tensor));
  if (layout.pipeline > c.model.n_layer) {
    return invalid("parallelism.pipeline (", layout.pipeline, ") exceeds model.n_layer (",
                   c.model.n_layer, "): every stage needs at least one block");
  }
  if (c.zero_stage < 0 || c.zero_stage > 2) {
    return invalid("parallelism.zero_stage must be 0, 1 or 2 (ZeRO-3 is not executed yet), got ",
                   c.zero_stage);
  }
  if (c.micro_batch < 1 || c.global_batch < 1 ||
      c.global_batch % (layout.data * c.micro_batch) != 0) {
    return invalid("global_batch (", c.global_batch,
                   ") must be a positive multiple of parallelism.data * micro_batch (",
                   layout.data, " * ", c.micro_batch, ")");
  }
  if (c.model.precision == Precision::kFp16) {
    return invalid("precision: fp16 is not executed under tensor, pipeline or ZeRO layouts yet");
  }
  if (c.device != "cpu" && c.device != "cuda" && !absl::StartsWith(c.device, "cuda:")) {
    return invalid("device: tensor, pipeline and ZeRO layouts run on cpu or cuda[:N] ranks (",
                   c.device, " asked for)");
  }
  return absl::OkStatus();
}

std::unique_ptr<RankEngine> MakeLayoutEngine(const TrainerConfig& config,
                                             const ParallelGroups& groups,
                                             const torch::Device& device) {
  return std::make_unique<LayoutEngine>(config, groups, device);
}

}  // namespace loom::engine
