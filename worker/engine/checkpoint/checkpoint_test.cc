#include "worker/engine/checkpoint/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/gpt.h"
#include "worker/engine/optimizer_state_key.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/checkpoint/model_fingerprint.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

GptConfig TinyModel() {
  GptConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

// A model with AdamW state: built from `seed`, then trained `steps` steps
// on random tokens.
struct Replica {
  explicit Replica(uint64_t seed, int steps = 2) {
    torch::manual_seed(seed);
    model = Gpt(TinyModel());
    OptimizerConfig o;
    optimizer = MakeAdamW(*model, o);
    for (int i = 0; i < steps; ++i) Step();
  }
  void Step() {
    torch::Tensor idx = torch::randint(0, 32, {2, 8}, torch::kLong);
    optimizer->zero_grad();
    LanguageModelLoss(model->forward(idx), idx).backward();
    optimizer->step();
  }
  std::vector<torch::Tensor> Tensors() const {
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& p : model->parameters()) {
      out.push_back(p.detach().clone());
      auto it = optimizer->state().find(StateKeyOf(p));
      if (it == optimizer->state().end()) continue;
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      out.push_back(s.exp_avg().clone());
      out.push_back(s.exp_avg_sq().clone());
      out.push_back(torch::tensor({s.step()}));
    }
    return out;
  }
  Gpt model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

bool BitwiseEqual(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].sizes().equals(b[i].sizes()) || !torch::equal(a[i], b[i])) return false;
  }
  return true;
}

TrainingState StateAt(int64_t step, int64_t generation = 0) {
  TrainingState s;
  s.step = step;
  s.next_data_batch = step + 2;
  s.loss = 2.0 / 3.0;
  s.has_val_loss = true;
  s.val_loss = 1.25;
  s.generation = generation;
  s.lineage = {{0, 0}};
  if (generation > 0) s.lineage.emplace_back(generation, step);
  s.skip_batches = {{1, 3}};
  s.loss_scale = 32768;
  s.loss_scale_clean_steps = 17;
  s.loss_scale_overflow_steps = 3;
  return s;
}

void FlipByte(const std::string& path, uintmax_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x01));
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    char pattern[] = "/tmp/loom_checkpoint_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  CheckpointWriterOptions Options() const {
    CheckpointWriterOptions o;
    o.dir = dir_ + "/ckpt";
    o.shape = Shape();
    o.keep_checkpoints = 0;
    return o;
  }
  static CheckpointShape Shape() { return {ModelFingerprint(TinyModel()), 8, 1}; }

  // Saves `replica` at `state` and waits for the outcome.
  absl::StatusOr<CheckpointReport> Save(CheckpointWriter& writer, Replica& replica,
                                        const TrainingState& state) {
    absl::Status started = writer.Start(*replica.model, *replica.optimizer, state);
    if (!started.ok()) return started;
    std::optional<absl::StatusOr<CheckpointReport>> outcome = writer.Wait();
    if (!outcome.has_value()) return absl::InternalError("nothing was in flight");
    return *std::move(outcome);
  }

  std::string dir_;
};

