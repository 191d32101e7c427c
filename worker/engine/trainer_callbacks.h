// What Train (trainer.h) tells its caller: TrainerCallbacks, called while
// it runs (steps, checkpoints, corrupt checkpoints, stop requests), and
// TrainResult, returned at the end. A step's metrics are the wire type
// loom.v1.StepMetrics, so this header includes the protobuf messages; the
// configuration (trainer_config.h) does not.
#ifndef LOOM_WORKER_ENGINE_TRAINER_CALLBACKS_H_
#define LOOM_WORKER_ENGINE_TRAINER_CALLBACKS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loom/v1/job.pb.h"
#include "worker/engine/checkpoint/checkpoint_report.h"
#include "worker/engine/config.h"

namespace torch::nn {
class Module;
}

namespace loom::engine {

struct TrainerCallbacks {
  // Rank 0 only. A step's metrics travel as one type from here through the
  // worker to the controller and /metrics: the engine fills what it
  // measures (step, loss, lr, grad_norm, step time and tokens, validation,
  // data_batch and batches_skipped, the time split and device memory,
  // optimizer_step_skipped, nonfinite_steps_skipped over this call,
  // loss_scale); the rank process adds what it knows (rank, FLOPs and MFU,
  // power, memory, precision, total_steps). data_batch is -1 for the step-0
  // report of the untrained model's validation pass.
  std::function<void(const loom::v1::StepMetrics&)> on_step;
  // Rank 0 only, before it chooses the checkpoint to resume from in
  // TrainerConfig::checkpoint_dir (not with resume_step 0): brings into
  // that directory what another tier holds and it lacks (the object store,
  // CheckpointSpec.remote). An error is reported by the callee and training
  // goes on with what the directory has.
  std::function<void(const std::string& dir, int64_t resume_step)> before_resume;
  // Rank 0, when the run starts from TrainerConfig::init_from (the resume
  // restored nothing), before it verifies that checkpoint: a caller whose
  // init_from lives elsewhere (an object store) brings it to that path here.
  // An error fails the start as a checkpoint that cannot be used does.
  std::function<absl::Status(const std::string& init_from)> before_init_from;
  // Rank 0 only, on the training thread, once a checkpoint has committed: at
  // the first step boundary after that, before the next checkpoint starts,
  // or before Train returns; in step order.
  std::function<void(const CheckpointReport&)> on_checkpoint;
  // Rank 0 only, on the training thread, when a checkpoint save of `step`
  // failed (the first failure; training then stops on every rank with that
  // error at the next step boundary). For telemetry: a failing checkpoint
  // volume must be visible before the job's exit says so.
  std::function<void(int64_t step, const absl::Status& error)> on_checkpoint_failed;
  // Polled on every rank before each step; if it returns true on any rank,
  // all ranks stop with CANCELLED (the flag is all-reduced, so no rank is
  // left waiting in a collective). Steps and checkpoints already finished
  // stay valid; a checkpoint save in flight is finished (and reported) first.
  std::function<bool()> should_stop;
  // Polled with should_stop. When it returns true on any rank, every rank
  // saves a checkpoint of the state reached at that step boundary (unless
  // the newest save, or the checkpoint resumed from, is already of that
  // step; a save in flight is finished first), waits for it to commit, and
  // Train returns OK with TrainResult::saved_and_stopped (a failed save is
  // Train's error, as at the end of a run). A should_stop asked at the same
  // boundary (by any rank) wins: no save. Needs checkpoint_dir; without one
  // the ranks only stop (CANCELLED).
  std::function<bool()> should_save_and_stop;
  // Rank 0 only, on the training thread, while choosing where to resume
  // (before the first step, and before Train returns an error about it):
  // once for each checkpoint that failed verification (checkpoint_choice.h),
  // so that the controller learns which file failed which check.
  std::function<void(const CorruptCheckpoint&)> on_checkpoint_corrupt;
  // In-memory snapshots were asked for and this rank cannot keep them
  // (TrainerConfig::snapshot_dir): why. Called at most once per run.
  std::function<void(const std::string& reason)> on_snapshots_off;
  // Every rank, once, after the last step and the final checkpoint, with the
  // trained model (a GptImpl, see gpt.h). For tests and export; runs on the
  // training thread, and the module must not be kept past the call.
  std::function<void(const torch::nn::Module&)> on_finish;
  // Fault injection for tests: rank 0's checkpoint writer calls it, on its
  // background thread, as a save of checkpoint `step` passes `stage` (for
  // example to kill the process there).
  std::function<void(CheckpointStage stage, int64_t step)> on_checkpoint_stage;
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  double final_val_loss = 0;
  // Written by this call (rank 0), in order; includes the rewrite of the
  // resume point when the call forks or changes generation or skip list.
  std::vector<CheckpointReport> checkpoints;
  int64_t resumed_from_step = 0;  // 0 = started from scratch
  // The state resumed came from an in-memory snapshot (the node-local
  // directory of rank resumed_snapshot_rank), not from checkpoint_dir.
  bool resumed_from_snapshot = false;
  int resumed_snapshot_rank = -1;
  // In-memory snapshots this rank committed, and those it skipped because
  // the previous one was still being written when the next was due.
  int64_t snapshots_written = 0;
  int64_t snapshots_skipped = 0;
  // Checkpoints passed over on resume because they did not verify
  // (missing or damaged manifest or file) or could not be read (rank 0
  // only), as on_checkpoint_corrupt reported them.
  std::vector<CorruptCheckpoint> corrupt_checkpoints;
  // Effective lineage generation of this call (see TrainerConfig, "Forks").
  int64_t generation = 0;
  // Skip list in force (union of the resumed checkpoint's and the config's),
  // sorted, with overlapping and adjacent ranges merged.
  std::vector<BatchRange> skip_batches;
  // What ran the fused AdamW step (FusedAdamW::ImplementationFor):
  // "cpu-kernel", "cuda-kernel" or "torch-ops".
  std::string optimizer_implementation;
  // Stopped early by should_save_and_stop with the state reached saved and
  // committed (steps is the step it stopped at; on_finish was not called).
  bool saved_and_stopped = false;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAINER_CALLBACKS_H_
