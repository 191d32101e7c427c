// What one rank trains and how it meets its peers: TrainerConfig (the
// model, optimizer, schedule, batch, device, layout and checkpoints of one
// rank, for Train and TrainWithGroups in trainer.h) and GlooGroupOptions
// (the rendezvous of its process groups). Plain structs: no LibTorch, no
// protobuf, so the process groups (parallel/process_groups.h), the engines
// and tools use them without the training loop.
#ifndef LOOM_WORKER_ENGINE_TRAINER_CONFIG_H_
#define LOOM_WORKER_ENGINE_TRAINER_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/retention.h"
#include "worker/engine/config.h"

namespace loom::engine {

struct TrainerConfig {
  GptConfig model;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  // Sequences per optimizer step, all ranks. Must be a multiple of
  // replicas * micro_batch, replicas = world_size (data = world / (tensor x
  // pipeline) under a layout); each replica runs
  // global_batch / (replicas * micro_batch) micro-batches (accumulation
  // steps, or the pipeline's micro-batches).
  // A checkpoint only resumes under the global_batch it was written with
  // (data batch indices would not line up otherwise).
  int global_batch = 8;
  int micro_batch = 4;    // sequences per forward/backward on one rank
  // Where this rank trains: "cpu" (the default), "cuda" (= "cuda:0") or
  // "cuda:N". The model, its gradients, the AdamW state and each step's
  // batch live there; checkpoints hold host copies and resume on any
  // device. CUDA needs a LibTorch built with CUDA and a visible GPU
  // (INVALID_ARGUMENT naming `device` otherwise). On CUDA the fused AdamW
  // step runs the CUDA kernel when the build has it and LibTorch operations
  // otherwise (TrainResult::optimizer_implementation; a note on stderr), and
  // precision fp16 is allowed (with dynamic loss scaling). Collectives run
  // on whatever process group the caller passes (CreateProcessGroup picks
  // NCCL for CUDA when LibTorch has it); tensors are staged through host
  // memory for a Gloo group. The CPU path is unchanged by this field.
  std::string device = "cpu";
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
  // Batches a background thread keeps ready ahead of the step (see
  // BatchPrefetcher in data.h); 0 = each step gathers its own batch.
  // Either way the batches are the same bytes.
  int prefetch_depth = 2;
  std::vector<std::string> val_shards;    // paths or glob patterns

