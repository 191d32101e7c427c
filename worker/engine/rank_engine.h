// The model and optimizer of one training rank, as the training loop
// (trainer.cc) drives them, behind one interface so that the loop reads the
// same for every layout:
//   * the replicated engine (trainer.cc): the whole Gpt and the fused AdamW
//     on every rank, gradients all-reduced: plain data parallelism;
//   * the layout engine (parallel/layout_engine.cc): a ParallelGpt stage
//     split over its tensor group, the 1F1B pipeline across stages, and
//     ShardedAdamW (ZeRO 0, 1 or 2) over the data group.
// Checkpoints: the replicated engine's world rank 0 writes the whole model
// (layout "replicated", checkpoint.h); every rank of a layout writes its own
// shard (layout "sharded", parallel/sharded_checkpoint.h). Both engines read
// both, so a checkpoint of any layout resumes under any other.
//
// Every method is collective over the ranks of the job unless it says
// otherwise; ranks call them in the same order. May throw c10::Error (the
// trainer turns it into INTERNAL).
#ifndef LOOM_WORKER_ENGINE_RANK_ENGINE_H_
#define LOOM_WORKER_ENGINE_RANK_ENGINE_H_

#include <memory>
#include <string>
#include <utility>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "common/formats/data.h"
#include "worker/engine/ops/fused_adamw.h"
#include "worker/engine/trainer_callbacks.h"
#include "worker/engine/trainer_config.h"

namespace loom::engine {

class CheckpointReader;  // parallel/sharded_checkpoint.h

// Seconds of one step's forward and backward passes (StepMetrics' split).
struct ForwardBackwardTimes {
  double forward = 0;
  double backward = 0;
  // Pipelines: blocked on activations or gradients from neighbour stages
  // (the bubble and transfers); 0 otherwise.
  double pipeline_wait = 0;
};

class RankEngine {
 public:
  virtual ~RankEngine() = default;

  // The data-parallel replica this rank reads the rows of, and how many
  // replicas share each global batch (TokenDataset::FillRankBatch's rank and
  // world size). Local.
  virtual int data_rank() const = 0;
  virtual int data_ranks() const = 0;

  // Sets rank 0's initial weights on every replica (after seeding, they
  // should already agree; this makes it so).
  virtual void SynchronizeInitialWeights() = 0;

  // Forward and backward over this rank's rows (inputs, targets [rows, T],
  // on the training device) in micro-batches of micro_batch rows. The
  // gradient left in the parameters is that of loss_scale times the mean
  // loss over the rows. Returns the mean loss over the rows (local to the
  // replica).
  virtual double ForwardBackward(const torch::Tensor& inputs, const torch::Tensor& targets,
                                 int micro_batch, double loss_scale,
                                 ForwardBackwardTimes* times) = 0;

  // Averages the gradients over the replicas where the optimizer step does
  // not (ZeRO reduces inside Step) and returns the mean of `replica_loss`
  // over the replicas.
  virtual double ReduceGradients(double replica_loss) = 0;

  // The AdamW step at learning rate lr, with the clipping and unscaling of
  // `options`; skipped on every rank when any gradient anywhere is inf or
  // NaN (applied == false). Gradients are cleared afterwards.
  virtual absl::StatusOr<AdamWStepResult> Step(double lr, const AdamWStepOptions& options) = 0;

  // Mean validation loss over eval_batches micro-batches of micro_batch
  // samples 0, 1, 2, ... (file order, wrapping), round-robin over replicas.
  virtual double Evaluate(const TokenDataset& val, int64_t eval_batches, int micro_batch) = 0;

  // Whether every rank writes a shard of each checkpoint (true), or world
  // rank 0 alone the whole model (false). Local.
  virtual bool sharded_checkpoints() const = 0;
  // What this rank writes into a checkpoint (world rank 0 of a replicated
  // engine: the whole model; a layout rank: its pieces). Views of live
  // tensors: valid until the next optimizer step. Local.
  virtual absl::StatusOr<ShardContents> CheckpointShard() = 0;
  // Sharded checkpoints: the manifest's layout fields. Local.
  virtual CheckpointManifest CheckpointLayout() const { return CheckpointManifest{}; }

  // Restores weights, optimizer state, the CPU generator and `state` from
  // the bytes of a verified replicated checkpoint (RestoreCheckpoint's
  // contract and errors). Local.
  virtual absl::Status Restore(absl::string_view bytes, const CheckpointShape& shape,
                               TrainingState* state) = 0;
  // The same from any verified checkpoint directory, read piecewise (every
  // rank reads the shared directory); `scope` (checkpoint.h) restores less
  // for a job started from another's checkpoint. Local.
  virtual absl::Status RestoreFrom(const CheckpointReader& reader, const CheckpointShape& shape,
                                   TrainingState* state,
                                   RestoreScope scope = RestoreScope::kResume) = 0;

  // The rank's module (Gpt or ParallelGpt), for TrainerCallbacks::on_finish.
  virtual torch::nn::Module& module() = 0;
  // FusedAdamW::ImplementationFor's spelling, plus the ZeRO stage if any.
  virtual std::string optimizer_implementation() const = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_RANK_ENGINE_H_
