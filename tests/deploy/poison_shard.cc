// poison_shard: replaces every sample of data batches [BEGIN, END) of a
// token shard, in the order a job with SEED, SEQ_LEN and GLOBAL_BATCH reads
// them, with random bytes, so that job's loss spikes at step BEGIN + 1 and
// the controller rolls it back (as in tests/cluster_test.cc's spike test).
// The Prometheus test uses it to put one automatic rollback on the dashboard.
// Usage: poison_shard SHARD SEQ_LEN GLOBAL_BATCH SEED BEGIN END
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "common/formats/data.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: poison_shard SHARD SEQ_LEN GLOBAL_BATCH SEED BEGIN END\n";
    return 2;
  }
  const std::string shard = argv[1];
  const int64_t seq_len = std::atoll(argv[2]), global_batch = std::atoll(argv[3]);
  const uint64_t seed = std::strtoull(argv[4], nullptr, 10);
  const int64_t begin = std::atoll(argv[5]), end = std::atoll(argv[6]);
  auto tokens = loom::engine::ReadShard(shard);
  if (!tokens.ok()) {
    std::cerr << "poison_shard: " << tokens.status() << "\n";
    return 1;
  }
  auto dataset = loom::engine::TokenDataset::FromShards({*tokens}, seq_len);
  if (!dataset.ok()) {
    std::cerr << "poison_shard: " << dataset.status() << "\n";
    return 1;
  }
  std::mt19937 rng(99);
  for (int64_t d = begin; d < end; ++d) {
    for (int64_t j = 0; j < global_batch; ++j) {
      int64_t sample = dataset->SampleAt(seed, d * global_batch + j);
      for (int64_t k = 0; k <= seq_len; ++k) (*tokens)[sample * seq_len + k] = rng() % 256;
    }
  }
  auto s = loom::engine::WriteShard(shard, *tokens);
  if (!s.ok()) {
    std::cerr << "poison_shard: " << s << "\n";
    return 1;
  }
  std::cout << "poisoned data batches [" << begin << ", " << end << ") of " << shard << "\n";
  return 0;
}
