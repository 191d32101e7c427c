// The training loop reads top to bottom in TrainOrThrow(); everything it
// calls sits above it: collectives, configuration, validation, resume.
// Checkpoint formats and writing live in checkpoint.h / checkpoint_writer.h.
#include "worker/engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/engine/autocast.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/checkpoint_writer.h"
#include "worker/engine/collectives.h"
#include "worker/engine/data.h"
#include "worker/engine/device_memory.h"
#include "worker/engine/fused_adamw_torch.h"
#include "worker/engine/gpt.h"
#include "worker/engine/loss_scaler.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/parallel/layout_engine.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/parallel/sharded_checkpoint.h"
#include "worker/engine/checkpoint_coordinator.h"
#include "worker/engine/rank_engine.h"

namespace loom::engine {
namespace {

// ---------------------------------------------------------------------------
// Configuration, data, seeds, validation.

// TrainerConfig::device: "cpu", "cuda" (= cuda:0) or "cuda:N" of a GPU this
// LibTorch can use.
absl::StatusOr<torch::Device> ParseDevice(const std::string& text) {
  auto invalid = [&](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("device: \"", text, "\" ", parts...));
  };
  std::optional<torch::Device> parsed;
  try {
    parsed.emplace(text);
  } catch (const c10::Error&) {
    return invalid("is not a device: use \"cpu\", \"cuda\" or \"cuda:N\"");
  }
  torch::Device device = *parsed;
  if (device.is_cpu()) return torch::Device(torch::kCPU);
  if (!device.is_cuda()) return invalid("is not supported: the engine trains on cpu or cuda");
  if (!torch::cuda::is_available()) {
    return invalid(
        "needs CUDA, but this LibTorch has no CUDA support or sees no GPU "
        "(torch::cuda::is_available() is false); use \"cpu\"");
  }
  const int64_t index = device.has_index() ? device.index() : 0;
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  if (index >= visible) return invalid("is not visible: ", visible, " GPU(s) are");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// The model configuration as this rank runs it: on_gpu from the device.
GptConfig ModelConfigFor(const TrainerConfig& c, const torch::Device& device) {
  GptConfig model = c.model;
  model.on_gpu = device.is_cuda();
  return model;
}

// `replicas`: data-parallel replicas sharing each global batch (the world
// size for the replicated engine).
absl::Status ValidateTrainerConfig(const TrainerConfig& c, int replicas) {
  ASSIGN_OR_RETURN(const torch::Device device, ParseDevice(c.device));
  RETURN_IF_ERROR(ValidateGptConfig(ModelConfigFor(c, device)));
  auto invalid = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  const OptimizerConfig& o = c.optimizer;
  if (!(o.lr > 0)) return invalid("optimizer.lr must be > 0, got ", o.lr);
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return invalid("optimizer.beta1 must be in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return invalid("optimizer.beta2 must be in [0, 1)");
  if (!(o.eps >= 0)) return invalid("optimizer.eps must be >= 0");
  if (!(o.weight_decay >= 0)) return invalid("optimizer.weight_decay must be >= 0");
  if (!(o.grad_clip >= 0)) return invalid("optimizer.grad_clip must be >= 0 (0 disables)");
  const ScheduleConfig& s = c.schedule;
  if (s.total_steps < 1) return invalid("schedule.total_steps must be >= 1");
  if (s.warmup_steps < 0) return invalid("schedule.warmup_steps must be >= 0");
  if (!(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1)) {
    return invalid("schedule.min_lr_ratio must be in [0, 1]");
  }
  if (c.micro_batch < 1) return invalid("micro_batch must be >= 1");
  if (c.global_batch < 1 || c.global_batch % (replicas * c.micro_batch) != 0) {
    return invalid("global_batch (", c.global_batch,
                   ") must be a positive multiple of world_size * micro_batch (", replicas,
                   " * ", c.micro_batch, ")");
  }
  if (c.eval_interval < 0) return invalid("eval_interval must be >= 0");
  if (c.eval_batches < 0) return invalid("eval_batches must be >= 0");
  if (c.log_interval < 1) return invalid("log_interval must be >= 1");
  if (c.checkpoint_interval < 0) return invalid("checkpoint_interval must be >= 0");
  if (c.prefetch_depth < 0) return invalid("prefetch_depth must be >= 0 (0 = no prefetching)");
  if (c.retain_distance_steps < 0) return invalid("retain_distance_steps must be >= 0");
  if (c.resume_step < -1) return invalid("resume_step must be >= -1, got ", c.resume_step);
  if (c.generation < 0) return invalid("generation must be >= 0, got ", c.generation);
  // The data cursor, end * global_batch samples, must fit an int64.
  const int64_t max_end = std::numeric_limits<int64_t>::max() / c.global_batch;
  for (size_t i = 0; i < c.skip_batches.size(); ++i) {
    const BatchRange& r = c.skip_batches[i];
    if (r.begin < 0 || r.begin >= r.end || r.end > max_end) {
      return invalid("skip_batches[", i, "] = [", r.begin, ", ", r.end,
                     ") must satisfy 0 <= begin < end <= ", max_end);
    }
  }
  if (c.train_shards.empty()) return invalid("train_shards must not be empty");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Skip lists.

// Sorted union of `a` and `b`, overlapping and adjacent ranges merged.
std::vector<BatchRange> UnionOfRanges(std::vector<BatchRange> a, const std::vector<BatchRange>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end(), [](const BatchRange& x, const BatchRange& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  std::vector<BatchRange> out;
  for (const BatchRange& r : a) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

// The first data batch index >= `batch` outside every range of `skip`
// (sorted, disjoint).
int64_t SkipForward(const std::vector<BatchRange>& skip, int64_t batch) {
  for (const BatchRange& r : skip) {
    if (batch >= r.begin && batch < r.end) batch = r.end;
  }
  return batch;
}

absl::StatusOr<TokenDataset> LoadDataset(const std::vector<std::string>& patterns,
                                         const GptConfig& model, absl::string_view field) {
  ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandShardPatterns(patterns));
  ASSIGN_OR_RETURN(TokenDataset dataset, TokenDataset::Load(paths, model.seq_len));
  if (dataset.max_token() >= model.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(field, " hold token ", dataset.max_token(),
                                                   ", outside model.vocab_size ",
                                                   model.vocab_size));
  }
  return dataset;
}

// Serialises seeding + construction of the model across the ranks of one
// process: they share the global generator, and interleaved draws would
// give each a different (and irreproducible) initialisation.
std::mutex& ModelInitMutex() {
  static std::mutex mutex;
  return mutex;
}

// SplitMix64 finaliser (Steele, Lea, Flood 2014): decorrelates nearby seeds.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Dropout seed for (seed, rank, step): a pure function, so that a resumed
// run draws the same masks as an uninterrupted one on every rank, although
// the checkpoint holds only rank 0's generator state.
uint64_t DropoutSeed(uint64_t seed, int rank, int64_t step) {
  return Mix(seed ^ Mix((static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(step)));
}

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
    // Gradients are set to none rather than zero-filled: the first
    // micro-batch's backward writes them, later ones accumulate.
    for (const torch::Tensor& p : parameters_) {
      torch::Tensor p_mutable = p;
      p_mutable.mutable_grad() = torch::Tensor();
    }
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
      ((loss_scale != 1.0 ? loss * loss_scale : loss) / micro_steps).backward();
      loss_sum += loss.item<double>();
      times->backward += Since(micro);
    }
    return loss_sum / micro_steps;
  }

  double ReduceGradients(double replica_loss) override {
    collectives_->AverageGradients(parameters_);
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
                           TrainingState* state) override {
    return RestoreWholeModel(reader, shape, *model_, *optimizer_, state);
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
  std::unique_ptr<FusedAdamW> optimizer_;
};

// ---------------------------------------------------------------------------
// Resume.

// Rank 0's choice of where to resume (see TrainerConfig::resume_step).
struct ResumePlan {
  std::optional<VerifiedCheckpoint> checkpoint;  // none = from scratch
  // Checkpoints newer than resume_step were passed over: the run is a new
  // branch, of generation >= fork_generation (1 + the highest in the dir).
  bool fork = false;
  int64_t fork_generation = 0;
};

// Rank 0 only. Removes what interrupted saves left, reads the manifest of
// every checkpoint, and verifies checkpoints in lineage order until one
// qualifies and verifies; the others it tried go to `skipped`.
// FAILED_PRECONDITION if resume_step > 0 and none qualifies.
absl::StatusOr<ResumePlan> PlanResume(const TrainerConfig& config,
                                      std::vector<std::string>* skipped) {
  RemoveTemporaries(config.checkpoint_dir);
  const std::vector<CheckpointEntry> files = ListCheckpoints(config.checkpoint_dir);
  ResumePlan plan;
  for (const CheckpointEntry& file : files) {
    plan.fork_generation = std::max(plan.fork_generation, file.generation + 1);
  }
  if (config.resume_step == 0) {
    plan.fork = !files.empty();
    return plan;
  }
  std::vector<std::string> found;  // for the error message
  for (const CheckpointEntry& file : files) {
    if (config.resume_step > 0 && file.step > config.resume_step) {
      plan.fork = true;
      found.push_back(absl::StrCat(file.path, " (generation ", file.generation,
                                   ", after step ", config.resume_step, ")"));
      continue;
    }
    absl::StatusOr<VerifiedCheckpoint> verified = VerifyCheckpoint(file);
    if (verified.ok()) {
      plan.checkpoint = *std::move(verified);
      return plan;
    }
    skipped->push_back(file.path);
    found.push_back(absl::StrCat(file.path, " (", verified.status().ToString(), ")"));
  }
  if (config.resume_step > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume_step ", config.resume_step, ": no checkpoint at or before that step verifies in ",
        config.checkpoint_dir, "; found ",
        found.empty() ? std::string("none") : absl::StrJoin(found, ", ")));
  }
  plan.fork = false;  // resume_step -1 over only bad checkpoints: as before
  return plan;
}

// Where one optimizer step's time went, in seconds (StepReport).
struct StepSplit {
  double data_wait = 0;
  double host_to_device = 0;
  double forward = 0;
  double backward = 0;
  double compute = 0;  // forward + backward (+ pipeline_wait)
  double pipeline_wait = 0;
  double comm = 0;
  double optimizer = 0;
  double checkpoint_stall = 0;
};

// ---------------------------------------------------------------------------
// The loop. May throw c10::Error; Train() catches.
// `layout` is null for the replicated engine (process_group is the world);
// otherwise the layout engine runs over its groups (process_group is
// layout->world).
absl::StatusOr<TrainResult> TrainOrThrow(const TrainerConfig& config,
                                         std::shared_ptr<c10d::ProcessGroup> process_group,
                                         const ParallelGroups* layout,
                                         const TrainerCallbacks& callbacks) {
  const int world_size = process_group ? process_group->getSize() : 1;
  RETURN_IF_ERROR(
      ValidateTrainerConfig(config, layout ? layout->layout.data : world_size));
  if (layout) RETURN_IF_ERROR(ValidateLayoutConfig(config, layout->layout));
  ASSIGN_OR_RETURN(const torch::Device device, ParseDevice(config.device));
  // On a GPU it is this thread's current device for the whole run (kernel
  // launches, the CUDA AdamW kernel's stream, NCCL).
  std::optional<c10::DeviceGuard> device_guard;
  if (!device.is_cpu()) device_guard.emplace(device);
  Collectives collectives(std::move(process_group), device);
  const int rank = collectives.rank();

  ASSIGN_OR_RETURN(TokenDataset train, LoadDataset(config.train_shards, config.model,
                                                   "train_shards"));
  std::optional<TokenDataset> val;
  if (!config.val_shards.empty() && config.eval_batches > 0) {
    ASSIGN_OR_RETURN(TokenDataset loaded, LoadDataset(config.val_shards, config.model,
                                                      "val_shards"));
    val.emplace(std::move(loaded));
  }

  // Model and optimizer (rank_engine.h): identical on every replica by
  // seeding, and made so by broadcast.
  std::unique_ptr<RankEngine> engine;
  {
    std::lock_guard<std::mutex> lock(ModelInitMutex());
    torch::manual_seed(config.seed);
    if (layout) {
      engine = MakeLayoutEngine(config, *layout);
    } else {
      ASSIGN_OR_RETURN(engine, ReplicatedEngine::Create(config, device, &collectives));
    }
  }
  engine->SynchronizeInitialWeights();
  const CheckpointShape shape{ModelFingerprint(config.model), config.global_batch, world_size};

  // Checkpoints (checkpoint_coordinator.h): rank 0 alone, or every rank of
  // a layout, saves; outcomes are heard at later step boundaries. Declared
  // after the engine so that it is destroyed first: its writer waits for a
  // save in flight, which may still be copying the engine's tensors.
  TrainResult result;
  result.optimizer_implementation = engine->optimizer_implementation();
  CheckpointCoordinator checkpoints(config, shape, engine.get(), &collectives, callbacks, &result);

  // Resume: rank 0 picks and verifies the checkpoint
  // (TrainerConfig::resume_step) and tells every rank. A replicated
  // checkpoint resumed by the replicated engine travels as bytes (every rank
  // restores the same bytes); any other is read by every rank from the
  // shared directory, piecewise (parallel/sharded_checkpoint.h).
  TrainingState state;
  bool restored = false;
  bool fork = false;
  int64_t fork_generation = 0;
  if (!config.checkpoint_dir.empty()) {
    absl::StatusOr<ResumePlan> plan = ResumePlan{};
    if (rank == 0) plan = PlanResume(config, &result.skipped_checkpoints);
    enum Source : int64_t { kNone = 0, kBytes = 1, kDirectory = 2 };
    int64_t source = kNone;
    if (plan.ok() && plan->checkpoint.has_value()) {
      source = !engine->sharded_checkpoints() &&
                       plan->checkpoint->manifest.layout != kShardedLayout
                   ? kBytes
                   : kDirectory;
    }
    const std::vector<int64_t> decision = collectives.BroadcastInts(
        {plan.ok() ? 1 : 0, plan.ok() && plan->fork ? 1 : 0,
         plan.ok() ? plan->fork_generation : 0, source});
    if (decision[0] == 0) {
      if (!plan.ok()) return plan.status();
      return absl::FailedPreconditionError(
          "rank 0 found no checkpoint to resume from (its error says why)");
    }
    fork = decision[1] != 0;
    fork_generation = decision[2];
    source = decision[3];
    if (source != kNone) {
      // Sent before taking the lock: in-process ranks take it in turn.
      const std::string sent = collectives.BroadcastBytes(
          rank != 0                ? std::string()
          : source == kBytes       ? std::move(plan->checkpoint->bytes)
                                   : plan->checkpoint->path);
      absl::Status restoring;
      {
        // Restoring sets the global generator, which in-process ranks share.
        std::lock_guard<std::mutex> lock(ModelInitMutex());
        if (source == kBytes) {
          restoring = engine->Restore(sent, shape, &state);
        } else {
          absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(sent, config.model);
          restoring = reader.ok() ? engine->RestoreFrom(*reader, shape, &state) : reader.status();
        }
      }
      // Every rank goes on only if every rank restored.
      const int64_t failed = collectives.Max({restoring.ok() ? 0 : rank + 1})[0];
      if (!restoring.ok()) return restoring;
      if (failed != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", failed - 1, " could not restore the checkpoint (its error says why)"));
      }
      result.resumed_from_step = state.step;
      restored = true;
    }
  }
  // The branch this call continues or starts (TrainerConfig, "Forks").
  const TrainingState resumed = state;
  state.generation = std::max(state.generation, config.generation);
  if (fork) state.generation = std::max(state.generation, fork_generation);
  state.skip_batches = UnionOfRanges(state.skip_batches, config.skip_batches);
  if (!restored) {
    state.lineage = {{state.generation, 0}};
  } else if (state.generation != resumed.generation) {
    state.lineage.emplace_back(state.generation, state.step);
  }
  result.generation = state.generation;
  result.skip_batches = state.skip_batches;
  const bool stamp = restored ? state.generation != resumed.generation ||
                                    state.skip_batches != resumed.skip_batches
                              : fork;
  if (stamp) {
    checkpoints.Save(state, /*wait=*/true);
    RETURN_IF_ERROR(checkpoints.Finish());
  }

  // Each rank holds global_batch / world_size rows per step and walks them in
  // micro-batches. Buffers live for the whole run.
  const int64_t seq_len = config.model.seq_len;
  const int rows_per_rank = config.global_batch / engine->data_ranks();
  const int64_t tokens_per_step = int64_t{config.global_batch} * seq_len;
  // On a GPU they are pinned (page-locked), so that the copy to the device
  // is one DMA transfer instead of a staged one.
  torch::Tensor batch_inputs = torch::empty({rows_per_rank, seq_len}, torch::kLong);
  torch::Tensor batch_targets = torch::empty({rows_per_rank, seq_len}, torch::kLong);
  if (device.is_cuda()) {
    batch_inputs = batch_inputs.pin_memory();
    batch_targets = batch_targets.pin_memory();
  }
  int64_t* const inputs = batch_inputs.data_ptr<int64_t>();
  int64_t* const targets = batch_targets.data_ptr<int64_t>();
  const int64_t total_steps = config.schedule.total_steps;
  double pending_stall = 0;        // seconds; see the loop
  // The loader: a background thread keeps the next prefetch_depth batches of
  // this rank ready, in the order the skip list gives. From here on it is
  // the only user of `train`.
  std::unique_ptr<BatchPrefetcher> prefetcher;
  if (config.prefetch_depth > 0) {
    BatchPrefetcher::Options loader;
    loader.seed = config.seed;
    loader.global_batch = config.global_batch;
    loader.rank = engine->data_rank();
    loader.world_size = engine->data_ranks();
    loader.depth = config.prefetch_depth;
    prefetcher = std::make_unique<BatchPrefetcher>(
        &train, loader,
        [skip = state.skip_batches](int64_t b) { return SkipForward(skip, b + 1); });
  }
  int64_t nonfinite_skipped = 0;   // optimizer steps skipped for inf/NaN
  // fp16 dynamic loss scaling (loss_scaler.h): the loss is scaled before
  // backward and the gradients unscaled inside the optimizer step. Only for
  // fp16, which ValidateGptConfig allows on a GPU only.
  std::optional<DynamicLossScaler> scaler;
  if (config.model.precision == Precision::kFp16) {
    scaler.emplace();
    // A resumed fp16 run continues with the scale it had (a checkpoint from
    // a bf16/fp32 run, or an older one, has none: start afresh).
    if (restored && state.loss_scale > 0) {
      const absl::Status s = scaler->Restore(state.loss_scale, state.loss_scale_clean_steps,
                                             state.loss_scale_overflow_steps);
      if (!s.ok()) {
        return absl::DataLossError(absl::StrCat("checkpoint at step ", state.step,
                                                " holds a bad loss scaler state: ", s.message()));
      }
    }
  }

  // A fresh run measures the untrained model on the validation set first, so
  // that "how far did validation loss fall" has a starting point. It is
  // reported as step 0 (loss = that validation loss; no optimizer step yet).
  if (state.step == 0 && val.has_value()) {
    const double initial = engine->Evaluate(*val, config.eval_batches, config.micro_batch);
    if (rank == 0 && callbacks.on_step) {
      StepReport report;
      report.step = 0;
      report.loss = initial;
      report.lr = LearningRateAt(config.schedule, config.optimizer.lr, 0);
      report.has_val_loss = true;
      report.val_loss = initial;
      report.data_batch = -1;
      report.batches_skipped_total = state.next_data_batch - state.step;
      callbacks.on_step(report);
    }
  }

  while (state.step < total_steps) {
    // Step boundary: a stop request from any rank, or a failed save on rank
    // 0, ends every rank here. A save in flight at a stop is finished and
    // reported first: it is a valid checkpoint.
    const bool stop = callbacks.should_stop && callbacks.should_stop();
    RETURN_IF_ERROR(checkpoints.AtStepBoundary(stop, state.step + 1));
    const auto start = std::chrono::steady_clock::now();
    auto since = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    };
    // The capture of the checkpoint saved after the previous step blocked
    // training outside this step's timer; it is charged to this step.
    StepSplit split;
    const double carried_stall = pending_stall;
    split.checkpoint_stall = carried_stall;
    pending_stall = 0;
    if (config.model.dropout > 0) torch::manual_seed(DropoutSeed(config.seed, rank, state.step));

    // This step trains on the next data batch outside the skip list.
    const int64_t data_batch = SkipForward(state.skip_batches, state.next_data_batch);
    // Forward/backward over this rank's share of the global batch. Each
    // micro-batch loss is a mean over micro_batch * seq_len tokens; scaling
    // it by 1/micro_steps makes this rank's gradient the mean over its rows,
    // and averaging over ranks then gives the mean over the global batch.
    auto phase = std::chrono::steady_clock::now();
    if (prefetcher) {
      prefetcher->Take(data_batch, inputs, targets);
    } else {
      train.FillRankBatch(config.seed, data_batch * config.global_batch, config.global_batch,
                          engine->data_rank(), engine->data_ranks(), inputs, targets);
    }
    split.data_wait = since(phase);
    phase = std::chrono::steady_clock::now();
    // On a GPU the batch is copied there here (host_to_device; 0 on CPU).
    // The copy is synchronous, so the host buffers may be refilled next
    // step.
    torch::Tensor step_inputs = batch_inputs, step_targets = batch_targets;
    if (!device.is_cpu()) {
      step_inputs = batch_inputs.to(device);
      step_targets = batch_targets.to(device);
      split.host_to_device = since(phase);
    }
    phase = std::chrono::steady_clock::now();
    ForwardBackwardTimes passes;
    const double replica_loss =
        engine->ForwardBackward(step_inputs, step_targets, config.micro_batch,
                                scaler ? scaler->scale() : 1.0, &passes);
    split.forward = passes.forward;
    split.backward = passes.backward;
    split.pipeline_wait = passes.pipeline_wait;
    split.compute = since(phase);
    phase = std::chrono::steady_clock::now();
    const double loss = engine->ReduceGradients(replica_loss);
    split.comm = since(phase);
    const double lr = LearningRateAt(config.schedule, config.optimizer.lr, state.step);
    // Snapshot fence: a save started after the previous step may still be
    // copying parameters and optimizer state, which the step below
    // overwrites. Everything above only reads them.
    split.checkpoint_stall += checkpoints.WaitForSnapshot();
    phase = std::chrono::steady_clock::now();
    // Clipping (torch.nn.utils.clip_grad_norm_'s factor) inside the fused
    // pass. A step whose gradients hold inf or NaN is skipped: no parameter
    // or moment changes; the data batch is consumed and the schedule moves
    // on, and the loss reported for it is whatever non-finite value the
    // ranks saw, for the controller's detector.
    AdamWStepOptions step_options;
    step_options.max_grad_norm = config.optimizer.grad_clip;
    const double loss_scale = scaler ? scaler->scale() : 1.0;
    step_options.inv_scale = 1.0 / loss_scale;
    ASSIGN_OR_RETURN(const AdamWStepResult stepped, engine->Step(lr, step_options));
    split.optimizer = since(phase);
    if (!stepped.applied) nonfinite_skipped += 1;
    if (scaler) {
      scaler->Update(stepped.applied);
      state.loss_scale = scaler->scale();
      state.loss_scale_clean_steps = scaler->clean_steps();
      state.loss_scale_overflow_steps = scaler->overflow_steps();
    }
    const double grad_norm = stepped.grad_norm;
    state.step += 1;
    state.next_data_batch = data_batch + 1;
    state.loss = loss;
    const double step_seconds = since(start) + carried_stall;

    const bool last = state.step == total_steps;
    const bool validate =
        val.has_value() &&
        (last || (config.eval_interval > 0 && state.step % config.eval_interval == 0));
    if (validate) {
      state.val_loss = engine->Evaluate(*val, config.eval_batches, config.micro_batch);
      state.has_val_loss = true;
    }
    if (rank == 0 && callbacks.on_step &&
        (last || validate || state.step % config.log_interval == 0)) {
      StepReport report;
      report.step = state.step;
      report.loss = loss;
      report.lr = lr;
      report.grad_norm = grad_norm;
      report.step_time_seconds = step_seconds;
      report.tokens_per_second = step_seconds > 0 ? tokens_per_step / step_seconds : 0;
      report.tokens_seen = state.step * tokens_per_step;
      report.has_val_loss = validate;
      report.val_loss = validate ? state.val_loss : 0;
      report.data_batch = data_batch;
      report.batches_skipped_total = state.next_data_batch - state.step;
      report.data_wait_seconds = split.data_wait;
      report.compute_seconds = split.compute;
      report.host_to_device_seconds = split.host_to_device;
      if (device.is_cuda()) {
        if (std::optional<DeviceMemory> m = CudaAllocatorMemory(device.index())) {
          report.device_memory_allocated_bytes = m->allocated_bytes;
          report.device_memory_reserved_bytes = m->reserved_bytes;
          report.device_memory_peak_bytes = m->peak_allocated_bytes;
        }
      }
      report.forward_seconds = split.forward;
      report.backward_seconds = split.backward;
      report.pipeline_wait_seconds = split.pipeline_wait;
      report.comm_seconds = split.comm;
      report.optimizer_seconds = split.optimizer;
      report.checkpoint_stall_seconds = split.checkpoint_stall;
      report.step_applied = stepped.applied;
      report.nonfinite_steps_skipped = nonfinite_skipped;
      report.loss_scale = loss_scale;
      callbacks.on_step(report);
    }

    const bool checkpoint =
        !config.checkpoint_dir.empty() &&
        (last || (config.checkpoint_interval > 0 && state.step % config.checkpoint_interval == 0));
    if (checkpoint) {
      const auto save_start = std::chrono::steady_clock::now();
      checkpoints.Save(state, /*wait=*/last || !config.checkpoint_async);
      pending_stall = since(save_start);
    }
  }