TEST_F(CheckpointTest, CommittedCheckpointRestoresBitExactly) {
  Replica original(1);
  CheckpointWriter writer(Options());
  const TrainingState state = StateAt(2);
  const torch::Tensor generator_state = at::detail::getDefaultCPUGenerator().get_state();
  absl::StatusOr<CheckpointReport> report = Save(writer, original, state);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(writer.in_flight());

  const std::string path = dir_ + "/ckpt/step-000000002";
  EXPECT_EQ(report->path, path);
  EXPECT_EQ(report->step, 2);
  EXPECT_EQ(report->bytes, fs::file_size(path + "/shard-00000.bin") +
                               fs::file_size(path + "/MANIFEST.json"));
  EXPECT_GT(report->write_seconds, 0);
  EXPECT_GE(report->stall_seconds, 0);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_ + "/ckpt")) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"step-000000002"});

  // Restore into a replica that started elsewhere; the generator is moved on
  // first, so restoring it is visible.
  Replica restored(2, 1);
  torch::randn({10});
  absl::StatusOr<std::string> bytes = ReadVerifiedCheckpoint({2, path, 0, false});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  TrainingState loaded;
  ASSERT_TRUE(RestoreCheckpoint(*bytes, Shape(), *restored.model, *restored.optimizer, &loaded)
                  .ok());
  EXPECT_TRUE(BitwiseEqual(original.Tensors(), restored.Tensors()));
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), generator_state));
  EXPECT_EQ(loaded.step, state.step);
  EXPECT_EQ(loaded.next_data_batch, state.next_data_batch);
  EXPECT_EQ(loaded.loss, state.loss);  // exactly: 17 digits round-trip
  EXPECT_EQ(loaded.has_val_loss, state.has_val_loss);
  EXPECT_EQ(loaded.val_loss, state.val_loss);
  EXPECT_EQ(loaded.generation, state.generation);
  EXPECT_EQ(loaded.lineage, state.lineage);
  EXPECT_EQ(loaded.skip_batches, state.skip_batches);
  EXPECT_EQ(loaded.loss_scale, state.loss_scale);
  EXPECT_EQ(loaded.loss_scale_clean_steps, state.loss_scale_clean_steps);
  EXPECT_EQ(loaded.loss_scale_overflow_steps, state.loss_scale_overflow_steps);

  // Both train on identically.
  torch::manual_seed(9);
  original.Step();
  torch::manual_seed(9);
  restored.Step();
  EXPECT_TRUE(BitwiseEqual(original.Tensors(), restored.Tensors()));
}

TEST_F(CheckpointTest, ManifestListsFilesWithSizeAndCrcAndJobIndependentMetadata) {
  Replica replica(1);
  CheckpointWriter writer(Options());
  ASSERT_TRUE(Save(writer, replica, StateAt(7)).ok());
  const std::string path = dir_ + "/ckpt/step-000000007";
  absl::StatusOr<std::string> text = ReadFile(path + "/MANIFEST.json");
  ASSERT_TRUE(text.ok());
  absl::StatusOr<CheckpointManifest> manifest = ParseManifest(*text, path + "/MANIFEST.json");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->version, 3);
  EXPECT_EQ(manifest->layout, "replicated");
  EXPECT_EQ(manifest->shape.model, Shape().model);
  EXPECT_EQ(manifest->shape.global_batch, 8);
  EXPECT_EQ(manifest->shape.world_size, 1);
  EXPECT_EQ(manifest->state.step, 7);
  EXPECT_EQ(manifest->state.next_data_batch, 9);
  EXPECT_EQ(manifest->state.skip_batches, (std::vector<BatchRange>{{1, 3}}));
  EXPECT_THAT(*text, HasSubstr("\"data_cursor\": 72,"));  // 9 batches of 8
  ASSERT_EQ(manifest->files.size(), 1u);
  const ManifestFile& shard = manifest->files[0];
  EXPECT_EQ(shard.name, "shard-00000.bin");
  EXPECT_EQ(shard.rank, 0);
  absl::StatusOr<std::string> shard_bytes = ReadFile(path + "/shard-00000.bin");
  ASSERT_TRUE(shard_bytes.ok());
  EXPECT_EQ(shard.bytes, shard_bytes->size());
  EXPECT_EQ(shard.crc32c, Crc32c(*shard_bytes));
  // The shard's own header names every tensor; the weights' total is the
  // model's parameter count.
  absl::StatusOr<ShardView> view = ParseShard(*shard_bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  int64_t model_elements = 0;
  for (const ShardTensor& t : view->header.tensors) {
    if (t.name.rfind("model/", 0) != 0) continue;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    model_elements += n;
  }
  EXPECT_EQ(model_elements, GptParameterCount(TinyModel()));
  EXPECT_EQ(view->header.state.step, 7);
  EXPECT_EQ(view->header.data_offset % kShardDataAlignment, 0u);
}

