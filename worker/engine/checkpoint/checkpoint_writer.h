// The asynchronous checkpoint writer of one rank:
// the training thread is blocked only to capture a checkpoint (shapes
// and loop state) and, if need be, to wait for the copy of its tensors into a
// host staging buffer; serialising, checksumming, fsync and the commit rename
// run on a background thread while training continues.
//
// Protocol of the training thread, at most one save in flight:
//
//   writer.Start(module, optimizer, state);   // returns at once
//   ... forward, backward, all-reduce: parameters are only read ...
//   writer.WaitForSnapshot();   // before the next write to any parameter or
//                               // optimizer state (the optimizer step)
//   ... writer.Poll() at step boundaries, writer.Wait() before the next
//   Start and before returning ...
//
// The background thread first copies every tensor into the staging buffer
// (which is the shard file's exact image), then writes and commits it as
// checkpoint.h describes, then prunes. The staging buffer is kept between
// saves: it costs one more copy of the weights and optimizer state in host
// memory for as long as the writer lives.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_WRITER_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_WRITER_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/formats/retention.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_fence.h"
#include "worker/engine/checkpoint/checkpoint_report.h"
#include "worker/engine/config.h"

namespace loom::engine {

struct CheckpointWriterOptions {
  std::string dir;                    // created if missing
  int rank = 0;                       // whose shard this writer writes
  // Empty: a replicated save. The writer writes its shard and the manifest
  // into <step dir>.tmp-<pid>/ and commits it (checkpoint.h).
  // Non-empty: one rank's part of a sharded save. Every rank of the job
  // writes its shard into <step dir>.tmp-<shared_temp_tag>/ (the same tag
  // on every rank, world rank 0's choice) and commits nothing; once every
  // rank's shard is written (written_shard() on each), world rank 0 calls
  // CommitShardedCheckpoint. The directory must be shared by the ranks.
  std::string shared_temp_tag;
  CheckpointShape shape;              // recorded in manifest and shard
  int keep_checkpoints = 3;           // see TrainerConfig
  int64_t keep_every_steps = 0;       // see TrainerConfig
  int keep_best = 0;                  // see TrainerConfig
  int64_t retain_distance_steps = 0;  // see TrainerConfig
  std::optional<RetentionPolicy> upload_retention;  // see TrainerConfig
  std::map<int64_t, std::string> held_checkpoints;  // see TrainerConfig
  // Set: every commit, prune and clean-up of `dir` runs only while this
  // token holds the directory's claim (checkpoint_fence.h); a fenced save
  // fails IsCheckpointFenced and touches nothing. The claim itself is made
  // at start (ClaimCheckpointDir). Unset: no fencing (tools, tests).
  std::optional<FenceToken> fence;
  // Fault injection for tests; see TrainerCallbacks::on_checkpoint_stage.
  // Called on the background thread.
  std::function<void(CheckpointStage stage, int64_t step)> on_stage;
};

// What one rank's shard holds. The caller sets each tensor's name, dtype,
// shape and (for pieces) tp_rank / tp_size / begin; the writer assigns
// offsets and bytes. sources[i] holds tensors[i]'s values and must stay
// unmodified until the snapshot (see Start).
struct ShardContents {
  std::vector<ShardTensor> tensors;
  std::vector<torch::Tensor> sources;
  std::vector<ShardOptimizerGroup> optimizer_groups;
  // Appends a tensor (a CPU contiguous copy is taken now if `source` is on
  // another device or not contiguous).
  void Add(ShardTensor tensor, const torch::Tensor& source);
};

// A replicated shard: every parameter and buffer of `module` ("model/..."),
// the AdamW state of `optimizer` (AdamW over the module's parameters) and
// torch's default CPU generator. FAILED_PRECONDITION if the optimizer is not
// AdamW over module parameters.
absl::StatusOr<ShardContents> ReplicatedShardContents(torch::nn::Module& module,
                                                      torch::optim::Optimizer& optimizer);

// World rank 0 of a sharded save, once every rank's shard is in the
// temporary directory: writes the manifest (layout "sharded", `layout`'s
// degrees, `shards` as its files) and commits and prunes as a replicated
// save does. The on_stage hooks run here (kShardsWritten first). Errors
// leave no checkpoint (the temporary directory is removed).
absl::StatusOr<CheckpointReport> CommitShardedCheckpoint(const CheckpointWriterOptions& options,
                                                         const CheckpointManifest& layout,
                                                         const TrainingState& state,
                                                         const std::vector<ManifestFile>& shards);

// Thread-compatible: one training thread calls every method; the background
// thread is internal. The destructor waits for a save in flight to finish
// (its outcome is dropped) and joins the thread.
// A save's error that says the checkpoint volume is full or over quota is
// IsCheckpointVolumeFull (checkpoint_fence.h); one that says a newer
// attempt holds the directory is IsCheckpointFenced.

class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointWriterOptions options);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Starts saving `module` (parameters and buffers) and `optimizer` (AdamW
  // over the module's parameters) at `state`. Precondition: nothing in
  // flight (Wait() first). Until WaitForSnapshot(), Poll() or Wait() reports
  // the snapshot taken, the caller must neither modify nor free those
  // tensors. FAILED_PRECONDITION if the optimizer is not AdamW over module
  // parameters (nothing is started then).
  absl::Status Start(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                     const TrainingState& state);
  // The same for any shard contents (a sharded save's part).
  absl::Status Start(ShardContents contents, const TrainingState& state);

  // Sharded saves: the shard the last finished save wrote (name, rank, size,
  // CRC-32C), for world rank 0's manifest.
  const ManifestFile& written_shard() const { return written_shard_; }

  // Blocks until the tensors of the save in flight have been copied; returns
  // at once if they have, or if nothing is in flight.
  void WaitForSnapshot();

  bool in_flight() const { return job_ != nullptr; }

  // The outcome of the save in flight if it has finished (committed and
  // pruned, or failed); nullopt if it is still running or none is in flight.
  // A failed save leaves no checkpoint (its temporary directory is removed)
  // and the committed ones as they were. IsCheckpointVolumeFull: the volume
  // is full or over quota (ENOSPC, EDQUOT; RESOURCE_EXHAUSTED), so a retry
  // fails the same way until space is freed; other I/O errors are INTERNAL.
  std::optional<absl::StatusOr<CheckpointReport>> Poll();

  // Blocks until the save in flight finishes; its outcome, or nullopt if
  // none was in flight. The time blocked counts as that save's stall.
  std::optional<absl::StatusOr<CheckpointReport>> Wait();

 private:
  struct Job;
  struct FreeDeleter {
    void operator()(char* p) const;
  };

  void Run(Job* job);  // the background thread
  absl::StatusOr<CheckpointReport> WriteAndCommit(Job& job);
  std::optional<absl::StatusOr<CheckpointReport>> Finish();

  const CheckpointWriterOptions options_;
  // Staging buffer, the shard image; the background thread owns it while a
  // job runs, the training thread (re)allocates it between jobs.
  std::unique_ptr<char, FreeDeleter> staging_;
  size_t staging_capacity_ = 0;
  std::unique_ptr<Job> job_;  // training thread; null when nothing in flight
  ManifestFile written_shard_;  // training thread, set by Finish
  std::thread thread_;        // runs job_, joined by Finish() or ~CheckpointWriter
  absl::Mutex mu_;
  bool snapshotted_ ABSL_GUARDED_BY(mu_) = false;  // of job_
  bool done_ ABSL_GUARDED_BY(mu_) = false;         // of job_
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_WRITER_H_
