// The worker's background upload against a real S3-compatible store
// (Ceph's RADOS Gateway on loopback).
#include "worker/checkpoint_uploader.h"

#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/object_store/s3_test_server.h"
#include "common/object_store/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/netns_lab.h"

namespace loom::worker {
namespace {

using ::testing::HasSubstr;

constexpr char kBucket[] = "uploads";

struct Outcome {
  std::string job;
  int64_t generation;
  loom::v1::CheckpointInfo info;
};

class CheckpointUploaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = object_store::S3TestServer::Start(kBucket);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    dir_ = absl::StrCat(::testing::TempDir(), "/uploader-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  CheckpointUploader::Options Options(object_store::S3Config config) {
    CheckpointUploader::Options o;
    o.uploader = "worker on node test-node";
    o.config = [config] { return config; };
    o.client.max_attempts = 2;
    o.client.initial_backoff = absl::Milliseconds(10);
    return o;
  }
  CheckpointUploader::Report Collect() {
    return [this](const std::string& job, int64_t generation, const loom::v1::CheckpointInfo& c) {
      std::lock_guard<std::mutex> lock(mu_);
      outcomes_.push_back({job, generation, c});
    };
  }
  loom::v1::CheckpointInfo Committed(int64_t step, size_t bytes = 50000) {
    loom::v1::CheckpointInfo c;
    c.set_step(step);
    c.set_generation(0);
    c.set_path(object_store::WriteTestCheckpoint(dir_, step, 0, {bytes}));
    return c;
  }

  // Until the backlog has gone up (bounded: 20 s; its tries are 0.3 s,
  // 0.6 s, 1.2 s, ... apart in these tests) and nothing is due.
  static void DrainBacklog(CheckpointUploader& up) {
    for (int i = 0; i < 200 && up.Backlog() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    up.WaitIdle();
  }

  static object_store::S3TestServer* server_;
  std::string dir_;
  std::mutex mu_;
  std::vector<Outcome> outcomes_;
};

object_store::S3TestServer* CheckpointUploaderTest::server_ = nullptr;

TEST_F(CheckpointUploaderTest, UploadsNewestFirstAndReportsEach) {
  CheckpointUploader up(Options(server_->Config()), Collect());
  const std::string remote = absl::StrCat("s3://", kBucket, "/runs/job-1");
  up.Enqueue("job-1", 3, Committed(10), {remote});
  up.Enqueue("job-1", 3, Committed(20), {remote});
  up.Enqueue("job-1", 3, Committed(30), {remote});
  up.WaitIdle();
  ASSERT_EQ(outcomes_.size(), 3u);
  for (const Outcome& o : outcomes_) {
    EXPECT_EQ(o.job, "job-1");
    EXPECT_EQ(o.generation, 3);
    EXPECT_EQ(o.info.status(), "uploaded") << o.info.error();
    EXPECT_EQ(
        o.info.remote_url(),
        absl::StrCat(remote, "/step-", std::string(9 - std::to_string(o.info.step()).size(), '0'),
                     o.info.step()));
    EXPECT_EQ(o.info.bytes(), 50000u);
  }
  object_store::S3Client client(server_->Config());
  auto listed = object_store::ListRemoteCheckpoints(client, *object_store::ParseS3Url(remote));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 3u);
}

// The same checkpoint handed over twice (the next attempt's rank 0 is told
// of one this worker still has queued) is uploaded once.
// (Held in an outage's backlog, so that it is certainly still queued.)
TEST_F(CheckpointUploaderTest, ACheckpointQueuedTwiceIsUploadedOnce) {
  ASSERT_TRUE(server_->Kill().ok());
  CheckpointUploader::Options o = Options(server_->Config());
  o.backlog_retry = absl::Seconds(1);
  CheckpointUploader up(o, Collect());
  const std::string remote = absl::StrCat("s3://", kBucket, "/runs/job-7");
  const loom::v1::CheckpointInfo c = Committed(10);
  up.Enqueue("job-7", 0, c, {remote});
  up.WaitIdle();
  up.Enqueue("job-7", 1, c, {remote});
  EXPECT_EQ(up.Backlog(), 1u);
  ASSERT_TRUE(server_->Restart().ok());
  DrainBacklog(up);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(outcomes_.size(), 2u);  // the outage's failure, then one upload
  EXPECT_EQ(outcomes_[0].info.status(), "upload_failed");
  EXPECT_EQ(outcomes_[1].info.status(), "uploaded") << outcomes_[1].info.error();
}

// The store's retention runs after each upload: what it deleted comes with
// the "uploaded" outcome (tier "remote", its location and reason), and the
// store keeps what the policy says.
TEST_F(CheckpointUploaderTest, EachUploadPrunesTheStoreByItsRetentionAndSaysWhatWent) {
  CheckpointUploader up(Options(server_->Config()), Collect());
  CheckpointUploader::RemoteTier tier;
  tier.url = absl::StrCat("s3://", kBucket, "/runs/job-6");
  tier.retention.policy.all = false;
  tier.retention.policy.newest = 2;
  for (int64_t step : {10, 20, 30, 40}) {
    up.Enqueue("job-6", 0, Committed(step), tier);
    up.WaitIdle();  // one at a time, as a run's checkpoints come
  }
  ASSERT_EQ(outcomes_.size(), 4u);
  std::vector<int64_t> pruned;
  for (const Outcome& o : outcomes_) {
    EXPECT_EQ(o.info.status(), "uploaded") << o.info.error();
    for (const loom::v1::PrunedCheckpoint& p : o.info.pruned()) {
      EXPECT_EQ(p.tier(), "remote");
      EXPECT_EQ(p.reason(), "not among the newest 2");
      EXPECT_EQ(p.path(), absl::StrCat(tier.url, "/step-0000000", p.step()));
      pruned.push_back(p.step());
    }
  }
  EXPECT_THAT(pruned, ::testing::ElementsAre(10, 20));
  object_store::S3Client client(server_->Config());
  auto listed = object_store::ListRemoteCheckpoints(client, *object_store::ParseS3Url(tier.url));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].step, 40);
  EXPECT_EQ((*listed)[1].step, 30);
}

