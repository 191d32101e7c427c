#include "controller/checkpoints/checkpoint_catalog.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "controller/checkpoints/checkpoint_verifier.h"
#include "controller/store/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/checkpoint/model_fingerprint.h"
#include "worker/engine/gpt.h"
#include "worker/engine/optimizer.h"

namespace loom::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

void FlipByte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x40));
}

// A real store, real checkpoints written by the engine's CheckpointWriter
// (with retention, so that it prunes), and the real loom-ckpt tool.
class CheckpointCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    char pattern[] = "/tmp/loom_checkpoint_catalog_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    dir_ = root_ + "/ckpt";
    auto store = Store::Open(root_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Commits checkpoints of `steps` with keep_checkpoints `keep`; returns
  // the writer's reports, as a rank would send them.
  std::vector<loom::v1::CheckpointInfo> Save(const std::vector<int64_t>& steps, int keep) {
    engine::GptConfig model_config;
    model_config.n_layer = 1;
    model_config.n_head = 2;
    model_config.d_model = 16;
    model_config.seq_len = 8;
    model_config.vocab_size = 32;
    torch::manual_seed(3);
    engine::Gpt model(model_config);
    auto optimizer = engine::MakeAdamW(*model, engine::OptimizerConfig());
    engine::CheckpointWriterOptions options;
    options.dir = dir_;
    options.shape = {engine::ModelFingerprint(model_config), 8, 1};
    options.keep_checkpoints = keep;
    engine::CheckpointWriter writer(options);
    std::vector<loom::v1::CheckpointInfo> reports;
    for (int64_t step : steps) {
      engine::TrainingState state;
      state.step = step;
      state.lineage = {{0, 0}};
      EXPECT_TRUE(writer.Start(*model, *optimizer, state).ok());
      auto report = writer.Wait();
      EXPECT_TRUE(report.has_value() && report->ok());
      if (!report.has_value() || !report->ok()) return reports;
      loom::v1::CheckpointInfo info;
      info.set_step((*report)->step);
      info.set_path((*report)->path);
      info.set_bytes((*report)->bytes);
      for (const engine::PrunedDirectory& d : (*report)->pruned) {
        loom::v1::PrunedCheckpoint* p = info.add_pruned();
        p->set_path(d.path);
        p->set_step(d.step);
        p->set_tier("local");
        p->set_reason(d.reason);
      }
      reports.push_back(info);
    }
    return reports;
  }

  std::map<int64_t, loom::v1::CheckpointInfo> ByStep(CheckpointCatalog& catalog, bool verify) {
    auto list = verify ? catalog.Verify("job-1") : catalog.List("job-1");
    EXPECT_TRUE(list.ok()) << list.status();
    std::map<int64_t, loom::v1::CheckpointInfo> out;
    if (list.ok()) {
      for (const auto& info : *list) out[info.step()] = info;
    }
    return out;
  }

  std::string root_, dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(CheckpointCatalogTest, TellsCommittedPrunedMissingAndCorruptApart) {
  FileCheckpointVerifier verifier;
  CheckpointCatalog catalog(store_.get(), &verifier);
  const std::vector<loom::v1::CheckpointInfo> reports = Save({2, 4, 6}, /*keep=*/2);
  ASSERT_EQ(reports.size(), 3u);
  // Committing step 6 with keep 2 pruned step 2, and the report says so.
  ASSERT_EQ(reports[2].pruned_size(), 1);
  EXPECT_EQ(reports[2].pruned(0).path(), engine::CheckpointPath(dir_, 2));
  for (const auto& info : reports) ASSERT_TRUE(catalog.RecordCommitted("job-1", info).ok());

  auto listed = ByStep(catalog, false);
  EXPECT_EQ(listed[2].status(), kCheckpointPruned);
  EXPECT_EQ(listed[4].status(), kCheckpointCommitted);
  EXPECT_EQ(listed[6].status(), kCheckpointCommitted);
  EXPECT_EQ(*catalog.NewestGood("job-1", -1), 6);
  EXPECT_EQ(*catalog.NewestGood("job-1", 5), 4);

  // Gone without being pruned: missing.
  fs::remove_all(engine::CheckpointPath(dir_, 4));
  // One byte of step 6's shard flipped: --verify finds it, names the file and
  // the check, and the catalog keeps it corrupt.
  const std::string shard = engine::CheckpointPath(dir_, 6) + "/" + engine::ShardFileName(0);
  FlipByte(shard, static_cast<std::streamoff>(fs::file_size(shard) / 2));
  listed = ByStep(catalog, /*verify=*/true);
  EXPECT_EQ(listed[2].status(), kCheckpointPruned);
  EXPECT_EQ(listed[4].status(), kCheckpointMissing);
  EXPECT_EQ(listed[6].status(), kCheckpointCorrupt);
  EXPECT_EQ(listed[6].corrupt_file(), shard);
  EXPECT_EQ(listed[6].failed_check(), "crc32c");
  EXPECT_THAT(listed[6].error(), HasSubstr(shard + ": crc32c "));
  EXPECT_EQ(ByStep(catalog, false)[6].status(), kCheckpointCorrupt);  // stored
  EXPECT_EQ(*catalog.NewestGood("job-1", -1), 0);

  // Corrupt stays corrupt, also once the bytes are put back; a later
  // attempt's rewrite of the step is an entry of its own, committed.
  FlipByte(shard, static_cast<std::streamoff>(fs::file_size(shard) / 2));
  listed = ByStep(catalog, /*verify=*/true);
  EXPECT_EQ(listed[6].status(), kCheckpointCorrupt);
  loom::v1::CheckpointInfo rewrite = reports[2];
  rewrite.set_generation(1);
  rewrite.clear_pruned();
  ASSERT_TRUE(catalog.RecordCommitted("job-1", rewrite).ok());
  auto all = catalog.Verify("job-1");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[3].step(), 6);
  EXPECT_EQ((*all)[3].generation(), 1);
  EXPECT_EQ((*all)[3].status(), kCheckpointCommitted);
  EXPECT_EQ((*all)[2].status(), kCheckpointCorrupt);
  EXPECT_EQ(*catalog.NewestGood("job-1", -1), 6);
}