TEST_F(CheckpointTest, ManifestRoundTripsNonFiniteLossAndRejectsDamage) {
  CheckpointManifest m;
  m.shape = Shape();
  m.state = StateAt(3);
  m.state.loss = std::nan("");
  m.state.val_loss = -INFINITY;
  m.files = {{"shard-00000.bin", 0, 123, 0xE3069283u}};
  const std::string text = SerializeManifest(m);
  absl::StatusOr<CheckpointManifest> parsed = ParseManifest(text, "M");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(std::isnan(parsed->state.loss));
  EXPECT_EQ(parsed->state.val_loss, -INFINITY);
  EXPECT_EQ(parsed->files[0].crc32c, 0xE3069283u);
  EXPECT_EQ(parsed->files[0].bytes, 123u);
  // Any one flipped bit, anywhere, is caught (before the JSON is believed).
  for (size_t i = 0; i < text.size(); ++i) {
    std::string damaged = text;
    damaged[i] ^= 0x04;
    EXPECT_EQ(ParseManifest(damaged, "M").status().code(), absl::StatusCode::kDataLoss) << i;
  }
  EXPECT_EQ(ParseManifest(text.substr(0, text.size() / 2), "M").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseManifest("", "M").status().code(), absl::StatusCode::kDataLoss);
}

// Every kind of damage fails the load with DATA_LOSS whose message starts
// with the damaged (or missing) file's path.
// Every byte of a manifest counts, the checksum's own digits included: one
// of them changed from lowercase to uppercase is the same number, but not
// the manifest that was written, and must not verify.
TEST_F(CheckpointTest, ManifestChecksumIsComparedAsWritten) {
  CheckpointManifest manifest;
  manifest.shape = Shape();
  manifest.files.push_back({ShardFileName(0), 0, 4096, 0x1234abcd});
  std::string bytes;
  size_t letter = std::string::npos;
  // A manifest whose checksum has a hex letter (most have; the step varies).
  for (int64_t step = 1; letter == std::string::npos && step < 100; ++step) {
    manifest.state = StateAt(step);
    bytes = SerializeManifest(manifest);
    const size_t digits = bytes.size() - 4 - 8;  // before "\"\n}\n"
    for (size_t i = digits; i < digits + 8; ++i) {
      if (bytes[i] >= 'a' && bytes[i] <= 'f') letter = i;
    }
  }
  ASSERT_NE(letter, std::string::npos);
  ASSERT_TRUE(ParseManifest(bytes, "m").ok());
  ASSERT_TRUE(CheckManifestChecksum(bytes, "m").ok());
  bytes[letter] = static_cast<char>(bytes[letter] - 'a' + 'A');
  EXPECT_EQ(CheckManifestChecksum(bytes, "m").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseManifest(bytes, "m").status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, DamagedCheckpointFailsWithDataLossNamingTheFile) {
  Replica replica(1);
  CheckpointWriter writer(Options());
  ASSERT_TRUE(Save(writer, replica, StateAt(1)).ok());
  const std::string original = dir_ + "/ckpt/step-000000001";
  const std::string shard = "/shard-00000.bin", manifest = "/MANIFEST.json";
  struct Damage {
    const char* what;
    std::string file;
    std::function<void(const std::string&)> apply;
  };
  const std::vector<Damage> damages = {
      {"a flipped byte in the shard's data", shard,
       [](const std::string& p) { FlipByte(p, fs::file_size(p) / 2); }},
      {"a flipped byte in the shard's end padding", shard,
       [](const std::string& p) { FlipByte(p, fs::file_size(p) - 1); }},
      {"a flipped byte in the shard's header", shard, [](const std::string& p) { FlipByte(p, 40); }},
      {"a truncated shard", shard,
       [](const std::string& p) { fs::resize_file(p, fs::file_size(p) - 1); }},
      {"a missing shard", shard, [](const std::string& p) { fs::remove(p); }},
      {"a flipped byte in the manifest", manifest, [](const std::string& p) { FlipByte(p, 30); }},
      {"a truncated manifest", manifest,
       [](const std::string& p) { fs::resize_file(p, fs::file_size(p) / 2); }},
      {"a missing manifest", manifest, [](const std::string& p) { fs::remove(p); }},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.what);
    const std::string copy = dir_ + "/ckpt/step-000000009";
    fs::remove_all(copy);
    fs::copy(original, copy);
    // The copy claims step 1 in its manifest; verify it as step 1.
    const CheckpointEntry entry{1, copy, 0, false};
    ASSERT_TRUE(ReadVerifiedCheckpoint(entry).ok());
    damage.apply(copy + damage.file);
    absl::StatusOr<std::string> loaded = ReadVerifiedCheckpoint(entry);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(loaded.status().message()), StartsWith(copy + damage.file + ": "));
  }
}

