// The training loop reads top to bottom in TrainOrThrow(): load the data,
// build the engine, resume, then per step TrainStep (data, forward and
// backward, the gradient reduction, the optimizer step), validation, the
// report and the checkpoint. Everything it calls sits above it. The engines
// are replicated_engine.h and parallel/layout_engine.h; checkpoint formats
// and writing live in checkpoint.h / checkpoint_writer.h, their
// coordination across ranks in checkpoint_coordinator.h.
#include "worker/engine/trainer.h"

#include <c10/core/DeviceGuard.h>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/formats/data.h"
#include "common/status_macros.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_choice.h"
#include "worker/engine/checkpoint/checkpoint_coordinator.h"
#include "worker/engine/checkpoint/model_fingerprint.h"
#include "worker/engine/checkpoint/snapshot_keeper.h"
#include "worker/engine/collectives.h"
#include "worker/engine/device_memory.h"
#include "worker/engine/gpt.h"  // ValidateGptConfig
#include "worker/engine/loss_scaler.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/parallel/layout_engine.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/parallel/sharded_checkpoint.h"
#include "worker/engine/rank_engine.h"
#include "worker/engine/replicated_engine.h"
#include "worker/engine/resume.h"

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

// Where one optimizer step's time went, in seconds (StepMetrics).
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
  double control = 0;  // the loop's own work since the previous step
};

// ---------------------------------------------------------------------------
// The run's parts, in the order TrainOrThrow uses them.

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The training text and the optional validation text.
struct RunData {
  TokenDataset train;
  std::optional<TokenDataset> val;
};

absl::StatusOr<std::unique_ptr<RunData>> LoadRunData(const TrainerConfig& config) {
  ASSIGN_OR_RETURN(TokenDataset train, LoadDataset(config.train_shards, config.model,
                                                   "train_shards"));
  auto data = std::make_unique<RunData>(RunData{std::move(train), std::nullopt});
  if (!config.val_shards.empty() && config.eval_batches > 0) {
    ASSIGN_OR_RETURN(TokenDataset val, LoadDataset(config.val_shards, config.model,
                                                   "val_shards"));
    data->val.emplace(std::move(val));
  }
  return data;
}

// The model and optimizer (rank_engine.h): identical on every replica by
// seeding, and made so by broadcast. `layout` null: the replicated engine.
absl::StatusOr<std::unique_ptr<RankEngine>> BuildEngine(const TrainerConfig& config,
                                                        const torch::Device& device,
                                                        const ParallelGroups* layout,
                                                        Collectives* collectives) {
  std::unique_ptr<RankEngine> engine;
  {
    std::lock_guard<std::mutex> lock(ModelInitMutex());
    torch::manual_seed(config.seed);
    if (layout) {
      engine = MakeLayoutEngine(config, *layout, device);
    } else {
      ASSIGN_OR_RETURN(engine, MakeReplicatedEngine(config, device, collectives));
    }
  }
  engine->SynchronizeInitialWeights();
  return engine;
}

// fp16 dynamic loss scaling (loss_scaler.h): the loss is scaled before
// backward and the gradients unscaled inside the optimizer step. Only for
// fp16, which ValidateGptConfig allows on a GPU only. A resumed fp16 run
// continues with the scale it had (a checkpoint from a bf16/fp32 run, or an
// older one, has none: start afresh).
absl::StatusOr<std::optional<DynamicLossScaler>> MakeLossScaler(const TrainerConfig& config,
                                                                bool restored,
                                                                const TrainingState& state) {
  std::optional<DynamicLossScaler> scaler;
  if (config.model.precision != Precision::kFp16) return scaler;
  scaler.emplace();
  if (restored && state.loss_scale > 0) {
    const absl::Status s = scaler->Restore(state.loss_scale, state.loss_scale_clean_steps,
                                           state.loss_scale_overflow_steps);
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint at step ", state.step,
                                              " holds a bad loss scaler state: ", s.message()));
    }
  }
  return scaler;
}

