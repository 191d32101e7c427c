// Token data for training: llm.c-compatible shards and a deterministic,
// resumable, rank-sharded loader. No LibTorch and no gRPC in here.
//
// Shard format (llm.c, dev/data/data_common.py): a header of 256 little-endian
// int32 — [0] = 20240520 (magic), [1] = 1 (version), [2] = number of tokens —
// followed by that many uint16 tokens.
#ifndef LOOM_COMMON_FORMATS_DATA_H_
#define LOOM_COMMON_FORMATS_DATA_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::engine {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int kShardHeaderInts = 256;

// Reads a whole shard. Errors: NOT_FOUND (no file), DATA_LOSS (bad magic,
// version, or a token count that disagrees with the file size),
// INVALID_ARGUMENT (not a regular file), other I/O errors mapped from errno.
absl::StatusOr<std::vector<uint16_t>> ReadShard(const std::string& path);

// Writes a shard atomically (temp file in the same directory + fsync +
// rename + fsync of the directory): readers see the old file or the whole new
// one, never a prefix. INVALID_ARGUMENT if tokens.size() exceeds INT32_MAX
// (the header's count is an int32).
absl::Status WriteShard(const std::string& path, const std::vector<uint16_t>& tokens);

// Expands glob patterns (and plain paths) into a sorted, duplicate-free list
// of existing regular files (directories are skipped). NOT_FOUND if a pattern
// matches no regular file; INVALID_ARGUMENT if `patterns` is empty.
absl::StatusOr<std::vector<std::string>> ExpandShardPatterns(
    const std::vector<std::string>& patterns);

// A training sample is a window of seq_len + 1 consecutive tokens (inputs are
// the first seq_len, targets the last seq_len). Windows are taken with stride
// seq_len, never crossing a shard boundary.
//
// Order: epoch e = cursor / num_samples() visits the samples in a permutation
// drawn from (seed, e) alone, so every rank computes the same order without
// talking. A global batch of B samples starting at cursor c is samples
// c .. c+B-1 in that order; rank r of W takes the contiguous slice
// [c + r*B/W, c + (r+1)*B/W). The cursor (a global sample index) is the whole
// loader state: save it in a checkpoint, restore it, and the stream continues
// identically.
//
// The permutation (splitmix64-seeded xoshiro256** driving Fisher-Yates, see
// data.cc) is fixed by this file, not by the standard library, so it is the
// same on every platform and compiler; changing it breaks resuming old
// checkpoints. Misuse of the accessors below (negative cursor, index out of
// range, bad rank/world/batch) is a broken invariant and aborts.
//
// Not thread-safe, not even for const calls: one thread at a time (SampleAt
// caches the permutation). Copies are independent.
class TokenDataset {
 public:
  // Loads all shards into memory. INVALID_ARGUMENT if seq_len < 1, `paths` is
  // empty, or no shard holds seq_len + 1 tokens (windows never cross shards,
  // so the total alone is not enough); errors of ReadShard.
  static absl::StatusOr<TokenDataset> Load(const std::vector<std::string>& paths,
                                           int seq_len);
  // Builds from in-memory shards (tests).
  static absl::StatusOr<TokenDataset> FromShards(std::vector<std::vector<uint16_t>> shards,
                                                 int seq_len);

