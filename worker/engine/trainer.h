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

// Forward declarations keep this header free of LibTorch, so that code
// without torch (the worker daemon, the controller) can include it.
namespace c10d {
class ProcessGroup;
}
namespace torch::nn {
class Module;
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
  // Sequences per optimizer step, all ranks. Must be a multiple of
  // world_size * micro_batch; each rank runs
  // global_batch / (world_size * micro_batch) accumulation micro-steps.
  int global_batch = 8;
  int micro_batch = 4;    // sequences per forward/backward on one rank
  // Seeds the initial weights (identical on every rank), the data order
  // (TokenDataset::SampleAt) and the dropout masks (per rank and step).
  uint64_t seed = 1;
  int64_t eval_interval = 0;   // 0 = only after the last step
  // Validation micro-batches per pass, in total over all ranks (micro-batch i
  // runs on rank i % world_size). A pass always reads the validation samples
  // 0 .. eval_batches * micro_batch - 1 in file order, so its value does not
  // depend on the seed or the world size. 0, or no val_shards, = no
  // validation.
  int64_t eval_batches = 8;
  int64_t log_interval = 1;    // on_step every this many steps (>= 1), and
                               // at the last step and at validation steps
  std::vector<std::string> train_shards;  // paths or glob patterns
  std::vector<std::string> val_shards;    // paths or glob patterns
  // Rank 0 writes <dir>/ckpt_<step, 8 digits>.pt and a sha256sum-format
  // sidecar <that>.sha256, each atomically; a checkpoint without a sidecar,
  // or whose bytes do not match it, is skipped on resume. Only rank 0 reads
  // or writes the directory (it broadcasts the checkpoint it resumes from).
  // Empty = no checkpoints and no resume.
  std::string checkpoint_dir;
  int64_t checkpoint_interval = 0; // 0 = final only
  int keep_checkpoints = 3;        // newest kept; <= 0 = keep all
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
  // Polled on every rank before each step; if it returns true on any rank,
  // all ranks stop with CANCELLED (the flag is all-reduced, so no rank is
  // left waiting in a collective). Steps and checkpoints already finished
  // stay valid.
  std::function<bool()> should_stop;
  // Every rank, once, after the last step and the final checkpoint, with the
  // trained model (a GptImpl, see gpt.h). For tests and export; runs on the
  // training thread, and the module must not be kept past the call.
  std::function<void(const torch::nn::Module&)> on_finish;
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  double final_val_loss = 0;
  std::vector<CheckpointReport> checkpoints;  // written by this call (rank 0)
  int64_t resumed_from_step = 0;  // 0 = started from scratch
  // Checkpoints passed over on resume because they had no sidecar, did not
  // match it, or could not be read (rank 0 only).
  std::vector<std::string> skipped_checkpoints;
};

// Trains from scratch, or resumes from the newest valid checkpoint in
// checkpoint_dir, until schedule.total_steps optimizer steps are done.
// `process_group` may be null for a single rank; otherwise it defines rank
// and world size, and every rank must call Train with the same config.
// After initialisation rank 0's weights are broadcast to all ranks (as
// torch DistributedDataParallel does), so replicas start identical.
//
// c10d process groups are intrusively reference counted. A group made with
// std::make_shared is fine; one already owned by a c10::intrusive_ptr must be
// wrapped with a deleter that keeps that intrusive_ptr (as
// CreateGlooProcessGroup does), never by adopting its raw pointer.
//
// Ranks that share a process (tests) draw from one global LibTorch
// generator: their initial weights are still deterministic (construction is
// serialised), their dropout masks are not.
//
// Errors: INVALID_ARGUMENT for a bad config (the message names the field) or
// tokens outside the vocabulary; FAILED_PRECONDITION if the checkpoint to
// resume from was written for a different model shape; CANCELLED via
// should_stop; ABORTED on ranks != 0 when rank 0 failed to write a
// checkpoint; errors of TokenDataset::Load; INTERNAL for LibTorch errors
// (c10::Error, including collective failures and timeouts) and I/O errors.
absl::StatusOr<TrainResult> Train(const TrainerConfig& config,
                                  std::shared_ptr<c10d::ProcessGroup> process_group,
                                  const TrainerCallbacks& callbacks);

// A Gloo process group whose rendezvous is a c10d TCPStore that rank 0
// hosts on master_addr:master_port.
struct GlooGroupOptions {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  // Address of this host that Gloo binds and advertises to peers; empty =
  // Gloo's default (the address the hostname resolves to, else loopback).
  std::string local_addr;
  // Store rendezvous and every collective fail after this long.
  double timeout_seconds = 300;
};
// Blocks until all world_size ranks have joined. INVALID_ARGUMENT for a bad
// rank/world size/port; INTERNAL if the store or Gloo cannot be set up.
absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> CreateGlooProcessGroup(
    const GlooGroupOptions& options);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAINER_H_