// The rank that pruned a checkpoint died before its report arrived (seen
// in the chaos bench: a fenced attempt's last commit pruned one, and its
// report was lost with it): the directory's prune log still tells the
// catalog it was pruned, while a checkpoint gone otherwise stays missing.
TEST_F(CheckpointCatalogTest, PruneWhoseReportWasLostIsPrunedByTheLog) {
  CheckpointCatalog catalog(store_.get(), nullptr);
  std::vector<loom::v1::CheckpointInfo> reports = Save({2, 4, 6}, /*keep=*/2);
  ASSERT_EQ(reports.size(), 3u);
  ASSERT_EQ(reports[2].pruned_size(), 1);
  for (auto& info : reports) {
    info.clear_pruned();  // the report of the prune never came
    ASSERT_TRUE(catalog.RecordCommitted("job-1", info).ok());
  }
  fs::remove_all(engine::CheckpointPath(dir_, 4));
  auto listed = ByStep(catalog, false);
  EXPECT_EQ(listed[2].status(), kCheckpointPruned);
  EXPECT_EQ(listed[4].status(), kCheckpointMissing);
  EXPECT_EQ(listed[6].status(), kCheckpointCommitted);
}

TEST_F(CheckpointCatalogTest, RankReportMarksCorruptAndUnknownPathsAreAdded) {
  CheckpointCatalog catalog(store_.get(), nullptr);
  const std::vector<loom::v1::CheckpointInfo> reports = Save({2, 4}, /*keep=*/0);
  ASSERT_EQ(reports.size(), 2u);
  for (const auto& info : reports) ASSERT_TRUE(catalog.RecordCommitted("job-1", info).ok());

  loom::v1::CheckpointInfo corrupt;
  corrupt.set_step(4);
  corrupt.set_path(engine::CheckpointPath(dir_, 4));
  corrupt.set_status("corrupt");
  corrupt.set_error("MANIFEST.json: no manifest_crc32c line");
  corrupt.set_corrupt_file(corrupt.path() + "/MANIFEST.json");
  corrupt.set_failed_check("manifest_crc32c");
  ASSERT_TRUE(catalog.MarkCorrupt("job-1", corrupt).ok());
  // A checkpoint the catalog never heard of (its commit report was lost).
  loom::v1::CheckpointInfo stray = corrupt;
  stray.set_step(9);
  stray.set_path(engine::CheckpointPath(dir_, 9));
  ASSERT_TRUE(catalog.MarkCorrupt("job-1", stray).ok());

  auto listed = ByStep(catalog, false);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[2].status(), kCheckpointCommitted);
  EXPECT_EQ(listed[4].status(), kCheckpointCorrupt);
  EXPECT_EQ(listed[4].failed_check(), "manifest_crc32c");
  EXPECT_EQ(listed[4].corrupt_file(), corrupt.corrupt_file());
  EXPECT_EQ(listed[4].bytes(), reports[1].bytes());  // the entry, not a new one
  EXPECT_EQ(listed[9].status(), kCheckpointCorrupt);
  // The corrupt one is not a restart target: the next good one is.
  EXPECT_EQ(*catalog.NewestGood("job-1", -1), 2);

  // Without a verifier, --verify cannot run.
  EXPECT_EQ(catalog.Verify("job-1").status().code(), absl::StatusCode::kFailedPrecondition);
}