// The manifest describes N shards; a load verifies all of them (and uses
// rank 0's under the replicated layout).
TEST_F(CheckpointTest, VerifiesEveryShardTheManifestLists) {
  Replica replica(1);
  CheckpointWriter writer(Options());
  ASSERT_TRUE(Save(writer, replica, StateAt(4)).ok());
  const std::string path = dir_ + "/ckpt/step-000000004";
  absl::StatusOr<std::string> rank0 = ReadFile(path + "/shard-00000.bin");
  ASSERT_TRUE(rank0.ok());
  absl::StatusOr<std::string> text = ReadFile(path + "/MANIFEST.json");
  absl::StatusOr<CheckpointManifest> manifest = ParseManifest(*text, "M");
  ASSERT_TRUE(manifest.ok());
  const std::string other = "rank one's bytes";
  ASSERT_TRUE(WriteFileAtomically(path + "/shard-00001.bin", other).ok());
  manifest->files.push_back({"shard-00001.bin", 1, other.size(), Crc32c(other)});
  ASSERT_TRUE(WriteFileAtomically(path + "/MANIFEST.json", SerializeManifest(*manifest)).ok());

  absl::StatusOr<std::string> loaded = ReadVerifiedCheckpoint({4, path, 0, false});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, *rank0);
  FlipByte(path + "/shard-00001.bin", 3);
  loaded = ReadVerifiedCheckpoint({4, path, 0, false});
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(loaded.status().message()), StartsWith(path + "/shard-00001.bin: "));
}

// The save holds the tensors as they were at Start(): changing them after
// WaitForSnapshot() does not change the checkpoint.
TEST_F(CheckpointTest, SavesTheStateAtStartNotAtCommit) {
  Replica replica(1);
  const std::vector<torch::Tensor> at_start = replica.Tensors();
  CheckpointWriter writer(Options());
  ASSERT_TRUE(writer.Start(*replica.model, *replica.optimizer, StateAt(2)).ok());
  writer.WaitForSnapshot();
  replica.Step();  // what training does right after the fence
  std::optional<absl::StatusOr<CheckpointReport>> report = writer.Wait();
  ASSERT_TRUE(report.has_value() && report->ok());

  Replica restored(2, 0);
  absl::StatusOr<std::string> bytes =
      ReadVerifiedCheckpoint({2, dir_ + "/ckpt/step-000000002", 0, false});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  TrainingState loaded;
  ASSERT_TRUE(
      RestoreCheckpoint(*bytes, Shape(), *restored.model, *restored.optimizer, &loaded).ok());
  EXPECT_TRUE(BitwiseEqual(restored.Tensors(), at_start));
  EXPECT_FALSE(BitwiseEqual(replica.Tensors(), at_start));
}

// Poll() reports a save only once it has committed; until then the step has
// no directory, only a temporary one.
TEST_F(CheckpointTest, PollReportsOnlyCommittedSaves) {
  Replica replica(1);
  absl::Notification at_manifest, release;
  CheckpointWriterOptions options = Options();
  options.on_stage = [&](CheckpointStage stage, int64_t) {
    if (stage != CheckpointStage::kManifestWritten) return;
    at_manifest.Notify();
    release.WaitForNotification();
  };
  CheckpointWriter writer(options);
  ASSERT_TRUE(writer.Start(*replica.model, *replica.optimizer, StateAt(5)).ok());
  at_manifest.WaitForNotification();
  EXPECT_FALSE(writer.Poll().has_value());
  EXPECT_TRUE(writer.in_flight());
  EXPECT_FALSE(fs::exists(dir_ + "/ckpt/step-000000005"));
  EXPECT_TRUE(fs::exists(absl::StrCat(dir_, "/ckpt/step-000000005.tmp-", getpid(),
                                      "/MANIFEST.json")));
  EXPECT_TRUE(ListCheckpoints(dir_ + "/ckpt").empty());
  release.Notify();
  std::optional<absl::StatusOr<CheckpointReport>> report = writer.Wait();
  ASSERT_TRUE(report.has_value() && report->ok());
  EXPECT_TRUE(fs::exists(dir_ + "/ckpt/step-000000005/MANIFEST.json"));
  EXPECT_FALSE(writer.Poll().has_value());  // reported once
}