  int seq_len() const { return seq_len_; }
  int64_t num_samples() const { return static_cast<int64_t>(starts_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  // Largest token id anywhere in the shards (to check against the vocab).
  uint16_t max_token() const { return max_token_; }

  // Index of the sample visited at global position `cursor` (any cursor >= 0).
  int64_t SampleAt(uint64_t seed, int64_t cursor) const;

  // Copies sample `index` into inputs[0..seq_len) and targets[0..seq_len).
  void CopySample(int64_t index, int64_t* inputs, int64_t* targets) const;

  // Fills rank `rank`'s share of the global batch that starts at `cursor`:
  // `global_batch / world_size` rows of seq_len tokens each, row-major, so
  // `inputs` and `targets` must each hold global_batch / world_size * seq_len
  // values. Requires global_batch > 0, 0 <= rank < world_size and
  // global_batch % world_size == 0. The next batch starts at
  // cursor + global_batch.
  void FillRankBatch(uint64_t seed, int64_t cursor, int global_batch, int rank,
                     int world_size, int64_t* inputs, int64_t* targets) const;

 private:
  TokenDataset() = default;
  std::vector<std::vector<uint16_t>> shards_;
  // starts_[i] = (shard, offset) of sample i, packed as shard << 40 | offset.
  std::vector<uint64_t> starts_;
  int seq_len_ = 0;
  int64_t num_tokens_ = 0;
  uint16_t max_token_ = 0;
  // Permutation cache for the most recent epoch (mutable: cache only).
  mutable std::vector<int64_t> perm_;
  mutable int64_t perm_epoch_ = -1;
  mutable uint64_t perm_seed_ = 0;
};

// Byte-level tokenisation (vocab 256: token = byte value) of text files into
// train/validation shards in `out_dir` (created if missing).
//
// The stream is the input files in the given order, with one '\n' inserted
// between two files when the first does not already end in '\n', so documents
// stay separated and train_tokens + val_tokens == total input bytes + inserted
// separators. The last llround(val_fraction * total) tokens of the stream go
// to validation, the rest to training.
//
// Writes train_000000.bin, train_000001.bin, ... and val_000000.bin, ...
// (a new file every `max_tokens_per_shard` tokens); no val file when the val
// split is empty. Numbered shards with these prefixes left by an earlier run
// beyond the ones written now are deleted, so a glob over out_dir sees exactly
// this run's shards.
//
// Errors: INVALID_ARGUMENT if `inputs` is empty, an input is not a regular
// file, val_fraction is not in [0, 1), max_tokens_per_shard is not in
// [1, INT32_MAX], or the train split would be empty; NOT_FOUND for a missing
// input; ABORTED if an input changes size while being read; I/O errors.
// After an error out_dir may hold some of the new shards next to old ones:
// rerun before using it.
struct PrepareResult {
  std::vector<std::string> train_shards;
  std::vector<std::string> val_shards;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  // Shannon entropy of the byte unigram distribution of the train split, in
  // nats per token: the loss a model that ignores context could reach.
  double unigram_entropy_nats = 0;
};
absl::StatusOr<PrepareResult> PrepareByteLevelData(
    const std::vector<std::string>& inputs, const std::string& out_dir,
    double val_fraction, int64_t max_tokens_per_shard = 100'000'000);

// A background thread that keeps the next `depth` batches of one rank
// filled (TokenDataset::FillRankBatch), so that the training step finds its
// input ready instead of gathering it. The sequence of data batch indices is
// known ahead: after batch b comes next_after(b) (the trainer passes
// "b + 1, then past any skip range").
//
// Thread safety: Take() from one thread at a time (the training thread).
// The dataset must outlive the prefetcher and must not be used by anyone
// else while it exists (TokenDataset is not thread-safe); the prefetcher's
// thread is its only user.
class BatchPrefetcher {
 public:
  struct Options {
    uint64_t seed = 0;
    int global_batch = 1;
    int rank = 0;
    int world_size = 1;
    int depth = 2;  // batches kept ready, >= 1
  };
  BatchPrefetcher(const TokenDataset* dataset, Options options,
                  std::function<int64_t(int64_t)> next_after);
  ~BatchPrefetcher();  // stops and joins the thread
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Copies rank `rank`'s share of data batch `batch` (the batch starting at
  // cursor batch * global_batch) into inputs and targets (each
  // global_batch / world_size * seq_len values), blocking until it is ready;
  // returns the seconds spent waiting. The first call, or a call for a batch
  // other than the one expected next, restarts prefetching from `batch`.
  // The bytes are exactly FillRankBatch's.
  double Take(int64_t batch, int64_t* inputs, int64_t* targets);

 private:
  struct Slot {
    int64_t batch = -1;
    std::vector<int64_t> inputs, targets;
  };
  void Run();

  const TokenDataset* dataset_;
  const Options options_;
  const std::function<int64_t(int64_t)> next_after_;
  const size_t values_;  // per slot and array

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Slot> ready_;      // guarded by mu_; in batch order
  std::vector<Slot> free_;      // guarded by mu_; buffers to reuse
  int64_t next_to_fill_ = -1;   // guarded by mu_; -1 = not started
  uint64_t restarts_ = 0;       // guarded by mu_; bumps discard fills in flight
  bool stop_ = false;           // guarded by mu_
  std::thread thread_;
};

}  // namespace loom::engine

#endif  // LOOM_COMMON_FORMATS_DATA_H_