  // The final checkpoint has committed (or failed) by now; every rank hears.
  RETURN_IF_ERROR(checkpoints.Finish());
  if (callbacks.on_finish) callbacks.on_finish(engine->module());
  result.steps = state.step;
  result.final_loss = state.loss;
  result.final_val_loss = state.has_val_loss ? state.val_loss : 0;
  return result;
}

}  // namespace


absl::StatusOr<TrainResult> Train(const TrainerConfig& config,
                                  std::shared_ptr<c10d::ProcessGroup> process_group,
                                  const TrainerCallbacks& callbacks) {
  try {
    if (UsesParallelLayout(config)) {
      return absl::InvalidArgumentError(
          "tensor_parallel / pipeline_parallel / zero_stage ask for a parallel layout: train it "
          "with TrainWithGroups over CreateParallelGroups' groups");
    }
    return TrainOrThrow(config, std::move(process_group), nullptr, callbacks);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("training failed: ", e.what()));
  }
}

absl::StatusOr<TrainResult> TrainWithGroups(const TrainerConfig& config,
                                            const ParallelGroups& groups,
                                            const TrainerCallbacks& callbacks) {
  if (groups.layout.tensor != config.tensor_parallel ||
      groups.layout.pipeline != config.pipeline_parallel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the process groups are for ", LayoutName(groups.layout), " but the config asks for tp",
        config.tensor_parallel, " x pp", config.pipeline_parallel));
  }
  try {
    return TrainOrThrow(config, groups.world, &groups, callbacks);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("training failed: ", e.what()));
  }
}

// Both are the world group of a one-dimensional data-parallel layout
// (parallel/process_groups.h builds the store and the backend).
absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> CreateGlooProcessGroup(
    const GlooGroupOptions& options) {
  ASSIGN_OR_RETURN(ParallelGroups groups,
                   CreateParallelGroups(options, "cpu", ParallelLayout{options.world_size, 1, 1}));
  return groups.world;
}

absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> CreateProcessGroup(
    const GlooGroupOptions& options, const std::string& device) {
  ASSIGN_OR_RETURN(const torch::Device parsed, ParseDevice(device));
  (void)parsed;  // NCCL for CUDA when LibTorch has it, else Gloo (staged)
  ASSIGN_OR_RETURN(ParallelGroups groups,
                   CreateParallelGroups(options, device, ParallelLayout{options.world_size, 1, 1}));
  return groups.world;
}

}  // namespace loom::engine