// This rank's rows of each step's data batch: global_batch / data replicas
// rows, in buffers that live for the whole run. On a GPU they are pinned
// (page-locked), so that the copy to the device is one DMA transfer. With
// prefetch_depth > 0 a background thread keeps the next batches ready, in
// the order the skip list gives; from then on it is the only user of
// `train`.
class BatchFeed {
 public:
  BatchFeed(const TrainerConfig& config, const RankEngine& engine, const TokenDataset* train,
            const std::vector<BatchRange>& skip_batches, const torch::Device& device)
      : config_(config), engine_(engine), train_(train), device_(device) {
    const int rows = config.global_batch / engine.data_ranks();
    inputs_ = torch::empty({rows, config.model.seq_len}, torch::kLong);
    targets_ = torch::empty({rows, config.model.seq_len}, torch::kLong);
    if (device.is_cuda()) {
      inputs_ = inputs_.pin_memory();
      targets_ = targets_.pin_memory();
    }
    if (config.prefetch_depth > 0) {
      BatchPrefetcher::Options loader;
      loader.seed = config.seed;
      loader.global_batch = config.global_batch;
      loader.rank = engine.data_rank();
      loader.world_size = engine.data_ranks();
      loader.depth = config.prefetch_depth;
      prefetcher_ = std::make_unique<BatchPrefetcher>(
          train, loader, [skip = skip_batches](int64_t b) { return SkipForward(skip, b + 1); });
    }
  }

  // Data batch `data_batch`'s rows on the training device. The host-to-
  // device copy is synchronous, so the host buffers may be refilled next
  // step. Times the wait for data and the copy (0 on the CPU) into `split`.
  std::pair<torch::Tensor, torch::Tensor> Take(int64_t data_batch, StepSplit* split) {
    auto phase = std::chrono::steady_clock::now();
    int64_t* const inputs = inputs_.data_ptr<int64_t>();
    int64_t* const targets = targets_.data_ptr<int64_t>();
    if (prefetcher_) {
      prefetcher_->Take(data_batch, inputs, targets);
    } else {
      train_->FillRankBatch(config_.seed, data_batch * config_.global_batch,
                            config_.global_batch, engine_.data_rank(), engine_.data_ranks(),
                            inputs, targets);
    }
    split->data_wait = SecondsSince(phase);
    if (device_.is_cpu()) return {inputs_, targets_};
    phase = std::chrono::steady_clock::now();
    std::pair<torch::Tensor, torch::Tensor> on_device = {inputs_.to(device_),
                                                         targets_.to(device_)};
    split->host_to_device = SecondsSince(phase);
    return on_device;
  }

 private:
  const TrainerConfig& config_;
  const RankEngine& engine_;
  const TokenDataset* train_;
  torch::Device device_;
  torch::Tensor inputs_, targets_;
  std::unique_ptr<BatchPrefetcher> prefetcher_;
};

// One optimizer step, as it went.
struct StepOutcome {
  int64_t data_batch = 0;
  double loss = 0;        // mean over the global batch
  double lr = 0;
  double loss_scale = 1;  // the fp16 scale the step ran with
  AdamWStepResult stepped;
  StepSplit split;
  double seconds = 0;     // wall time, the carried checkpoint stall included
};

// The loop's parts that run every step.
struct StepParts {
  const TrainerConfig& config;
  RankEngine& engine;
  BatchFeed& batches;
  CheckpointCoordinator& checkpoints;
  SnapshotKeeper& snapshots;
  std::optional<DynamicLossScaler>& scaler;
  int rank = 0;
};

