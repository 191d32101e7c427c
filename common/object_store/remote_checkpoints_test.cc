// Checkpoints uploaded to and restored from a real S3-compatible store
// (Ceph's RADOS Gateway on loopback).
#include "common/object_store/remote_checkpoints.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/object_store/s3_test_server.h"
#include "common/object_store/test_checkpoint.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::object_store {
namespace {

using engine::CheckpointManifest;
using engine::ManifestFile;
using ::testing::HasSubstr;

constexpr char kBucket[] = "ckpt-test";

class RemoteCheckpointsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = S3TestServer::Start(kBucket);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/remote-ckpt-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/local");
    std::filesystem::create_directories(root_ + "/restored");
    job_ =
        *ParseS3Url(absl::StrCat("s3://", kBucket, "/runs/",
                                 ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    options_.part_bytes = 5 << 20;  // S3's smallest part: the big shard goes in three
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string WriteCheckpoint(int64_t step, int64_t generation,
                              const std::vector<size_t>& shard_bytes,
                              std::optional<double> val_loss = std::nullopt) {
    return WriteTestCheckpoint(root_ + "/local", step, generation, shard_bytes, val_loss);
  }

  static S3TestServer* server_;
  std::string root_;
  S3Location job_;
  TransferOptions options_;
};
S3TestServer* RemoteCheckpointsTest::server_ = nullptr;

TEST_F(RemoteCheckpointsTest, UploadThenRestoreGivesTheSameFilesThatVerify) {
  S3Client client(server_->Config());
  const std::string dir = WriteCheckpoint(200, 0, {(11 << 20) + 4096, 70000});
  auto up = UploadCheckpoint(client, job_, dir, options_);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->step, 200);
  EXPECT_EQ(up->objects, 3);
  EXPECT_EQ(up->bytes, (11u << 20) + 4096 + 70000);
  EXPECT_EQ(up->url, job_.Url() + "/step-000000200");

  // What the store holds: each file, and a manifest that adds their SHA-256.
  auto objects = client.ListObjects(kBucket, job_.prefix);
  ASSERT_TRUE(objects.ok()) << objects.status();
  ASSERT_EQ(objects->size(), 3u);
  auto remote_manifest = client.GetObject(kBucket, job_.prefix + "step-000000200/MANIFEST.json");
  ASSERT_TRUE(remote_manifest.ok());
  auto parsed = engine::ParseManifest(*remote_manifest, "remote");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const ManifestFile& f : parsed->files) {
    auto local_sha = Sha256File(dir + "/" + f.name);
    ASSERT_TRUE(local_sha.ok());
    EXPECT_EQ(f.sha256, *local_sha) << f.name;
  }

