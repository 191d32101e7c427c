#include "common/formats/data.h"

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Each test gets its own empty directory, removed afterwards.
class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "loom_data_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  void WriteFile(const std::string& name, const std::string& bytes) const {
    std::ofstream out(Path(name), std::ios::binary);
    out << bytes;
    ASSERT_TRUE(out.good());
  }

  std::string ReadFile(const std::string& path) const {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string dir_;
};

std::vector<uint16_t> Iota(int n, uint16_t first) {
  std::vector<uint16_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Decodes tokens of a byte-level shard back to text.
std::string AsText(const std::vector<uint16_t>& tokens) {
  return std::string(tokens.begin(), tokens.end());
}

struct Batch {
  std::vector<int64_t> inputs;
  std::vector<int64_t> targets;
  bool operator==(const Batch& o) const { return inputs == o.inputs && targets == o.targets; }
};

Batch Fill(const TokenDataset& ds, uint64_t seed, int64_t cursor, int global_batch, int rank,
           int world) {
  const size_t n = static_cast<size_t>(global_batch / world) * ds.seq_len();
  Batch b{std::vector<int64_t>(n, -1), std::vector<int64_t>(n, -1)};
  ds.FillRankBatch(seed, cursor, global_batch, rank, world, b.inputs.data(), b.targets.data());
  return b;
}

// Tokens 0..n-1 in one shard: sample i then starts at token i * seq_len.
TokenDataset MakeDataset(int num_tokens, int seq_len) {
  auto ds = TokenDataset::FromShards({Iota(num_tokens, 0)}, seq_len);
  EXPECT_TRUE(ds.ok()) << ds.status();
  return *std::move(ds);
}

// --- Shard files -------------------------------------------------------------

TEST_F(DataTest, ShardRoundTripAndLayout) {
  const std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535};
  ASSERT_TRUE(WriteShard(Path("s.bin"), tokens).ok());

  auto read = ReadShard(Path("s.bin"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, tokens);

  // Byte layout is llm.c's: little-endian int32 header, then uint16 tokens.
  const std::string raw = ReadFile(Path("s.bin"));
  ASSERT_EQ(raw.size(), 1024u + 2 * tokens.size());
  auto u8 = [&](size_t i) { return static_cast<unsigned char>(raw[i]); };
  EXPECT_EQ(u8(0) | u8(1) << 8 | u8(2) << 16 | u8(3) << 24, 20240520);
  EXPECT_EQ(u8(4) | u8(5) << 8 | u8(6) << 16 | u8(7) << 24, 1);
  EXPECT_EQ(u8(8) | u8(9) << 8 | u8(10) << 16 | u8(11) << 24, 6);
  for (size_t i = 12; i < 1024; ++i) ASSERT_EQ(u8(i), 0) << i;
  EXPECT_EQ(u8(1024 + 2 * 4), 50256 & 0xff);
  EXPECT_EQ(u8(1024 + 2 * 4 + 1), 50256 >> 8);

  // Only the shard is left behind: the temp file was renamed away.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(DataTest, EmptyShardRoundTrips) {
  ASSERT_TRUE(WriteShard(Path("empty.bin"), {}).ok());
  auto read = ReadShard(Path("empty.bin"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->empty());
}

TEST_F(DataTest, WriteShardReplacesExistingFile) {
  ASSERT_TRUE(WriteShard(Path("s.bin"), Iota(100, 0)).ok());
  ASSERT_TRUE(WriteShard(Path("s.bin"), {7, 8}).ok());
  auto read = ReadShard(Path("s.bin"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(*read, ElementsAre(7, 8));
}

TEST_F(DataTest, WriteShardIntoMissingDirectoryIsNotFound) {
  EXPECT_EQ(WriteShard(Path("no/such/dir/s.bin"), {1}).code(), absl::StatusCode::kNotFound);
}

TEST_F(DataTest, ReadShardMissingFileIsNotFound) {
  EXPECT_EQ(ReadShard(Path("missing.bin")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DataTest, ReadShardCorruptionIsDataLoss) {
  ASSERT_TRUE(WriteShard(Path("good.bin"), Iota(10, 0)).ok());
  const std::string good = ReadFile(Path("good.bin"));

  std::string bad_magic = good;
  bad_magic[0] ^= 1;
  WriteFile("bad_magic.bin", bad_magic);
  auto s = ReadShard(Path("bad_magic.bin")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("magic"));

  std::string bad_version = good;
  bad_version[4] = 2;
  WriteFile("bad_version.bin", bad_version);
  EXPECT_EQ(ReadShard(Path("bad_version.bin")).status().code(), absl::StatusCode::kDataLoss);

  WriteFile("truncated.bin", good.substr(0, good.size() - 1));
  EXPECT_EQ(ReadShard(Path("truncated.bin")).status().code(), absl::StatusCode::kDataLoss);

  WriteFile("short_header.bin", good.substr(0, 100));
  EXPECT_EQ(ReadShard(Path("short_header.bin")).status().code(), absl::StatusCode::kDataLoss);

  WriteFile("trailing.bin", good + "xy");
  EXPECT_EQ(ReadShard(Path("trailing.bin")).status().code(), absl::StatusCode::kDataLoss);

  std::string negative_count = good;
  negative_count[11] = static_cast<char>(0x80);
  WriteFile("negative.bin", negative_count);
  EXPECT_EQ(ReadShard(Path("negative.bin")).status().code(), absl::StatusCode::kDataLoss);
}

// --- Glob expansion ----------------------------------------------------------

TEST_F(DataTest, ExpandShardPatternsSortsAndDeduplicates) {
  for (const char* name : {"train_2.bin", "train_0.bin", "train_1.bin", "val_0.bin"}) {
    WriteFile(name, "x");
  }
  fs::create_directory(Path("train_dir.bin"));  // a directory is not a shard

  auto files = ExpandShardPatterns({Path("train_*.bin")});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(Path("train_0.bin"), Path("train_1.bin"), Path("train_2.bin")));

  // Plain paths and patterns mix; overlaps are listed once, all sorted.
  files = ExpandShardPatterns({Path("val_0.bin"), Path("train_[12].bin"), Path("*_1.bin")});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(Path("train_1.bin"), Path("train_2.bin"), Path("val_0.bin")));
}

TEST_F(DataTest, ExpandShardPatternsWithoutMatchIsNotFound) {
  WriteFile("train_0.bin", "x");
  fs::create_directory(Path("only_dir.bin"));
  EXPECT_EQ(ExpandShardPatterns({Path("train_*.bin"), Path("val_*.bin")}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ExpandShardPatterns({Path("missing.bin")}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ExpandShardPatterns({Path("only_dir.bin")}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ExpandShardPatterns({}).status().code(), absl::StatusCode::kInvalidArgument);
}

// --- TokenDataset: construction and samples -----------------------------------

TEST_F(DataTest, WindowsUseStrideSeqLenAndNeverCrossShards) {
  // seq_len 3: a 10-token shard fits windows at 0, 3, 6; a 7-token shard at
  // 0, 3; a 3-token shard fits none. The total (20) would fit more windows.
  auto ds = TokenDataset::FromShards({Iota(10, 0), Iota(3, 500), Iota(7, 100)}, 3);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->num_samples(), 5);
  EXPECT_EQ(ds->num_tokens(), 20);
  EXPECT_EQ(ds->max_token(), 502);

  const std::vector<std::vector<int64_t>> want_windows = {
      {0, 1, 2, 3}, {3, 4, 5, 6}, {6, 7, 8, 9}, {100, 101, 102, 103}, {103, 104, 105, 106}};
  for (int64_t i = 0; i < ds->num_samples(); ++i) {
    int64_t inputs[3], targets[3];
    ds->CopySample(i, inputs, targets);
    const std::vector<int64_t>& w = want_windows[i];
    EXPECT_THAT(inputs, ElementsAre(w[0], w[1], w[2])) << "sample " << i;
    // Targets are the inputs shifted by one.
    EXPECT_THAT(targets, ElementsAre(w[1], w[2], w[3])) << "sample " << i;
  }
}

TEST_F(DataTest, TooLittleDataIsInvalidArgument) {
  // 8 tokens in total but no shard holds seq_len + 1 = 5.
  EXPECT_EQ(TokenDataset::FromShards({Iota(4, 0), Iota(4, 0)}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenDataset::FromShards({Iota(10, 0)}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenDataset::FromShards({}, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(TokenDataset::FromShards({Iota(5, 0)}, 4).ok());
  EXPECT_EQ(TokenDataset::Load({}, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DataTest, LoadPropagatesShardErrors) {
  ASSERT_TRUE(WriteShard(Path("a.bin"), Iota(20, 0)).ok());
  EXPECT_EQ(TokenDataset::Load({Path("a.bin"), Path("missing.bin")}, 4).status().code(),
            absl::StatusCode::kNotFound);
  WriteFile("corrupt.bin", "not a shard");
  EXPECT_EQ(TokenDataset::Load({Path("a.bin"), Path("corrupt.bin")}, 4).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(TokenDataset::Load({Path("a.bin")}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --- TokenDataset: order ---------------------------------------------------------

TEST_F(DataTest, SameSeedAndCursorGiveSameBatchAcrossLoads) {
  ASSERT_TRUE(WriteShard(Path("a.bin"), Iota(1000, 0)).ok());
  ASSERT_TRUE(WriteShard(Path("b.bin"), Iota(777, 2000)).ok());
  auto first = TokenDataset::Load({Path("a.bin"), Path("b.bin")}, 16);
  auto second = TokenDataset::Load({Path("a.bin"), Path("b.bin")}, 16);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(first->num_samples(), 62 + 48);
  // Warm `second`'s permutation cache on another seed and epoch first.
  Fill(*second, 99, 500, 8, 0, 1);
  for (int64_t cursor : {0, 8, 104, 108, 1000}) {
    EXPECT_EQ(Fill(*first, 7, cursor, 8, 0, 1), Fill(*second, 7, cursor, 8, 0, 1))
        << "cursor " << cursor;
  }
}

TEST_F(DataTest, EachEpochIsAPermutationThatDependsOnSeedAndEpoch) {
  const TokenDataset ds = MakeDataset(1001, 1);  // 1000 samples
  const int64_t n = ds.num_samples();
  auto epoch_order = [&](uint64_t seed, int64_t epoch) {
    std::vector<int64_t> order;
    for (int64_t i = 0; i < n; ++i) order.push_back(ds.SampleAt(seed, epoch * n + i));
    return order;
  };
  const std::vector<int64_t> e0 = epoch_order(1, 0);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);  // every sample exactly once
  EXPECT_NE(e0, identity);      // and actually shuffled

  const std::vector<int64_t> e1 = epoch_order(1, 1);
  sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(e1, e0);
  EXPECT_NE(epoch_order(2, 0), e0);
  EXPECT_EQ(epoch_order(1, 0), e0);  // recomputed after the cache moved on
}

// The order is part of the checkpoint format: a resumed job must see the same
// stream as the one that wrote the cursor, even across builds. These values
// were recorded from this implementation; a change here breaks old
// checkpoints and needs a deliberate format decision. (Cross-checked against
// an independent Python port of data.cc's splitmix64 / xoshiro256** /
// Fisher-Yates, whose generators reproduce the reference test vectors.)
TEST_F(DataTest, OrderIsFrozen) {
  const TokenDataset ds = MakeDataset(11, 1);  // 10 samples
  std::vector<int64_t> order;
  for (int64_t c = 0; c < 20; ++c) order.push_back(ds.SampleAt(42, c));
  EXPECT_THAT(order, ElementsAre(9, 3, 4, 2, 6, 0, 8, 1, 5, 7,    // epoch 0
                                 4, 0, 9, 2, 7, 8, 1, 3, 6, 5));  // epoch 1
}

TEST_F(DataTest, RankSlicesPartitionTheGlobalBatch) {
  const TokenDataset ds = MakeDataset(20 * 8 + 1, 8);  // 20 samples of 8
  const int kGlobalBatch = 8;
  // Cursor 16 straddles the boundary between epochs 0 and 1.
  for (int64_t cursor : {0, 8, 16, 44}) {
    const Batch global = Fill(ds, 3, cursor, kGlobalBatch, 0, 1);
    for (int world : {2, 4}) {
      Batch joined;
      std::set<int64_t> first_tokens;
      for (int rank = 0; rank < world; ++rank) {
        const Batch part = Fill(ds, 3, cursor, kGlobalBatch, rank, world);
        joined.inputs.insert(joined.inputs.end(), part.inputs.begin(), part.inputs.end());
        joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
        for (size_t row = 0; row < part.inputs.size(); row += ds.seq_len()) {
          first_tokens.insert(part.inputs[row]);
        }
      }
      EXPECT_EQ(joined, global) << "cursor " << cursor << " world " << world;
      // No sample is on two ranks. Every sample here starts with a distinct
      // token. (A batch straddling an epoch boundary, like cursor 16's, may
      // legitimately repeat a sample, so only check the others.)
      if (cursor % ds.num_samples() + kGlobalBatch <= ds.num_samples()) {
        EXPECT_EQ(first_tokens.size(), static_cast<size_t>(kGlobalBatch));
      }
    }
  }
}

TEST_F(DataTest, ResumingFromACursorContinuesTheStream) {
  const TokenDataset ds = MakeDataset(50 * 4 + 1, 4);  // 50 samples
  const int kGlobalBatch = 6;
  std::vector<Batch> iterated;
  for (int64_t cursor = 0; cursor < 30 * kGlobalBatch; cursor += kGlobalBatch) {
    iterated.push_back(Fill(ds, 11, cursor, kGlobalBatch, 1, 2));
  }
  // A fresh dataset (as after a restart) jumping straight to each cursor.
  for (int64_t step : {0, 1, 8, 9, 17, 29}) {
    const TokenDataset restarted = MakeDataset(50 * 4 + 1, 4);
    EXPECT_EQ(Fill(restarted, 11, step * kGlobalBatch, kGlobalBatch, 1, 2), iterated[step])
        << "step " << step;
  }
}

TEST_F(DataTest, BatchRowsMatchSamples) {
  const TokenDataset ds = MakeDataset(10 * 5 + 1, 5);
  const Batch b = Fill(ds, 5, 7, 4, 1, 2);  // rank 1 of 2: cursors 9 and 10
  for (int row = 0; row < 2; ++row) {
    int64_t inputs[5], targets[5];
    ds.CopySample(ds.SampleAt(5, 9 + row), inputs, targets);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(b.inputs[row * 5 + i], inputs[i]);
      EXPECT_EQ(b.targets[row * 5 + i], targets[i]);
      EXPECT_EQ(targets[i], inputs[i] + 1);  // tokens are 0, 1, 2, ...
    }
  }
}

TEST_F(DataTest, MisuseAborts) {
  const TokenDataset ds = MakeDataset(41, 4);
  int64_t in[16], tg[16];
  EXPECT_DEATH(ds.FillRankBatch(0, 0, 6, 0, 4, in, tg), "global_batch % world_size");
  EXPECT_DEATH(ds.FillRankBatch(0, 0, 4, 2, 2, in, tg), "rank");
  EXPECT_DEATH(ds.SampleAt(0, -1), "cursor");
  EXPECT_DEATH(ds.CopySample(10, in, tg), "index");
}

// --- PrepareByteLevelData -----------------------------------------------------

TEST_F(DataTest, PrepareSplitsByValFraction) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  WriteFile("in.txt", text);
  auto r = PrepareByteLevelData({Path("in.txt")}, Path("out"), 0.1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->train_tokens, 900);
  EXPECT_EQ(r->val_tokens, 100);
  EXPECT_EQ(r->train_tokens + r->val_tokens, static_cast<int64_t>(text.size()));
  ASSERT_THAT(r->train_shards, ElementsAre(Path("out/train_000000.bin")));
  ASSERT_THAT(r->val_shards, ElementsAre(Path("out/val_000000.bin")));
  auto train = ReadShard(r->train_shards[0]);
  auto val = ReadShard(r->val_shards[0]);
  ASSERT_TRUE(train.ok() && val.ok());
  EXPECT_EQ(AsText(*train), text.substr(0, 900));
  EXPECT_EQ(AsText(*val), text.substr(900));
}

TEST_F(DataTest, PrepareReportsTrainUnigramEntropy) {
  // Train split "aaaabbcd": p = 1/2, 1/4, 1/8, 1/8, so H = 1.75 bits =
  // 1.75 ln 2 nats. The val split's 'z's must not count.
  WriteFile("in.txt", "aaaabbcdzzzzzzzz");
  auto r = PrepareByteLevelData({Path("in.txt")}, dir_, 0.5);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->train_tokens, 8);
  EXPECT_NEAR(r->unigram_entropy_nats, 1.75 * std::log(2.0), 1e-12);

  WriteFile("same.txt", "aaaa");
  r = PrepareByteLevelData({Path("same.txt")}, dir_, 0.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->unigram_entropy_nats, 0.0);
}

TEST_F(DataTest, PrepareSeparatesDocumentsWithNewlines) {
  WriteFile("a.txt", "ab");    // gets a '\n' after it
  WriteFile("b.txt", "cd\n");  // already ends in one
  WriteFile("c.txt", "ef");    // last: nothing appended
  auto r = PrepareByteLevelData({Path("a.txt"), Path("b.txt"), Path("c.txt")}, dir_, 0.25);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->train_tokens + r->val_tokens, 2 + 3 + 2 + 1);
  EXPECT_EQ(r->val_tokens, 2);
  auto train = ReadShard(r->train_shards[0]);
  auto val = ReadShard(r->val_shards[0]);
  ASSERT_TRUE(train.ok() && val.ok());
  EXPECT_EQ(AsText(*train) + AsText(*val), "ab\ncd\nef");
}

TEST_F(DataTest, PrepareSplitsLargeSplitsIntoShardsAndRemovesStaleOnes) {
  // Leftovers of an earlier run with more shards.
  fs::create_directory(Path("out"));
  for (const char* name : {"out/train_000002.bin", "out/train_000003.bin", "out/val_000001.bin"}) {
    ASSERT_TRUE(WriteShard(Path(name), {1}).ok());
  }
  WriteFile("in.txt", std::string(25, 'x'));
  auto r = PrepareByteLevelData({Path("in.txt")}, Path("out"), 0.2, /*max_tokens_per_shard=*/10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->train_shards,
              ElementsAre(Path("out/train_000000.bin"), Path("out/train_000001.bin")));
  EXPECT_THAT(r->val_shards, ElementsAre(Path("out/val_000000.bin")));
  EXPECT_EQ(ReadShard(r->train_shards[1])->size(), 10u);
  EXPECT_EQ(ReadShard(r->val_shards[0])->size(), 5u);
  auto all = ExpandShardPatterns({Path("out/*")});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 3u);
}

TEST_F(DataTest, PrepareWithZeroValFractionWritesNoValShard) {
  WriteFile("in.txt", "hello\n");
  auto r = PrepareByteLevelData({Path("in.txt")}, dir_, 0.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->train_tokens, 6);
  EXPECT_EQ(r->val_tokens, 0);
  EXPECT_TRUE(r->val_shards.empty());
}

TEST_F(DataTest, PrepareRejectsBadArguments) {
  WriteFile("in.txt", "hello world\n");
  const std::vector<std::string> in = {Path("in.txt")};
  for (double bad : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_EQ(PrepareByteLevelData(in, dir_, bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(PrepareByteLevelData(in, dir_, 0.1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrepareByteLevelData({}, dir_, 0.1).status().code(),
            absl::StatusCode::kInvalidArgument);
  WriteFile("empty.txt", "");
  EXPECT_EQ(PrepareByteLevelData({Path("empty.txt")}, dir_, 0.1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrepareByteLevelData({Path("missing.txt")}, dir_, 0.1).status().code(),
            absl::StatusCode::kNotFound);
  // Nothing was written by the failed calls.
  EXPECT_FALSE(fs::exists(Path("train_000000.bin")));
}

// --- Prefetching ---------------------------------------------------------------

// The prefetcher hands out exactly FillRankBatch's bytes, in the order
// next_after gives (here: skip batches [5, 9)), and restarts cleanly when
// asked for a batch out of that order (a resume or rollback).
TEST_F(DataTest, PrefetcherYieldsTheLoadersBatchesInOrderAndAfterAJump) {
  TokenDataset reference = MakeDataset(4000, 16);
  TokenDataset owned = MakeDataset(4000, 16);
  const int global_batch = 8, world = 2, rank = 1;
  auto next_after = [](int64_t b) { return b + 1 == 5 ? int64_t{9} : b + 1; };
  for (int depth : {1, 3}) {
    BatchPrefetcher::Options options;
    options.seed = 42;
    options.global_batch = global_batch;
    options.rank = rank;
    options.world_size = world;
    options.depth = depth;
    BatchPrefetcher prefetcher(&owned, options, next_after);
    const size_t n = static_cast<size_t>(global_batch / world) * 16;
    std::vector<int64_t> batches = {0, 1, 2, 3, 4, 9, 10, 11, 3, 4, 9, 40, 41};
    for (int64_t b : batches) {
      Batch got{std::vector<int64_t>(n), std::vector<int64_t>(n)};
      const double waited = prefetcher.Take(b, got.inputs.data(), got.targets.data());
      EXPECT_GE(waited, 0);
      EXPECT_EQ(got, Fill(reference, 42, b * global_batch, global_batch, rank, world))
          << "depth " << depth << " batch " << b;
    }
  }
}

}  // namespace
}  // namespace loom::engine