// Saving a step again (a rewrite under a new generation) replaces the
// directory whole.
TEST_F(CheckpointTest, RewriteReplacesTheCheckpointOfThatStep) {
  Replica replica(1);
  CheckpointWriter writer(Options());
  ASSERT_TRUE(Save(writer, replica, StateAt(3, 0)).ok());
  replica.Step();
  ASSERT_TRUE(Save(writer, replica, StateAt(3, 1)).ok());
  std::vector<CheckpointEntry> listed = ListCheckpoints(dir_ + "/ckpt");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].generation, 1);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_ + "/ckpt")) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"step-000000003"});
  absl::StatusOr<std::string> bytes = ReadVerifiedCheckpoint(listed[0]);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  Replica restored(2, 0);
  TrainingState loaded;
  ASSERT_TRUE(
      RestoreCheckpoint(*bytes, Shape(), *restored.model, *restored.optimizer, &loaded).ok());
  EXPECT_TRUE(BitwiseEqual(restored.Tensors(), replica.Tensors()));
  EXPECT_EQ(loaded.generation, 1);
}

TEST_F(CheckpointTest, TemporariesAreNotListedAndAreRemoved) {
  Replica replica(1);
  CheckpointWriter writer(Options());
  ASSERT_TRUE(Save(writer, replica, StateAt(1)).ok());
  const std::string dir = dir_ + "/ckpt";
  fs::copy(dir + "/step-000000001", dir + "/step-000000002.tmp-4711");  // complete, yet a temp
  fs::create_directory(dir + "/step-000000003.tmp-4711");
  std::ofstream(dir + "/ckpt_00000004.pt.tmp.4711") << "partial";
  std::ofstream(dir + "/notes.txt") << "not ours";
  std::vector<CheckpointEntry> listed = ListCheckpoints(dir);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].step, 1);
  RemoveTemporaries(dir);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"notes.txt", "step-000000001"}));
}

// The writer's stop path: destroying it with a save in flight finishes that
// save (a committed, verifiable checkpoint) and joins its thread.
TEST_F(CheckpointTest, DestructorFinishesTheSaveInFlight) {
  Replica replica(1);
  {
    CheckpointWriter writer(Options());
    ASSERT_TRUE(writer.Start(*replica.model, *replica.optimizer, StateAt(6)).ok());
  }
  EXPECT_TRUE(ReadVerifiedCheckpoint({6, dir_ + "/ckpt/step-000000006", 0, false}).ok());
  EXPECT_EQ(ListCheckpoints(dir_ + "/ckpt").size(), 1u);
}

TEST_F(CheckpointTest, FailedSaveReportsTheErrorAndLeavesNoTemporary) {
  Replica replica(1);
  // A regular file where the checkpoint directory would go: the commit
  // rename fails after everything was written.
  fs::create_directories(dir_ + "/ckpt");
  std::ofstream(dir_ + "/ckpt/step-000000001") << "in the way";
  CheckpointWriter writer(Options());
  ASSERT_TRUE(writer.Start(*replica.model, *replica.optimizer, StateAt(1)).ok());
  std::optional<absl::StatusOr<CheckpointReport>> report = writer.Wait();
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(report->status().message()), HasSubstr("checkpoint at step 1: "));
  EXPECT_FALSE(writer.in_flight());
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_ + "/ckpt")) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"step-000000001"});
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/ckpt/step-000000001"));

  // A directory that cannot be created fails the same way.
  CheckpointWriterOptions options = Options();
  options.dir = dir_ + "/ckpt/step-000000001/sub";
  CheckpointWriter blocked(options);
  ASSERT_TRUE(blocked.Start(*replica.model, *replica.optimizer, StateAt(2)).ok());
  report = blocked.Wait();
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->status().code(), absl::StatusCode::kInternal);
}