  auto listed = ListRemoteCheckpoints(client, job_);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].step, 200);
  auto down = DownloadCheckpoint(client, (*listed)[0], root_ + "/restored", options_);
  ASSERT_TRUE(down.ok()) << down.status();
  const std::string restored = root_ + "/restored/step-000000200";
  for (const ManifestFile& f : parsed->files) {
    EXPECT_EQ(*ReadFile(restored + "/" + f.name), *ReadFile(dir + "/" + f.name)) << f.name;
  }
  engine::CheckpointEntry entry;
  ASSERT_TRUE(engine::CheckpointEntryOfPath(restored, &entry));
  auto verified = engine::VerifyCheckpoint(entry);
  EXPECT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(engine::ListCheckpoints(root_ + "/restored").size(), 1u);

  auto again = DownloadCheckpoint(client, (*listed)[0], root_ + "/restored", options_);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(RemoteCheckpointsTest, CorruptLocalFileIsNeverUploaded) {
  S3Client client(server_->Config());
  const std::string dir = WriteCheckpoint(300, 0, {(6 << 20) + 10});
  {
    std::fstream f(dir + "/shard-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(6 << 20);
    f.put('\x5a');
  }
  auto up = UploadCheckpoint(client, job_, dir, options_);
  ASSERT_EQ(up.status().code(), absl::StatusCode::kDataLoss) << up.status();
  EXPECT_THAT(up.status().message(), HasSubstr("shard-00000.bin: crc32c does not match"));
  EXPECT_THAT(up.status().message(), HasSubstr("not uploaded"));
  auto objects = client.ListObjects(kBucket, job_.prefix);
  ASSERT_TRUE(objects.ok());
  EXPECT_TRUE(objects->empty());  // no manifest, and the multipart upload aborted
  auto listed = ListRemoteCheckpoints(client, job_);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
}

TEST_F(RemoteCheckpointsTest, ChangedRemoteObjectIsCaughtBeforeAnythingIsRestored) {
  S3Client client(server_->Config());
  const std::string dir = WriteCheckpoint(400, 0, {100000});
  ASSERT_TRUE(UploadCheckpoint(client, job_, dir, options_).ok());
  // Same size, one byte different: only the checksums can tell.
  std::string changed = *ReadFile(dir + "/shard-00000.bin");
  changed[5000] ^= 1;
  ASSERT_TRUE(
      client.PutObject(kBucket, job_.prefix + "step-000000400/shard-00000.bin", changed).ok());
  auto listed = ListRemoteCheckpoints(client, job_);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  auto down = DownloadCheckpoint(client, (*listed)[0], root_ + "/restored", options_);
  ASSERT_EQ(down.status().code(), absl::StatusCode::kDataLoss) << down.status();
  EXPECT_THAT(down.status().message(), HasSubstr("step-000000400/shard-00000.bin: sha256"));
  EXPECT_TRUE(std::filesystem::is_empty(root_ + "/restored"));  // no step, no temporary
}

// A file larger than a part comes down as ranged GETs at once: a byte
// changed in its middle part, the object made longer, or shorter, than the
// manifest says is caught, and nothing is restored.
TEST_F(RemoteCheckpointsTest, ARangedRestoreCatchesAChangedLongerOrShorterObject) {
  S3Client client(server_->Config());
  const std::string dir = WriteCheckpoint(500, 0, {(12 << 20) + 77});
  ASSERT_TRUE(UploadCheckpoint(client, job_, dir, options_).ok());
  const std::string key = job_.prefix + "step-000000500/shard-00000.bin";
  const std::string good = *ReadFile(dir + "/shard-00000.bin");
  auto listed = ListRemoteCheckpoints(client, job_);
  ASSERT_TRUE(listed.ok() && listed->size() == 1u);
  std::string changed = good;
  changed[(7 << 20) + 3] ^= 1;  // the second of three parts
  std::string longer = good + "x";
  std::string shorter = good.substr(0, good.size() - 100);
  for (const auto& [what, body] : std::vector<std::pair<std::string, std::string>>{
           {"sha256", changed}, {"the manifest says", longer}, {"shorter than", shorter}}) {
    ASSERT_TRUE(client.PutObject(kBucket, key, body).ok());
    auto down = DownloadCheckpoint(client, (*listed)[0], root_ + "/restored", options_);
    ASSERT_EQ(down.status().code(), absl::StatusCode::kDataLoss) << what << ": " << down.status();
    EXPECT_THAT(down.status().message(), HasSubstr(what));
    EXPECT_TRUE(std::filesystem::is_empty(root_ + "/restored")) << what;
  }
  ASSERT_TRUE(client.PutObject(kBucket, key, good).ok());
  auto down = DownloadCheckpoint(client, (*listed)[0], root_ + "/restored", options_);
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(*ReadFile(root_ + "/restored/step-000000500/shard-00000.bin"), good);
}

TEST_F(RemoteCheckpointsTest, ListsWholeCheckpointsOnlyInLineageOrder) {
  S3Client client(server_->Config());
  ASSERT_TRUE(UploadCheckpoint(client, job_, WriteCheckpoint(100, 0, {1000}), options_).ok());
  ASSERT_TRUE(UploadCheckpoint(client, job_, WriteCheckpoint(150, 0, {1000}), options_).ok());
  ASSERT_TRUE(UploadCheckpoint(client, job_, WriteCheckpoint(120, 1, {1000}), options_).ok());
  // A checkpoint whose manifest never arrived (an upload cut short).
  ASSERT_TRUE(client.PutObject(kBucket, job_.prefix + "step-000000500/shard-00000.bin", "x").ok());
  // And a manifest that does not read.
  ASSERT_TRUE(client.PutObject(kBucket, job_.prefix + "step-000000600/MANIFEST.json", "{}").ok());
  std::vector<std::string> unreadable;
  auto listed = ListRemoteCheckpoints(client, job_, &unreadable);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[0].step, 120);  // generation 1 first
  EXPECT_EQ((*listed)[1].step, 150);
  EXPECT_EQ((*listed)[2].step, 100);
  ASSERT_EQ(unreadable.size(), 1u);
  EXPECT_THAT(unreadable[0], HasSubstr("step-000000600/MANIFEST.json"));
}

