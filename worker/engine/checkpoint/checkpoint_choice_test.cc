#include "worker/engine/checkpoint/checkpoint_choice.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/gpt.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/checkpoint/model_fingerprint.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::AnyOf;
using ::testing::HasSubstr;

GptConfig TinyModel() {
  GptConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

TrainingState StateAt(int64_t step) {
  TrainingState s;
  s.step = step;
  s.next_data_batch = step;
  s.loss = 2.5;
  s.lineage = {{0, 0}};
  return s;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A real checkpoint directory with committed checkpoints of a tiny model
// with AdamW state, written by CheckpointWriter.
class CheckpointChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    char pattern[] = "/tmp/loom_checkpoint_choice_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    dir_ = root_ + "/ckpt";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Commits checkpoints of `steps`, in order.
  void Save(const std::vector<int64_t>& steps) {
    torch::manual_seed(7);
    Gpt model(TinyModel());
    std::unique_ptr<torch::optim::AdamW> optimizer = MakeAdamW(*model, OptimizerConfig());
    torch::Tensor idx = torch::randint(0, 32, {2, 8}, torch::kLong);
    optimizer->zero_grad();
    LanguageModelLoss(model->forward(idx), idx).backward();
    optimizer->step();
    CheckpointWriterOptions options;
    options.dir = dir_;
    options.shape = {ModelFingerprint(TinyModel()), 8, 1};
    options.keep_checkpoints = 0;
    CheckpointWriter writer(options);
    for (int64_t step : steps) {
      ASSERT_TRUE(writer.Start(*model, *optimizer, StateAt(step)).ok());
      std::optional<absl::StatusOr<CheckpointReport>> report = writer.Wait();
      ASSERT_TRUE(report.has_value() && report->ok());
    }
  }

  absl::StatusOr<ResumeChoice> Choose(std::vector<CorruptCheckpoint>* corrupt,
                                      int64_t resume_step = -1, bool allow_scratch = false) {
    return ChooseResumeCheckpoint({dir_, resume_step, allow_scratch, std::nullopt}, corrupt);
  }

  std::string root_, dir_;
};

TEST_F(CheckpointChoiceTest, CorruptNewestIsReportedAndTheNextGoodOneIsChosen) {
  ASSERT_NO_FATAL_FAILURE(Save({2, 4}));
  const std::string shard = CheckpointPath(dir_, 4) + "/" + ShardFileName(0);
  std::string bytes = ReadAll(shard);
  bytes[bytes.size() / 2] ^= 0x10;
  WriteAll(shard, bytes);

  std::vector<CorruptCheckpoint> corrupt;
  absl::StatusOr<ResumeChoice> choice = Choose(&corrupt);
  ASSERT_TRUE(choice.ok()) << choice.status();
  ASSERT_TRUE(choice->checkpoint.has_value());
  EXPECT_EQ(choice->checkpoint->path, CheckpointPath(dir_, 2));
  EXPECT_EQ(choice->checkpoint->manifest.state.step, 2);
  EXPECT_FALSE(choice->fork);
  ASSERT_EQ(corrupt.size(), 1u);
  EXPECT_EQ(corrupt[0].step, 4);
  EXPECT_EQ(corrupt[0].generation, 0);
  EXPECT_EQ(corrupt[0].path, CheckpointPath(dir_, 4));
  EXPECT_EQ(corrupt[0].file, shard);
  EXPECT_EQ(corrupt[0].check, kCheckCrc32c);
  EXPECT_THAT(corrupt[0].message, HasSubstr(shard + ": crc32c "));
}

TEST_F(CheckpointChoiceTest, NoGoodCheckpointFailsUnlessStartingFromScratchIsAllowed) {
  ASSERT_NO_FATAL_FAILURE(Save({2, 4}));
  fs::remove(CheckpointPath(dir_, 2) + "/" + ShardFileName(0));
  fs::resize_file(CheckpointPath(dir_, 4) + "/" + kManifestFileName, 10);

  std::vector<CorruptCheckpoint> corrupt;
  absl::StatusOr<ResumeChoice> choice = Choose(&corrupt);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(IsNoGoodCheckpoint(choice.status()));
  EXPECT_THAT(std::string(choice.status().message()),
              HasSubstr("allow_start_from_scratch"));
  EXPECT_THAT(std::string(choice.status().message()), HasSubstr(CheckpointPath(dir_, 2)));
  // Both are reported, with the file and the check that failed.
  ASSERT_EQ(corrupt.size(), 2u);
  std::map<int64_t, CorruptCheckpoint> by_step;
  for (const CorruptCheckpoint& c : corrupt) by_step[c.step] = c;
  EXPECT_EQ(by_step[2].file, CheckpointPath(dir_, 2) + "/" + ShardFileName(0));
  EXPECT_EQ(by_step[2].check, kCheckMissing);
  EXPECT_EQ(by_step[4].file, CheckpointPath(dir_, 4) + "/" + kManifestFileName);
  EXPECT_EQ(by_step[4].check, kCheckManifestChecksum);
  EXPECT_EQ(by_step[4].generation, -1);

  corrupt.clear();
  choice = Choose(&corrupt, -1, /*allow_scratch=*/true);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_FALSE(choice->checkpoint.has_value());
  EXPECT_EQ(corrupt.size(), 2u);

  // Another DATA_LOSS is not "no good checkpoint".
  EXPECT_FALSE(IsNoGoodCheckpoint(absl::DataLossError("no checkpoint verifies")));
}

TEST_F(CheckpointChoiceTest, EmptyDirectoryStartsFromScratchAndResumeStepZeroReadsNothing) {
  std::vector<CorruptCheckpoint> corrupt;
  absl::StatusOr<ResumeChoice> choice = Choose(&corrupt);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_FALSE(choice->checkpoint.has_value());

  ASSERT_NO_FATAL_FAILURE(Save({2}));
  fs::remove(CheckpointPath(dir_, 2) + "/" + ShardFileName(0));
  choice = Choose(&corrupt, /*resume_step=*/0);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_FALSE(choice->checkpoint.has_value());
  EXPECT_TRUE(choice->fork);
  EXPECT_TRUE(corrupt.empty());
}

TEST_F(CheckpointChoiceTest, ResumeStepWithNoGoodCheckpointBeforeItIsFailedPrecondition) {
  ASSERT_NO_FATAL_FAILURE(Save({2, 4}));
  fs::resize_file(CheckpointPath(dir_, 2) + "/" + ShardFileName(0), 100);
  std::vector<CorruptCheckpoint> corrupt;
  absl::StatusOr<ResumeChoice> choice = Choose(&corrupt, /*resume_step=*/3);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(IsNoGoodCheckpoint(choice.status()));
  ASSERT_EQ(corrupt.size(), 1u);
  EXPECT_EQ(corrupt[0].step, 2);
  EXPECT_EQ(corrupt[0].check, kCheckSize);
}

// Corruption sweep: one byte flipped at each of 1,000 random
// offsets of a committed checkpoint's files (one at a time, then put back).
// Every one is detected when the run chooses where to resume, reported with
// the flipped file and the check that failed, and the choice falls back to
// the previous checkpoint. Offsets: a file chosen uniformly (manifest or
// shard), then an offset uniformly in it, XOR a random non-zero mask.
TEST_F(CheckpointChoiceTest, CorruptionSweepDetectsEveryFlippedByte) {
  ASSERT_NO_FATAL_FAILURE(Save({2, 4}));
  const std::string target = CheckpointPath(dir_, 4);
  const std::vector<std::string> files = {target + "/" + kManifestFileName,
                                          target + "/" + ShardFileName(0)};
  std::vector<std::string> originals;
  for (const std::string& f : files) originals.push_back(ReadAll(f));
  ASSERT_GT(originals[0].size(), 0u);
  ASSERT_GT(originals[1].size(), 4096u);

  constexpr int kFlips = 1000;
  std::mt19937_64 rng(12);  // fixed: the same offsets on every run
  int detected = 0, fell_back = 0;
  std::map<std::string, int> by_check;
  for (int i = 0; i < kFlips; ++i) {
    const size_t f = std::uniform_int_distribution<size_t>(0, files.size() - 1)(rng);
    const size_t at = std::uniform_int_distribution<size_t>(0, originals[f].size() - 1)(rng);
    const auto mask = static_cast<char>(std::uniform_int_distribution<int>(1, 255)(rng));
    std::string damaged = originals[f];
    damaged[at] = static_cast<char>(damaged[at] ^ mask);
    WriteAll(files[f], damaged);

    std::vector<CorruptCheckpoint> corrupt;
    absl::StatusOr<ResumeChoice> choice = Choose(&corrupt);
    const bool reported = corrupt.size() == 1 && corrupt[0].path == target &&
                          corrupt[0].file == files[f] && !corrupt[0].check.empty();
    if (reported) {
      ++detected;
      ++by_check[corrupt[0].check];
    } else {
      ADD_FAILURE() << "flip " << i << " of " << files[f] << " at byte " << at << " (mask "
                    << static_cast<int>(static_cast<unsigned char>(mask))
                    << ") was not reported: " << corrupt.size() << " report(s)"
                    << (corrupt.empty() ? "" : ", first: " + corrupt[0].file + " " +
                                                   corrupt[0].check);
    }
    if (choice.ok() && choice->checkpoint.has_value() &&
        choice->checkpoint->path == CheckpointPath(dir_, 2)) {
      ++fell_back;
    }
    // Which check catches a flip depends only on the file.
    if (reported && f == 0) {
      EXPECT_EQ(corrupt[0].check, kCheckManifestChecksum) << "flip " << i << " at " << at;
    }
    if (reported && f == 1) {
      EXPECT_EQ(corrupt[0].check, kCheckCrc32c) << "flip " << i;
    }
    WriteAll(files[f], originals[f]);
  }
  std::cout << "corruption sweep: " << detected << "/" << kFlips << " flipped bytes detected, "
            << fell_back << " fell back to the previous checkpoint (manifest_crc32c "
            << by_check[kCheckManifestChecksum] << ", crc32c " << by_check[kCheckCrc32c] << ")"
            << std::endl;
  EXPECT_EQ(detected, kFlips);
  EXPECT_EQ(fell_back, kFlips);
  // Put back, the checkpoint verifies and is chosen again.
  std::vector<CorruptCheckpoint> corrupt;
  absl::StatusOr<ResumeChoice> choice = Choose(&corrupt);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(corrupt.empty());
  ASSERT_TRUE(choice->checkpoint.has_value());
  EXPECT_EQ(choice->checkpoint->path, target);
}

}  // namespace
}  // namespace loom::engine