// A worker's report that a checkpoint is also in the object store: the
// entry keeps its local status and gains the remote copy, which a retried
// commit report does not erase, and which keeps a checkpoint whose
// directory is gone restorable (NewestGood), unless it is corrupt.
TEST_F(CheckpointCatalogTest, UploadedCopyIsRecordedAndKeepsALostCheckpointRestorable) {
  CheckpointCatalog catalog(store_.get(), nullptr);
  const std::vector<loom::v1::CheckpointInfo> reports = Save({2, 4}, /*keep=*/5);
  ASSERT_EQ(reports.size(), 2u);
  for (const auto& info : reports) ASSERT_TRUE(catalog.RecordCommitted("job-1", info).ok());
  loom::v1::CheckpointInfo uploaded = reports[1];
  uploaded.set_status(kCheckpointUploaded);
  uploaded.set_remote_url("s3://bucket/runs/job-1/step-000000004");
  uploaded.set_upload_seconds(0.5);
  ASSERT_TRUE(catalog.RecordUploaded("job-1", uploaded).ok());
  ASSERT_TRUE(catalog.RecordCommitted("job-1", reports[1]).ok());  // a retried report
  auto listed = ByStep(catalog, false);
  EXPECT_EQ(listed[4].status(), kCheckpointCommitted);
  EXPECT_EQ(listed[4].remote_url(), "s3://bucket/runs/job-1/step-000000004");
  EXPECT_DOUBLE_EQ(listed[4].upload_seconds(), 0.5);
  EXPECT_TRUE(listed[2].remote_url().empty());

  fs::remove_all(dir_);  // every local copy lost
  listed = ByStep(catalog, false);
  EXPECT_EQ(listed[2].status(), kCheckpointMissing);
  EXPECT_EQ(listed[4].status(), kCheckpointMissing);
  EXPECT_EQ(*catalog.NewestGood("job-1", -1), 4);  // from the store
  EXPECT_EQ(*catalog.NewestGood("job-1", 3), 0);   // step 2 is on no tier

  // An upload whose commit report was lost is entered from its own report.
  loom::v1::CheckpointInfo orphan;
  orphan.set_step(8);
  orphan.set_path(engine::CheckpointPath(dir_, 8));
  orphan.set_status(kCheckpointUploaded);
  orphan.set_remote_url("s3://bucket/runs/job-1/step-000000008");
  ASSERT_TRUE(catalog.RecordUploaded("job-1", orphan).ok());
  EXPECT_EQ(ByStep(catalog, false)[8].remote_url(), orphan.remote_url());
  EXPECT_EQ(*catalog.NewestGood("job-1", -1), 8);

  // Corrupt is for good, whatever tier.
  loom::v1::CheckpointInfo corrupt = orphan;
  corrupt.set_status(kCheckpointCorrupt);
  corrupt.set_failed_check("sha256");
  ASSERT_TRUE(catalog.MarkCorrupt("job-1", corrupt).ok());
  EXPECT_EQ(*catalog.NewestGood("job-1", -1), 4);
}

// What the next rank 0 is asked to upload: committed checkpoints with no
// copy in the store, newest first, bounded; not the uploaded, nor the
// corrupt, nor those whose remote copy retention deleted.
TEST_F(CheckpointCatalogTest, PendingUploadsAreTheCommittedWithoutARemoteCopyNewestFirst) {
  CheckpointCatalog catalog(store_.get(), nullptr);
  const std::vector<loom::v1::CheckpointInfo> reports = Save({2, 4, 6, 8, 10}, /*keep=*/5);
  ASSERT_EQ(reports.size(), 5u);
  for (const auto& info : reports) ASSERT_TRUE(catalog.RecordCommitted("job-1", info).ok());
  loom::v1::CheckpointInfo uploaded = reports[4];
  uploaded.set_status(kCheckpointUploaded);
  uploaded.set_remote_url("s3://bucket/runs/job-1/step-000000010");
  ASSERT_TRUE(catalog.RecordUploaded("job-1", uploaded).ok());
  loom::v1::CheckpointInfo corrupt = reports[3];
  corrupt.set_status(kCheckpointCorrupt);
  corrupt.set_failed_check("sha256");
  ASSERT_TRUE(catalog.MarkCorrupt("job-1", corrupt).ok());
  std::vector<int64_t> steps;
  for (const auto& c : catalog.PendingUploads("job-1", 16)) steps.push_back(c.step());
  EXPECT_THAT(steps, ::testing::ElementsAre(6, 4, 2));
  ASSERT_EQ(catalog.PendingUploads("job-1", 2).size(), 2u);
  EXPECT_EQ(catalog.PendingUploads("job-1", 2)[0].path(), reports[2].path());
  EXPECT_TRUE(catalog.PendingUploads("job-2", 16).empty());
}

TEST(CheckpointVerifierTest, RefusesAPathThatNamesNoCheckpoint) {
  FileCheckpointVerifier verifier;
  auto outcome = verifier.Verify("/c/not-a-checkpoint");
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(outcome.status().message()), HasSubstr("/c/not-a-checkpoint"));
  // A step directory that is gone verifies as missing its manifest.
  auto gone = verifier.Verify("/nonexistent/step-000000002");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_FALSE(gone->ok);
  EXPECT_EQ(gone->check, "missing");
  EXPECT_EQ(gone->file, "/nonexistent/step-000000002/MANIFEST.json");
}

}  // namespace
}  // namespace loom::controller
