// What the trainer tells its caller about checkpoints: a committed
// checkpoint's report, a corrupt one found at load, and the points of a save that tests can inject faults
// at. No LibTorch.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_REPORT_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/formats/retention.h"

namespace loom::engine {

// A committed checkpoint, reported once its directory has its final name
// (and pruning after it is done).
struct CheckpointReport {
  int64_t step = 0;
  std::string path;        // the checkpoint directory, <dir>/step-<9 digits>
  uint64_t bytes = 0;      // all its files, manifest included
  std::string sha256;      // hex SHA-256 of its MANIFEST.json, which holds
                           // the CRC-32C of every other file
  int64_t generation = 0;  // lineage generation recorded in it
  // Background thread: serialising, checksumming, writing, fsync and the
  // commit rename; not the snapshot copy or pruning.
  double write_seconds = 0;
  // Training thread, blocked on this checkpoint: capturing it, waiting for
  // its snapshot copy before the next optimizer step, and waiting for it to
  // commit (when the next checkpoint came due first, at the end of training,
  // or with checkpoint_async = false).
  double stall_seconds = 0;
  // Checkpoints that pruning after this commit deleted (their directories,
  // and why), so that the controller's catalog can tell pruned from lost.
  std::vector<PrunedDirectory> pruned;
};

// A checkpoint that failed verification when a run chose where to resume
// (checkpoint_choice.h).
struct CorruptCheckpoint {
  int64_t step = 0;
  int64_t generation = -1;  // as its manifest says; -1: the manifest is unreadable
  std::string path;         // the checkpoint directory (or legacy file)
  std::string file;         // the file that failed (VerificationFailure::file)
  std::string check;        // which check failed (kCheck* of checkpoint.h)
  std::string message;      // the verification error, naming the file
};

// Points of a checkpoint save, for fault injection in tests
// (TrainerCallbacks::on_checkpoint_stage).
enum class CheckpointStage {
  kShardsWritten,    // shards written and fsynced in the temporary
                     // directory; no manifest yet
  kManifestWritten,  // manifest written, the directory fsynced; not renamed
  kCommitted,        // renamed into place, the parent fsynced; not pruned
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_REPORT_H_