  // --- Checkpoints -------------------------------------------------------
  // Rank 0 writes one directory per checkpoint, <dir>/step-<step, 9 digits>/,
  // holding its shard and a MANIFEST.json written last that lists every file
  // with its size and CRC-32C (format and commit protocol: checkpoint.h). A
  // save is written into a temporary directory and renamed into place, so a
  // crash at any point leaves complete checkpoints plus, at worst, a
  // step-*.tmp-* directory, which is never read and is removed on the next
  // start. On resume every checksum is verified; a checkpoint that fails
  // (missing or damaged manifest or file) is skipped. Only rank 0 reads or
  // writes the directory (it broadcasts the checkpoint it resumes from).
  // Version 1/2 checkpoints (single files ckpt_<8 digits>.pt with a .sha256
  // sidecar) are still listed and resumed from, never written. Empty = no
  // checkpoints and no resume.
  //
  // A checkpoint holds everything that influences later training: weights,
  // AdamW moments and step counts, the step (which fixes the LR schedule
  // position), the data cursor (next data batch index) and skip list, the
  // global_batch, torch's default CPU generator state, the generation and
  // the lineage. Resuming from it, with the same world size and thread
  // count, continues bit-exactly (dropout masks are reseeded from
  // (seed, rank, step) before every step, so no per-rank RNG state is lost).
  //
  // Lineage. Every checkpoint records its generation and the list of
  // (generation, first step) branch points that led to it. "Lineage order"
  // sorts checkpoints by generation, highest first, then by step, highest
  // first; "newest" below means first in lineage order. (The order reads
  // the generation from the manifest, so choosing reads no shard; a
  // checkpoint whose manifest cannot be read sorts last.)
  //
  // Forks. A resume that deliberately passes over newer checkpoints
  // (resume_step >= 0 while some checkpoint is at a step > resume_step; a
  // rollback) starts a new branch: its generation becomes
  // max(generation, 1 + the highest generation in the directory), and before
  // its first step it rewrites the checkpoint it resumed from under that
  // generation (step-000000000 when the fork starts from scratch). So a
  // crash of the new branch before its next checkpoint resumes
  // (resume_step = -1) on the new branch, with its skip list, not on the
  // abandoned one. The abandoned branch's checkpoints are not deleted by
  // resuming: those at steps the new branch reaches are replaced by its own
  // (an atomic exchange of directories), and pruning deletes the others once
  // the new branch has passed their step. Without a fork the generation is
  // max(generation, the resumed checkpoint's generation); if that or the
  // skip list in force differs from the checkpoint's, the resume point is
  // rewritten the same way (one extra checkpoint write, reported).
  std::string checkpoint_dir;
  // Set (by the worker, to the job's id): the checkpoint directory is fenced
  // to this attempt, (job_id, generation) (checkpoint_fence.h). Rank 0
  // claims it before choosing where to resume; every commit and prune then
  // checks the claim, and a fenced save stops training with
  // IsCheckpointFenced whatever continue_after_failed_save says. Empty: no
  // fencing (tests and tools that own their directory).
  std::string job_id;
  int64_t checkpoint_interval = 0; // 0 = final only
  // Periodic checkpoints are saved asynchronously (see CheckpointReport and
  // checkpoint_writer.h): the step is blocked only to capture the snapshot
  // (and, if the copy of the tensors into the host staging buffer has not
  // finished by the next optimizer step, to wait for it), and the write
  // overlaps the next steps; at most one save is in flight. false = each
  // checkpoint blocks until committed. Both write identical bytes. The
  // resume-point rewrite and the final checkpoint are always waited for.
  // Either way rank 0 keeps a staging buffer the size of a shard (weights
  // plus AdamW moments: 12 bytes per fp32 parameter) from its first
  // checkpoint on.
  bool checkpoint_async = true;
  // What a failed save does (a full volume: RESOURCE_EXHAUSTED, or another
  // I/O error). Either way it is reported (on_checkpoint_failed), leaves no
  // partial checkpoint and the committed ones intact. false: training stops
  // on every rank with the error at the next step boundary. true: training
  // goes on and later saves are tried as usual; the resume-point rewrite
  // may fail too (a crash before the next checkpoint then resumes from the
  // checkpoint this call resumed, as the controller's restart would); only
  // a failed final checkpoint fails the run.
  bool continue_after_failed_save = false;
  // Pruning after every checkpoint write (rank 0), over the checkpoints on
  // the current branch (the ancestors of the one just written): keep the
  // newest keep_checkpoints; <= 0 = keep every checkpoint. Checkpoints of
  // abandoned branches are deleted once their step is <= the current step.
  int keep_checkpoints = 3;
  // Also kept (common/formats/retention.h): each branch checkpoint whose step
  // is a multiple of keep_every_steps (> 0), and the keep_best (> 0) of
  // lowest validation loss as of their step.
  int64_t keep_every_steps = 0;
  int keep_best = 0;
  // Checkpoints kept whatever the rules, by step, and why (another job's
  // init_from names them).
  std::map<int64_t, std::string> held_checkpoints;
  // Rollback reserve, in optimizer steps; 0 = none. When > 0, pruning also
  // keeps the newest branch checkpoint at step <= S - retain_distance_steps
  // (S = the step just written) and every branch checkpoint after it, so
  // that the rollback target "newest checkpoint >= retain_distance_steps
  // before the newest" is the same as if nothing had been pruned, at every
  // point of the run. This holds about retain_distance_steps /
  // checkpoint_interval + 1 checkpoints besides the newest keep_checkpoints.
  int64_t retain_distance_steps = 0;
  // The object store's retention when the job names one: pruning keeps a
  // checkpoint the store keeps for good until the worker's uploader marks
  // its upload settled (RetentionGuard::upload).
  std::optional<RetentionPolicy> upload_retention;
  // In-memory snapshots (checkpoint/snapshot_keeper.h): every
  // snapshot_interval (> 0) steps, a rank with snapshot_writer set saves
  // its replica into snapshot_dir, a directory in host memory (tmpfs) of its
  // node, with checkpoint_dir's format and fencing, keeping the newest; a
  // resume (resume_step -1) takes the newest state that any rank's snapshot
  // or checkpoint_dir holds, in lineage order. Replicated layouts only; a
  // snapshot that needs more than snapshot_max_bytes (> 0) of host memory
  // (its image in snapshot_dir twice, while the next one is written, and
  // its writer's staging buffer), or more than snapshot_dir's free space,
  // turns them off for the run (TrainerCallbacks::on_snapshots_off).
  std::string snapshot_dir;
  int64_t snapshot_interval = 0;
  bool snapshot_writer = false;
  uint64_t snapshot_max_bytes = 0;
  // Which checkpoint to resume from (needs checkpoint_dir):
  //   -1: the newest (in lineage order) that verifies; none exists: from
  //       scratch; some exist and none verifies: DATA_LOSS
  //       (IsNoGoodCheckpoint), or from scratch with allow_start_from_scratch.
  //    0: none: from scratch, even if checkpoints exist (a fork if any do).
  //    N > 0: the newest (in lineage order) at step <= N that verifies;
  //       FAILED_PRECONDITION if none does (the message lists every
  //       checkpoint found and why it was not used).
  int64_t resume_step = -1;
  // A checkpoint directory (step-<N>/, any layout, of the same model) to
  // start from when there is nothing of this job's own to resume (a new
  // job, or one that failed before its first checkpoint): its weights, and
  // with init_optimizer AdamW's moments and step counts, under this run's
  // layout. This run's step, data, schedule, skip list and generator start
  // fresh. Rank 0 verifies every file first; a checkpoint that does not
  // verify or is of another model is DATA_LOSS (IsNoGoodCheckpoint).
  std::string init_from;
  bool init_optimizer = false;
  // resume_step -1: when every checkpoint in checkpoint_dir fails
  // verification, train from step 0 instead of failing (the corrupt ones
  // are reported either way: TrainerCallbacks::on_checkpoint_corrupt).
  bool allow_start_from_scratch = false;
  // Lineage generation of the checkpoints this call writes (>= 0). The
  // controller bumps it for every rollback; see "Forks" above for how the
  // effective generation is derived from it (TrainResult::generation).
  int64_t generation = 0;
  // PaLM-style batch skipping (Chowdhery et al. 2022, sec. 5.1): data batch
  // index ranges never trained on, each with 0 <= begin < end. Before each
  // step, while the next data batch index lies in a range, it jumps to that
  // range's end; so in a run from scratch optimizer step k (1-based) trains
  // on the k-th data batch index outside the ranges. Once anything has been
  // skipped, steps and data batch indices differ: take skip windows from
  // StepMetrics::data_batch, not from step numbers. The list in
  // force is the union of the resumed checkpoint's list and this one; it is
  // saved in every later checkpoint, so later resumes need not repeat it.
  // A run that resumes from checkpoint c with range R reaches the same
  // parameters, bit for bit, as a run from scratch configured with R,
  // provided R begins at or after c's data cursor (StepMetrics::data_batch of
  // c's step, plus 1); the part of R before that cursor was already trained
  // on and has no effect on the resumed run.
  std::vector<BatchRange> skip_batches;

  // --- Parallel layout ----------------------------------------------------
  // Tensor- and pipeline-parallel degrees and the ZeRO stage. At 1, 1, 0
  // every rank holds the whole model and optimizer (Train). Otherwise the
  // ranks run the layout data x pipeline x tensor, data = world size /
  // (tensor x pipeline), through TrainWithGroups (parallel/layout_engine.h
  // says what it executes). Checkpoints are in one format either way, and
  // resume under any layout.
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int zero_stage = 0;  // 0: replicated optimizer state; 1: sharded over the
                       // data group; 2: gradients sharded too
  // Blocks per pipeline stage (parallelism.stage_layers); empty: the
  // engine's balanced split.
  std::vector<int> stage_layers;
};

// Whether `config` asks for the layout engine (TrainWithGroups).
inline bool UsesParallelLayout(const TrainerConfig& config) {
  return config.tensor_parallel != 1 || config.pipeline_parallel != 1 || config.zero_stage != 0;
}

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
  // Non-empty: every key goes under this prefix of the TCP store. Ports are
  // picked free ahead of use, so a rank of another job handed the same port
  // could reach this job's store; with a namespace per job attempt its keys
  // never meet this job's.
  std::string store_namespace;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAINER_CONFIG_H_