TEST_F(CheckpointUploaderTest, RefusedCredentialsAreReportedNamingTheBucket) {
  object_store::S3Config config = server_->Config();
  config.access_key_id = "SOMEONE";
  config.credentials_source = "environment (AWS_ACCESS_KEY_ID)";
  CheckpointUploader up(Options(config), Collect());
  up.Enqueue("job-2", 0, Committed(10), {absl::StrCat("s3://", kBucket, "/runs/job-2")});
  up.WaitIdle();
  ASSERT_EQ(outcomes_.size(), 1u);
  const loom::v1::CheckpointInfo& c = outcomes_[0].info;
  EXPECT_EQ(c.status(), "upload_failed");
  EXPECT_THAT(c.error(), HasSubstr("worker on node test-node"));
  EXPECT_THAT(c.error(), HasSubstr("step-000000010/shard-00000.bin"));
  EXPECT_THAT(c.error(), HasSubstr("bucket \"uploads\""));
  EXPECT_TRUE(c.remote_url().empty());
}

TEST_F(CheckpointUploaderTest, NoCredentialsIsAFailureNotARetryLoop) {
  CheckpointUploader::Options o = Options(server_->Config());
  o.config = [] {
    return object_store::S3ConfigFromEnvironment(
        [](const char*) -> std::optional<std::string> { return std::nullopt; });
  };
  CheckpointUploader up(o, Collect());
  up.Enqueue("job-3", 0, Committed(10), {absl::StrCat("s3://", kBucket, "/runs/job-3")});
  up.WaitIdle();
  ASSERT_EQ(outcomes_.size(), 1u);
  EXPECT_EQ(outcomes_[0].info.status(), "upload_failed");
  EXPECT_THAT(outcomes_[0].info.error(), HasSubstr("no object-store credentials"));
}