// A writer fenced by a newer attempt's claim (checkpoint_fence.h) commits
// nothing and deletes nothing: the newer attempt's checkpoint and the older
// ones it may roll back to stay as they were.
TEST_F(CheckpointTest, AFencedWriterCommitsAndPrunesNothing) {
  Replica replica(1);
  CheckpointWriterOptions options = Options();
  options.keep_checkpoints = 1;
  options.fence = FenceToken{"job-1", 3};
  ASSERT_TRUE(ClaimCheckpointDir(options.dir, *options.fence).ok());
  CheckpointWriter old_attempt(options);
  ASSERT_TRUE(Save(old_attempt, replica, StateAt(1)).ok());
  ASSERT_TRUE(Save(old_attempt, replica, StateAt(2)).ok());  // prunes step 1

  // Attempt 4 claims the directory and commits step 2 again, as its own.
  CheckpointWriterOptions newer = options;
  newer.fence = FenceToken{"job-1", 4};
  newer.keep_checkpoints = 0;
  ASSERT_TRUE(ClaimCheckpointDir(newer.dir, *newer.fence).ok());
  Replica other(2);
  CheckpointWriter new_attempt(newer);
  absl::StatusOr<CheckpointReport> committed = Save(new_attempt, other, StateAt(2));
  ASSERT_TRUE(committed.ok()) << committed.status();

  // Attempt 3, still running, tries a step it would commit and prune after.
  replica.Step();
  absl::StatusOr<CheckpointReport> stale = Save(old_attempt, replica, StateAt(3));
  EXPECT_TRUE(IsCheckpointFenced(stale.status())) << stale.status();
  absl::StatusOr<CheckpointReport> rewrite = Save(old_attempt, replica, StateAt(2));
  EXPECT_TRUE(IsCheckpointFenced(rewrite.status())) << rewrite.status();
  std::vector<CheckpointEntry> listed = ListCheckpoints(options.dir);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].step, 2);
  absl::StatusOr<std::string> bytes = ReadVerifiedCheckpoint(listed[0]);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(Sha256Hex(*bytes), Sha256Hex(*ReadVerifiedCheckpoint(
                                   {2, committed->path, 0, false})));
  Replica restored(3, 0);
  TrainingState loaded;
  ASSERT_TRUE(
      RestoreCheckpoint(*bytes, Shape(), *restored.model, *restored.optimizer, &loaded).ok());
  EXPECT_TRUE(BitwiseEqual(restored.Tensors(), other.Tensors()));
  for (const auto& entry : fs::directory_iterator(options.dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
        << entry.path();
  }
}

// The frozen attempt: attempt 3 stalls between writing its
// shard and its manifest; attempt 4 claims the directory and cleans up the
// temporary directory attempt 3 was writing into. Attempt 3's save then
// fails as fenced (so that it stops as a stale attempt, exit 77), not as an
// I/O error, and nothing is committed.
TEST_F(CheckpointTest, ASaveWhoseTemporaryANewerAttemptRemovedFailsAsFenced) {
  Replica replica(1);
  CheckpointWriterOptions options = Options();
  options.fence = FenceToken{"job-1", 3};
  ASSERT_TRUE(ClaimCheckpointDir(options.dir, *options.fence).ok());
  options.on_stage = [&](CheckpointStage stage, int64_t) {
    if (stage != CheckpointStage::kShardsWritten) return;
    ASSERT_TRUE(ClaimCheckpointDir(options.dir, FenceToken{"job-1", 4},
                                   [&] { RemoveTemporaries(options.dir); })
                    .ok());
  };
  CheckpointWriter writer(options);
  absl::StatusOr<CheckpointReport> saved = Save(writer, replica, StateAt(7));
  ASSERT_FALSE(saved.ok());
  EXPECT_TRUE(IsCheckpointFenced(saved.status())) << saved.status();
  EXPECT_THAT(std::string(saved.status().message()), HasSubstr("step 7"));
  EXPECT_TRUE(ListCheckpoints(options.dir).empty());
}

TEST_F(CheckpointTest, StartRejectsAnOptimizerOtherThanAdamW) {
  Replica replica(1, 0);
  torch::optim::SGD sgd(replica.model->parameters(), torch::optim::SGDOptions(0.1));
  CheckpointWriter writer(Options());
  EXPECT_EQ(writer.Start(*replica.model, sgd, StateAt(1)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(writer.in_flight());
  // A checkpoint of another model shape or global batch does not restore.
  ASSERT_TRUE(Save(writer, replica, StateAt(1)).ok());
  absl::StatusOr<std::string> bytes =
      ReadVerifiedCheckpoint({1, dir_ + "/ckpt/step-000000001", 0, false});
  ASSERT_TRUE(bytes.ok());
  TrainingState loaded;
  CheckpointShape other = Shape();
  other.global_batch = 16;
  absl::Status status =
      RestoreCheckpoint(*bytes, other, *replica.model, *replica.optimizer, &loaded);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("global_batch"));
}

}  // namespace
}  // namespace loom::engine