// Retention in the store: a dry run says what would go and deletes nothing;
// applied, it deletes those (manifest first, then every object under them),
// keeps the rules' and the guards' checkpoints, and an independent listing
// sees exactly the kept ones.
TEST_F(RemoteCheckpointsTest, RetentionDeletesWhatItsRulesDoNotKeepAndNothingInADryRun) {
  S3Client client(server_->Config());
  // Steps 10..80; validation loss lowest at 30.
  for (int64_t step = 10; step <= 80; step += 10) {
    const double val_loss = step == 30 ? 1.0 : 2.0 + 0.01 * static_cast<double>(step);
    ASSERT_TRUE(
        UploadCheckpoint(client, job_, WriteCheckpoint(step, 0, {3000, 2000}, val_loss), options_)
            .ok());
  }
  RemoteRetention retention;
  retention.policy.all = false;
  retention.policy.newest = 2;
  retention.policy.every = 40;
  retention.policy.best = 1;
  retention.held[10] = "init_from of other-3";
  auto dry = PruneRemoteCheckpoints(client, job_, retention, /*apply=*/false);
  ASSERT_TRUE(dry.ok()) << dry.status();
  ASSERT_EQ(dry->size(), 8u);
  std::vector<int64_t> going;
  for (const engine::RetentionVerdict& v : *dry) {
    if (!v.keep) going.push_back(v.checkpoint.step);
  }
  EXPECT_THAT(going, ::testing::ElementsAre(60, 50, 20));
  EXPECT_EQ((*dry)[0].checkpoint.name, RemoteCheckpointLocation(job_, 80).Url());
  EXPECT_EQ(ListRemoteCheckpoints(client, job_)->size(), 8u);  // the dry run deleted nothing

  auto applied = PruneRemoteCheckpoints(client, job_, retention, /*apply=*/true);
  ASSERT_TRUE(applied.ok()) << applied.status();
  std::vector<int64_t> listed;
  auto after = ListRemoteCheckpoints(client, job_);
  ASSERT_TRUE(after.ok()) << after.status();
  for (const RemoteCheckpoint& rc : *after) listed.push_back(rc.step);
  EXPECT_THAT(listed, ::testing::ElementsAre(80, 70, 40, 30, 10));
  // No object of a deleted checkpoint is left behind.
  auto objects = client.ListObjects(kBucket, RemoteCheckpointLocation(job_, 50).prefix);
  ASSERT_TRUE(objects.ok()) << objects.status();
  EXPECT_TRUE(objects->empty());
  for (const engine::RetentionVerdict& v : *applied) {
    if (v.checkpoint.step == 10) EXPECT_EQ(v.reason, "init_from of other-3");
    if (v.checkpoint.step == 30) EXPECT_THAT(v.reason, HasSubstr("best 1 by validation loss"));
  }
}

// One checkpoint by its location (init_from in the store): fetched exactly,
// not read again when a verified copy is there, and a location with no
// whole checkpoint is NOT_FOUND naming it.
TEST_F(RemoteCheckpointsTest, FetchesOneCheckpointByItsLocation) {
  S3Client client(server_->Config());
  ASSERT_TRUE(UploadCheckpoint(client, job_, WriteCheckpoint(200, 0, {3000}), options_).ok());
  ASSERT_TRUE(UploadCheckpoint(client, job_, WriteCheckpoint(300, 1, {3000}), options_).ok());
  const std::string url = RemoteCheckpointLocation(job_, 200).Url();
  auto got = FetchCheckpoint(client, url, root_ + "/restored/init-from");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 200);
  EXPECT_EQ(got->objects, 2);
  const std::string local = engine::CheckpointPath(root_ + "/restored/init-from", 200);
  EXPECT_TRUE(engine::VerifyCheckpoint({200, local, 0, false}).ok());
  auto again = FetchCheckpoint(client, url + "/", root_ + "/restored/init-from");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->objects, 0);  // the verified copy is used as it is

  auto missing = FetchCheckpoint(client, RemoteCheckpointLocation(job_, 250).Url(), root_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("step-000000250 has no MANIFEST.json"));
  S3Location parsed;
  EXPECT_EQ(ParseCheckpointUrl(job_.Url(), &parsed).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ParseCheckpointUrl(url, &parsed).ok());
  EXPECT_EQ(parsed.Url(), job_.Url());
}

TEST_F(RemoteCheckpointsTest, UnreachableStoreFailsTheUploadWithTheObjectNamed) {
  S3Config config = server_->Config();
  config.endpoint = "http://127.0.0.1:1";
  S3ClientOptions o;
  o.max_attempts = 2;
  o.initial_backoff = absl::Milliseconds(10);
  S3Client client(config, o);
  auto up = UploadCheckpoint(client, job_, WriteCheckpoint(700, 0, {1000}), options_);
  ASSERT_EQ(up.status().code(), absl::StatusCode::kUnavailable) << up.status();
  EXPECT_THAT(up.status().message(), HasSubstr("step-000000700/shard-00000.bin"));
}

}  // namespace
}  // namespace loom::object_store