TEST_F(CheckpointUploaderTest, ACheckpointRetentionDeletedFirstIsSkipped) {
  CheckpointUploader up(Options(server_->Config()), Collect());
  loom::v1::CheckpointInfo gone = Committed(10);
  std::filesystem::remove_all(gone.path());
  up.Enqueue("job-4", 0, gone, {absl::StrCat("s3://", kBucket, "/runs/job-4")});
  up.WaitIdle();
  EXPECT_TRUE(outcomes_.empty());
}

// An outage: the first checkpoint it keeps back is reported failed (after
// the client's bounded retries), the rest wait in silence, and when the
// store is back the backlog goes up, newest first.
TEST_F(CheckpointUploaderTest, AnOutagesBacklogCatchesUpNewestFirstWhenTheStoreReturns) {
  ASSERT_TRUE(server_->Kill().ok());
  CheckpointUploader::Options o = Options(server_->Config());
  o.backlog_retry = absl::Milliseconds(300);
  CheckpointUploader up(o, Collect());
  const std::string remote = absl::StrCat("s3://", kBucket, "/runs/job-5");
  up.Enqueue("job-5", 0, Committed(10), {remote});
  up.WaitIdle();
  up.Enqueue("job-5", 0, Committed(20), {remote});
  up.WaitIdle();
  EXPECT_EQ(up.Backlog(), 2u);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_EQ(outcomes_.size(), 1u);
    EXPECT_EQ(outcomes_[0].info.status(), "upload_failed");
    EXPECT_EQ(outcomes_[0].info.step(), 10);
    EXPECT_THAT(outcomes_[0].info.error(), HasSubstr("after 2 tries"));
    EXPECT_THAT(outcomes_[0].info.error(), HasSubstr("step-000000010/shard-00000.bin"));
  }
  ASSERT_TRUE(server_->Restart().ok());
  DrainBacklog(up);
  EXPECT_EQ(up.Backlog(), 0u);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(outcomes_.size(), 3u);
  EXPECT_EQ(outcomes_[1].info.status(), "uploaded");
  EXPECT_EQ(outcomes_[1].info.step(), 20);  // newest first
  EXPECT_THAT(outcomes_[1].info.upload_note(), HasSubstr("from the backlog after"));
  EXPECT_EQ(outcomes_[2].info.status(), "uploaded");
  EXPECT_EQ(outcomes_[2].info.step(), 10);
}