// Trains one step on the next data batch outside the skip list: data,
// forward and backward over this rank's rows (the data-parallel reduction
// overlapping backward), the rest of the gradient reduction, and the fused
// optimizer step; advances `state`. `carried_stall`: seconds the capture of
// the previous step's checkpoint blocked training, and `control`: seconds
// of the loop's own work since the previous step (the step-boundary
// agreement, the per-rank time gather, the step report), both charged to
// this step.
absl::StatusOr<StepOutcome> TrainStep(const StepParts& parts, double carried_stall, double control,
                                      TrainingState* state) {
  const TrainerConfig& config = parts.config;
  const auto start = std::chrono::steady_clock::now();
  StepOutcome out;
  out.split.checkpoint_stall = carried_stall;
  out.split.control = control;
  if (config.model.dropout > 0) {
    torch::manual_seed(DropoutSeed(config.seed, parts.rank, state->step));
  }
  out.data_batch = SkipForward(state->skip_batches, state->next_data_batch);
  const auto [inputs, targets] = parts.batches.Take(out.data_batch, &out.split);

  out.loss_scale = parts.scaler ? parts.scaler->scale() : 1.0;
  auto phase = std::chrono::steady_clock::now();
  ForwardBackwardTimes passes;
  const double replica_loss =
      parts.engine.ForwardBackward(inputs, targets, config.micro_batch, out.loss_scale, &passes);
  out.split.forward = passes.forward;
  out.split.backward = passes.backward;
  out.split.pipeline_wait = passes.pipeline_wait;
  out.split.compute = SecondsSince(phase);
  phase = std::chrono::steady_clock::now();
  out.loss = parts.engine.ReduceGradients(replica_loss);
  out.split.comm = SecondsSince(phase);  // what backward did not hide
  out.lr = LearningRateAt(config.schedule, config.optimizer.lr, state->step);

  // Snapshot fence: a save started after the previous step may still be
  // copying parameters and optimizer state, which the step below
  // overwrites. Everything above only reads them.
  out.split.checkpoint_stall += parts.checkpoints.WaitForSnapshot();
  out.split.checkpoint_stall += parts.snapshots.WaitForSnapshot();
  phase = std::chrono::steady_clock::now();
  // Clipping (torch.nn.utils.clip_grad_norm_'s factor) inside the fused
  // pass. A step whose gradients hold inf or NaN is skipped: no parameter
  // or moment changes; the data batch is consumed and the schedule moves
  // on, and the loss reported for it is whatever non-finite value the
  // ranks saw, for the controller's detector.
  AdamWStepOptions step_options;
  step_options.max_grad_norm = config.optimizer.grad_clip;
  step_options.inv_scale = 1.0 / out.loss_scale;
  ASSIGN_OR_RETURN(out.stepped, parts.engine.Step(out.lr, step_options));
  out.split.optimizer = SecondsSince(phase);
  if (parts.scaler) {
    parts.scaler->Update(out.stepped.applied);
    state->loss_scale = parts.scaler->scale();
    state->loss_scale_clean_steps = parts.scaler->clean_steps();
    state->loss_scale_overflow_steps = parts.scaler->overflow_steps();
  }
  state->step += 1;
  state->next_data_batch = out.data_batch + 1;
  state->loss = out.loss;
  out.seconds = SecondsSince(start) + carried_stall + control;
  return out;
}

// Rank 0's report of a step (TrainerCallbacks::on_step).
loom::v1::StepMetrics MakeStepReport(const TrainerConfig& config, const StepOutcome& step,
                                     const TrainingState& state, bool validated,
                                     int64_t nonfinite_skipped, const torch::Device& device) {
  const int64_t tokens_per_step = int64_t{config.global_batch} * config.model.seq_len;
  loom::v1::StepMetrics report;
  report.set_step(state.step);
  report.set_loss(step.loss);
  report.set_lr(step.lr);
  report.set_grad_norm(step.stepped.grad_norm);
  report.set_step_time_seconds(step.seconds);
  report.set_tokens_per_second(step.seconds > 0 ? tokens_per_step / step.seconds : 0);
  report.set_tokens_seen(state.step * tokens_per_step);
  report.set_has_val_loss(validated);
  report.set_val_loss(validated ? state.val_loss : 0);
  report.set_data_batch(step.data_batch);
  report.set_batches_skipped(state.next_data_batch - state.step);
  report.set_data_wait_seconds(step.split.data_wait);
  report.set_compute_seconds(step.split.compute);
  report.set_host_to_device_seconds(step.split.host_to_device);
  if (device.is_cuda()) {
    if (std::optional<DeviceMemory> m = CudaAllocatorMemory(device.index())) {
      report.set_device_memory_allocated_bytes(static_cast<uint64_t>(m->allocated_bytes));
      report.set_device_memory_reserved_bytes(static_cast<uint64_t>(m->reserved_bytes));
      report.set_device_memory_peak_bytes(static_cast<uint64_t>(m->peak_allocated_bytes));
    }
  }
  report.set_forward_seconds(step.split.forward);
  report.set_backward_seconds(step.split.backward);
  report.set_pipeline_wait_seconds(step.split.pipeline_wait);
  report.set_comm_seconds(step.split.comm);
  report.set_optimizer_seconds(step.split.optimizer);
  report.set_checkpoint_stall_seconds(step.split.checkpoint_stall);
  report.set_control_seconds(step.split.control);
  report.set_optimizer_step_skipped(!step.stepped.applied);
  report.set_nonfinite_steps_skipped(nonfinite_skipped);
  report.set_loss_scale(step.loss_scale);
  return report;
}

