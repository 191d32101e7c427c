// The training loop of one rank: GPT model, AdamW, LR schedule, gradient
// accumulation over micro-batches, data-parallel gradient all-reduce through a
// c10d ProcessGroup, periodic validation and atomic checkpoints.
//
// No gRPC here: the rank process (worker/rank_main.cc) wires it to the
// worker daemon; tests and benchmarks call it directly.
#ifndef LOOM_WORKER_ENGINE_TRAINER_H_
#define LOOM_WORKER_ENGINE_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace c10d {
class ProcessGroup;
}

namespace loom::engine {

struct GptConfig {
  int n_layer = 2;
  int n_head = 2;
  int d_model = 64;
  int seq_len = 64;
  int vocab_size = 256;
  double dropout = 0.0;
};

struct OptimizerConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables
};

struct ScheduleConfig {
  int64_t total_steps = 100;
  int64_t warmup_steps = 10;
  double min_lr_ratio = 0.1;
};

struct TrainerConfig {
  GptConfig model;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  int global_batch = 8;   // sequences per optimizer step, all ranks
  int micro_batch = 4;    // sequences per forward/backward on one rank
  uint64_t seed = 1;
  int64_t eval_interval = 0;   // 0 = only after the last step
  int64_t eval_batches = 8;    // validation micro-batches per pass
  int64_t log_interval = 1;
  std::vector<std::string> train_shards;
  std::vector<std::string> val_shards;
  std::string checkpoint_dir;      // empty = no checkpoints
  int64_t checkpoint_interval = 0; // 0 = final only
  int keep_checkpoints = 3;
};

struct StepReport {
  int64_t step = 0;             // 1-based optimizer step just finished
  double loss = 0;              // mean train loss over the global batch
  double lr = 0;
  double grad_norm = 0;
  double step_time_seconds = 0;
  double tokens_per_second = 0; // global tokens / step time
  int64_t tokens_seen = 0;      // global
  bool has_val_loss = false;
  double val_loss = 0;
};

struct CheckpointReport {
  int64_t step = 0;
  std::string path;
  uint64_t bytes = 0;
  std::string sha256;
};

struct TrainerCallbacks {
  std::function<void(const StepReport&)> on_step;             // rank 0 only
  std::function<void(const CheckpointReport&)> on_checkpoint; // rank 0 only
  // Polled between steps; returning true stops training with CANCELLED.
  std::function<bool()> should_stop;
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  double final_val_loss = 0;
  std::vector<CheckpointReport> checkpoints;
};

// Trains from scratch, or resumes from the newest valid checkpoint in
// checkpoint_dir. `process_group` may be null for a single rank; otherwise
// it defines rank and world size. All LibTorch exceptions are caught and
// returned as Status.
absl::StatusOr<TrainResult> Train(const TrainerConfig& config,
                                  std::shared_ptr<c10d::ProcessGroup> process_group,
                                  const TrainerCallbacks& callbacks);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAINER_H_