// A slow store: the gateway in a network namespace of its own, reached from
// another through veths whose sending rate the test sets with tc (a token
// bucket; this kernel has no netem). The test's thread (and the uploader's,
// which it starts) runs in the client's namespace.
class SlowStoreTest : public CheckpointUploaderTest {
 protected:
  static void SetUpTestSuite() {
    auto lab = loom::testing::NetnsLab::Create(2, "s3");
    ASSERT_TRUE(lab.ok()) << lab.status();
    lab_ = lab->release();
    auto inside = lab_->Enter(0);
    ASSERT_TRUE(inside.ok()) << inside.status();
    inside_ = inside->release();
    object_store::S3TestServer::Options o;
    o.prefix = lab_->prefix(1);
    o.address = lab_->address(1);
    auto s = object_store::S3TestServer::Start(kBucket, o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    CheckpointUploaderTest::TearDownTestSuite();
    delete inside_;
    inside_ = nullptr;
    delete lab_;
    lab_ = nullptr;
  }
  void TearDown() override {
    if (lab_ != nullptr) (void)lab_->Unthrottle(0);
    CheckpointUploaderTest::TearDown();
  }
  // A slow request fails after 2 s under 32 KB/s (the worker's
  // --upload_min_kbps and --upload_slow_for).
  CheckpointUploader::Options SlowOptions() {
    CheckpointUploader::Options o = Options(server_->Config());
    o.client.low_speed_bytes = 32000;
    o.client.low_speed_time = absl::Seconds(2);
    o.backlog_retry = absl::Milliseconds(300);
    return o;
  }

  static loom::testing::NetnsLab* lab_;
  static loom::testing::NetnsLab::Inside* inside_;
};

loom::testing::NetnsLab* SlowStoreTest::lab_ = nullptr;
loom::testing::NetnsLab::Inside* SlowStoreTest::inside_ = nullptr;

// Slower than the floor: each try ends after the stated time with libcurl's
// account of it, the bounded tries end in one reported failure (the store's
// answer, the object, who), training's later checkpoints wait in the
// backlog, and when the link is fast again the backlog goes up newest first
// and says it came from the backlog.
TEST_F(SlowStoreTest, AStoreSlowerThanTheFloorIsAnOutageThatTheBacklogCatchesUpAfter) {
  ASSERT_TRUE(lab_->Throttle(0, 64).ok());  // 8 KB/s from the client
  CheckpointUploader up(SlowOptions(), Collect());
  const std::string remote = absl::StrCat("s3://", kBucket, "/runs/slow-1");
  up.Enqueue("slow-1", 0, Committed(10, 400000), {remote});
  up.WaitIdle();
  up.Enqueue("slow-1", 0, Committed(20, 400000), {remote});
  up.WaitIdle();
  EXPECT_EQ(up.Backlog(), 2u);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_EQ(outcomes_.size(), 1u);
    const loom::v1::CheckpointInfo& c = outcomes_[0].info;
    EXPECT_EQ(c.status(), "upload_failed");
    EXPECT_EQ(c.step(), 10);
    EXPECT_THAT(c.error(), HasSubstr("worker on node test-node"));
    EXPECT_THAT(c.error(), HasSubstr("step-000000010/shard-00000.bin"));
    EXPECT_THAT(c.error(), HasSubstr("Operation too slow"));
    EXPECT_THAT(c.error(), HasSubstr("after 2 tries"));
  }
  object_store::S3Client client(server_->Config());
  auto listed = object_store::ListRemoteCheckpoints(client, *object_store::ParseS3Url(remote));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());  // nothing half-uploaded is listed

  ASSERT_TRUE(lab_->Unthrottle(0).ok());
  DrainBacklog(up);
  EXPECT_EQ(up.Backlog(), 0u);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(outcomes_.size(), 3u);
  EXPECT_EQ(outcomes_[1].info.step(), 20);
  EXPECT_EQ(outcomes_[2].info.step(), 10);
  for (int i : {1, 2}) {
    EXPECT_EQ(outcomes_[i].info.status(), "uploaded") << outcomes_[i].info.error();
    EXPECT_THAT(outcomes_[i].info.upload_note(), HasSubstr("from the backlog after"));
  }
  listed = object_store::ListRemoteCheckpoints(client, *object_store::ParseS3Url(remote));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 2u);
}

// Slow but above the floor: the upload takes as long as the link makes it
// (400 KB at 250 KB/s), and goes through at the first try.
TEST_F(SlowStoreTest, AStoreSlowButAboveTheFloorTakesTheUpload) {
  ASSERT_TRUE(lab_->Throttle(0, 2000).ok());
  CheckpointUploader up(SlowOptions(), Collect());
  up.Enqueue("slow-2", 0, Committed(10, 400000), {absl::StrCat("s3://", kBucket, "/runs/slow-2")});
  up.WaitIdle();
  ASSERT_EQ(outcomes_.size(), 1u);
  const loom::v1::CheckpointInfo& c = outcomes_[0].info;
  EXPECT_EQ(c.status(), "uploaded") << c.error();
  EXPECT_TRUE(c.upload_note().empty());
  // The link was the bound: 400 KB cannot cross 250 KB/s in under 1.2 s.
  EXPECT_GE(c.upload_seconds(), 1.2);
}

}  // namespace
}  // namespace loom::worker
