// Tests' checkpoints without LibTorch: a committed step directory as a save
// leaves it (shard files, then a manifest listing their sizes and CRC-32Cs),
// with deterministic bytes.
#ifndef LOOM_COMMON_OBJECT_STORE_TEST_CHECKPOINT_H_
#define LOOM_COMMON_OBJECT_STORE_TEST_CHECKPOINT_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/formats/checkpoint_files.h"

namespace loom::object_store {

// `n` pseudo-random bytes (xorshift32 from `seed`).
inline std::string TestBytes(size_t n, int seed) {
  std::string s(n, '\0');
  uint32_t x = 2463534242u + static_cast<uint32_t>(seed);
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    s[i] = static_cast<char>(x);
  }
  return s;
}

// Writes <dir>/step-<step>/ with one shard per entry of `shard_bytes` and
// returns its path. Its lineage: attempt 0 from step 0, then `generation`
// (if > 0) from step 1; `val_loss`: the last validation pass's.
inline std::string WriteTestCheckpoint(const std::string& dir, int64_t step, int64_t generation,
                                       const std::vector<size_t>& shard_bytes,
                                       std::optional<double> val_loss = std::nullopt) {
  const std::string path = engine::CheckpointPath(dir, step);
  std::filesystem::create_directories(path);
  engine::CheckpointManifest m;
  m.layout = shard_bytes.size() > 1 ? engine::kShardedLayout : engine::kReplicatedLayout;
  m.data_parallel = static_cast<int>(shard_bytes.size());
  m.shape.model = "test-model";
  m.shape.global_batch = 8;
  m.shape.world_size = static_cast<int>(shard_bytes.size());
  m.state.step = step;
  m.state.generation = generation;
  m.state.lineage = {{0, 0}};
  if (generation > 0) m.state.lineage.push_back({generation, 1});
  m.state.has_val_loss = val_loss.has_value();
  m.state.val_loss = val_loss.value_or(0);
  for (size_t r = 0; r < shard_bytes.size(); ++r) {
    engine::ManifestFile f;
    f.name = engine::ShardFileName(static_cast<int>(r));
    f.rank = static_cast<int>(r);
    const std::string data = TestBytes(shard_bytes[r], static_cast<int>(step * 10 + r));
    f.bytes = data.size();
    f.crc32c = Crc32c(data);
    std::ofstream(path + "/" + f.name, std::ios::binary) << data;
    m.files.push_back(f);
  }
  std::ofstream(path + "/" + engine::kManifestFileName, std::ios::binary)
      << engine::SerializeManifest(m);
  return path;
}

}  // namespace loom::object_store

#endif  // LOOM_COMMON_OBJECT_STORE_TEST_CHECKPOINT_H_