// A fresh run measures the untrained model on the validation set first, so
// that "how far did validation loss fall" has a starting point; rank 0
// reports it as step 0 (loss = that validation loss; no optimizer step).
void ReportInitialValidation(const TrainerConfig& config, RankEngine& engine,
                             const TokenDataset& val, const TrainingState& state, int rank,
                             const TrainerCallbacks& callbacks) {
  const auto eval_start = std::chrono::steady_clock::now();
  const double initial = engine.Evaluate(val, config.eval_batches, config.micro_batch);
  if (rank != 0 || !callbacks.on_step) return;
  loom::v1::StepMetrics report;
  report.set_eval_seconds(SecondsSince(eval_start));
  report.set_step(0);
  report.set_loss(initial);
  report.set_lr(LearningRateAt(config.schedule, config.optimizer.lr, 0));
  report.set_has_val_loss(true);
  report.set_val_loss(initial);
  report.set_data_batch(-1);
  report.set_batches_skipped(state.next_data_batch - state.step);
  report.set_loss_scale(1);
  callbacks.on_step(report);
}

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
  RETURN_IF_ERROR(ValidateTrainerConfig(config, layout ? layout->layout.data : world_size));
  if (layout) RETURN_IF_ERROR(ValidateLayoutConfig(config, layout->layout));
  ASSIGN_OR_RETURN(const torch::Device device, ParseDevice(config.device));
  // On a GPU it is this thread's current device for the whole run (kernel
  // launches, the CUDA AdamW kernel's stream, NCCL).
  std::optional<c10::DeviceGuard> device_guard;
  if (!device.is_cpu()) device_guard.emplace(device);
  Collectives collectives(std::move(process_group), device);
  const int rank = collectives.rank();
  ASSIGN_OR_RETURN(const std::unique_ptr<RunData> data, LoadRunData(config));
  ASSIGN_OR_RETURN(const std::unique_ptr<RankEngine> engine,
                   BuildEngine(config, device, layout, &collectives));
  const CheckpointShape shape{ModelFingerprint(config.model), config.global_batch, world_size};

  // Checkpoints (checkpoint_coordinator.h): rank 0 alone, or every rank of
  // a layout, saves; outcomes are heard at later step boundaries. Declared
  // after the engine so that it is destroyed first: its writer waits for a
  // save in flight, which may still be copying the engine's tensors.
  TrainResult result;
  result.optimizer_implementation = engine->optimizer_implementation();
  CheckpointCoordinator checkpoints(config, shape, engine.get(), &collectives, callbacks, &result);
  // In-memory snapshots (checkpoint/snapshot_keeper.h): one writer per node;
  // it claims its directory before Resume reads it.
  SnapshotKeeper snapshots(config, shape, engine.get(), callbacks, &result);

  TrainingState state;
  const auto restore_start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const ResumeOutcome resumed,
                   Resume(config, shape, *engine, collectives, callbacks, &state, &result));
  // Reported once, with the first step report (checkpoint_restore_seconds).
  double unreported_restore = resumed.restored ? SecondsSince(restore_start) : 0.0;
  if (!resumed.restored && !config.init_from.empty()) {
    RETURN_IF_ERROR(InitializeFrom(config, shape, *engine, collectives, callbacks));
  }
  const bool record_branch = BeginBranch(config, resumed, &state);
  result.generation = state.generation;
  result.skip_batches = state.skip_batches;
  if (record_branch) {
    // Under continue_after_failed_save a failed rewrite is reported and the
    // run goes on from the checkpoint it resumed (TrainerConfig).
    checkpoints.Save(state, /*wait=*/true);
    RETURN_IF_ERROR(checkpoints.Finish(/*final=*/false));
  }
  ASSIGN_OR_RETURN(std::optional<DynamicLossScaler> scaler,
                   MakeLossScaler(config, resumed.restored, state));
  BatchFeed batches(config, *engine, &data->train, state.skip_batches, device);
  if (state.step == 0 && data->val.has_value()) {
    ReportInitialValidation(config, *engine, *data->val, state, rank, callbacks);
  }

  // The step of the newest checkpoint saved, or resumed from (or 0 from
  // scratch, where a fresh start repeats the same state): a save-and-stop
  // there has nothing new to save.
  // A snapshot's step is not in checkpoint_dir unless the branch was
  // recorded there.
  int64_t saved_step = resumed.from_snapshot && !record_branch ? -1 : state.step;
  const StepParts parts{config, *engine, batches, checkpoints, snapshots, scaler, rank};
  const bool snapshots_asked = !config.snapshot_dir.empty() && config.snapshot_interval > 0;
  const int64_t total_steps = config.schedule.total_steps;
  int64_t nonfinite_skipped = 0;  // optimizer steps skipped for inf/NaN
  double pending_stall = 0;       // seconds the last checkpoint's capture took
  double eval_seconds = 0;        // seconds the last validation pass took
  // When the previous step's TrainStep returned (none yet in this attempt).
  std::optional<std::chrono::steady_clock::time_point> previous_step_end;
  while (state.step < total_steps) {
    // Step boundary: a stop request from any rank, or a failed save on rank
    // 0, ends every rank here. A save in flight at a stop is finished and
    // reported first: it is a valid checkpoint.
    StopRequest asked = StopRequest::kNone;
    if (callbacks.should_save_and_stop && callbacks.should_save_and_stop()) {
      asked = StopRequest::kSaveAndStop;
    }
    if (callbacks.should_stop && callbacks.should_stop()) asked = StopRequest::kStop;
    ASSIGN_OR_RETURN(const StopRequest agreed, checkpoints.AtStepBoundary(asked, state.step + 1));
    if (agreed == StopRequest::kSaveAndStop) {
      if (config.checkpoint_dir.empty()) {
        return absl::CancelledError(absl::StrCat("stopped before step ", state.step + 1,
                                                 " without a save: the job has no checkpoint "
                                                 "directory"));
      }
      if (saved_step != state.step) checkpoints.Save(state, /*wait=*/true);
      RETURN_IF_ERROR(checkpoints.Finish());
      result.steps = state.step;
      result.final_loss = state.loss;
      result.saved_and_stopped = true;
      snapshots.Discard();
      return result;
    }
    // The loop's own work since the previous step ended, less what is
    // counted elsewhere (validation, the checkpoint capture).
    const double control =
        previous_step_end.has_value()
            ? std::max(0.0, SecondsSince(*previous_step_end) - pending_stall - eval_seconds)
            : 0.0;
    ASSIGN_OR_RETURN(const StepOutcome step, TrainStep(parts, pending_stall, control, &state));
    previous_step_end = std::chrono::steady_clock::now();
    pending_stall = 0;
    if (!step.stepped.applied) nonfinite_skipped += 1;

    const bool last = state.step == total_steps;
    const bool validate = data->val.has_value() &&
                          (last || (config.eval_interval > 0 &&
                                    state.step % config.eval_interval == 0));
    eval_seconds = 0;
    if (validate) {
      const auto eval_start = std::chrono::steady_clock::now();
      state.val_loss = engine->Evaluate(*data->val, config.eval_batches, config.micro_batch);
      state.has_val_loss = true;
      eval_seconds = SecondsSince(eval_start);
    }
    const bool report_step = last || validate || state.step % config.log_interval == 0;
    // Gathered on report steps, in one collective: every rank's own compute
    // time, for the controller's slow-rank detector
    // (StepMetrics.rank_compute_seconds), and the newest snapshot each
    // rank's node holds, for its count of the steps a lost node costs
    // (StepMetrics.rank_snapshot_steps; step + 1 in the sum, exact below
    // 2^53, 0 for none).
    std::vector<double> rank_compute;
    std::vector<int64_t> rank_snapshots;
    if (report_step) {
      const int n = collectives.world_size();
      std::vector<double> gathered(snapshots_asked ? 2 * n : n, 0.0);
      gathered[rank] = step.split.forward + step.split.backward;
      if (snapshots_asked) gathered[n + rank] = static_cast<double>(snapshots.newest_step() + 1);
      if (n > 1) gathered = collectives.Sum(std::move(gathered));
      if (n > 1) rank_compute.assign(gathered.begin(), gathered.begin() + n);
      for (int r = 0; snapshots_asked && r < n; ++r) {
        rank_snapshots.push_back(static_cast<int64_t>(gathered[n + r]) - 1);
      }
    }
    if (rank == 0 && callbacks.on_step && report_step) {
      loom::v1::StepMetrics report =
          MakeStepReport(config, step, state, validate, nonfinite_skipped, device);
      for (double seconds : rank_compute) report.add_rank_compute_seconds(seconds);
      for (int64_t step : rank_snapshots) report.add_rank_snapshot_steps(step);
      report.set_resumed_from_snapshot(unreported_restore > 0 && resumed.from_snapshot);
      report.set_checkpoint_restore_seconds(unreported_restore);
      report.set_eval_seconds(eval_seconds);
      unreported_restore = 0;
      callbacks.on_step(report);
    }
    if (!config.checkpoint_dir.empty() &&
        (last || (config.checkpoint_interval > 0 && state.step % config.checkpoint_interval == 0))) {
      const auto save_start = std::chrono::steady_clock::now();
      checkpoints.Save(state, /*wait=*/last || !config.checkpoint_async);
      saved_step = state.step;
      pending_stall = SecondsSince(save_start);
    }
    if (!last && snapshots.on()) {
      const auto capture_start = std::chrono::steady_clock::now();
      snapshots.AfterStep(state);
      pending_stall += SecondsSince(capture_start);
    }
  }

  // The final checkpoint has committed (or failed) by now; every rank hears.
  RETURN_IF_ERROR(checkpoints.Finish());
  snapshots.Discard();
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
