// The client against a real S3-compatible store (Ceph's RADOS Gateway on
// loopback), which checks every signature and payload hash.
#include "common/object_store/s3_client.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/object_store/s3_test_server.h"
#include "common/object_store/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::object_store {
namespace {

using ::testing::HasSubstr;

constexpr char kBucket[] = "loom-test";

class S3ClientTest : public ::testing::Test {
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
  static S3ClientOptions Quick() {
    S3ClientOptions o;
    o.max_attempts = 3;
    o.initial_backoff = absl::Milliseconds(20);
    return o;
  }
  static S3TestServer* server_;
};
S3TestServer* S3ClientTest::server_ = nullptr;

TEST(UriEncodeTest, KeepsUnreservedAndSlashes) {
  EXPECT_EQ(UriEncode("a/b c+d~e_f.g-h", false), "a/b%20c%2Bd~e_f.g-h");
  EXPECT_EQ(UriEncode("a/b", true), "a%2Fb");
  EXPECT_EQ(UriEncode("\xC3\xA9", false), "%C3%A9");
}

TEST(XmlTest, ValuesAndBlocks) {
  const std::string xml =
      "<R><Contents><Key>a&amp;b</Key><Size>3</Size></Contents>"
      "<Contents><Key>c</Key></Contents><IsTruncated>false</IsTruncated></R>";
  EXPECT_EQ(XmlBlocks(xml, "Contents").size(), 2u);
  EXPECT_EQ(XmlValue(xml, "Key"), "a&b");
  EXPECT_EQ(XmlValue(xml, "IsTruncated"), "false");
  EXPECT_EQ(XmlValue(xml, "Missing"), "");
}

TEST_F(S3ClientTest, PutGetHeadListDelete) {
  S3Client c(server_->Config(), Quick());
  const std::string body = TestBytes(100000, 1);
  ASSERT_TRUE(c.PutObject(kBucket, "dir/a b+c.bin", body).ok());
  ASSERT_TRUE(c.PutObject(kBucket, "dir/empty", "").ok());
  ASSERT_TRUE(c.PutObject(kBucket, "other/x", "x").ok());
  auto got = c.GetObject(kBucket, "dir/a b+c.bin");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, body);
  auto head = c.HeadObject(kBucket, "dir/a b+c.bin");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, body.size());
  EXPECT_FALSE(head->etag.empty());
  auto list = c.ListObjects(kBucket, "dir/");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].key, "dir/a b+c.bin");
  EXPECT_EQ((*list)[0].size, body.size());
  EXPECT_EQ((*list)[1].key, "dir/empty");
  EXPECT_EQ((*list)[1].size, 0u);
  ASSERT_TRUE(c.DeleteObject(kBucket, "dir/a b+c.bin").ok());
  ASSERT_TRUE(c.DeleteObject(kBucket, "dir/a b+c.bin").ok());  // S3: gone is fine
  EXPECT_EQ(c.GetObject(kBucket, "dir/a b+c.bin").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.HeadObject(kBucket, "dir/a b+c.bin").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(S3ClientTest, ListingPagesThroughMoreThanOnePage) {
  S3Client c(server_->Config(), Quick());
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(c.PutObject(kBucket, absl::StrCat("many/", 10 + i), "").ok());
  }
  auto list = c.ListObjects(kBucket, "many/", /*page_size=*/3);  // three pages
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 7u);
  EXPECT_EQ(list->front().key, "many/10");
  EXPECT_EQ(list->back().key, "many/16");
}

TEST_F(S3ClientTest, MultipartUploadAppearsWholeOnlyWhenCompleted) {
  S3Client c(server_->Config(), Quick());
  const std::string part1 = TestBytes(5 << 20, 2), part2 = TestBytes(123456, 3);
  auto id = c.CreateMultipartUpload(kBucket, "mp/object");
  ASSERT_TRUE(id.ok()) << id.status();
  auto e1 = c.UploadPart(kBucket, "mp/object", *id, 1, part1);
  ASSERT_TRUE(e1.ok()) << e1.status();
  auto e2 = c.UploadPart(kBucket, "mp/object", *id, 2, part2);
  ASSERT_TRUE(e2.ok()) << e2.status();
  EXPECT_EQ(c.HeadObject(kBucket, "mp/object").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(c.CompleteMultipartUpload(kBucket, "mp/object", *id, {*e1, *e2}).ok());
  auto got = c.GetObject(kBucket, "mp/object");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, part1 + part2);

  auto aborted = c.CreateMultipartUpload(kBucket, "mp/aborted");
  ASSERT_TRUE(aborted.ok());
  ASSERT_TRUE(c.UploadPart(kBucket, "mp/aborted", *aborted, 1, part2).ok());
  ASSERT_TRUE(c.AbortMultipartUpload(kBucket, "mp/aborted", *aborted).ok());
  EXPECT_EQ(c.HeadObject(kBucket, "mp/aborted").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(S3ClientTest, SinkSeesTheBodyInPiecesAndCanRefuseIt) {
  S3Client c(server_->Config(), Quick());
  const std::string body = TestBytes(3 << 20, 4);
  ASSERT_TRUE(c.PutObject(kBucket, "sink/obj", body).ok());
  std::string got;
  int pieces = 0;
  ASSERT_TRUE(c.GetObject(kBucket, "sink/obj", [&](absl::string_view p) {
                 got.append(p.data(), p.size());
                 ++pieces;
                 return absl::OkStatus();
               }).ok());
  EXPECT_EQ(got, body);
  EXPECT_GT(pieces, 1);
  absl::Status refused = c.GetObject(
      kBucket, "sink/obj", [](absl::string_view) { return absl::DataLossError("no thanks"); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(refused.message(), "no thanks");
}

TEST_F(S3ClientTest, UnknownAccountIsPermissionDeniedNamingTheBucket) {
  S3Config config = server_->Config();
  config.access_key_id = "NOBODY";
  config.credentials_source = "environment (AWS_ACCESS_KEY_ID)";
  S3Client c(config, Quick());
  absl::Status s = c.PutObject(kBucket, "denied/x", "x");
  ASSERT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("HTTP 403 InvalidAccessKeyId"));
  EXPECT_THAT(s.message(), HasSubstr("bucket \"loom-test\""));
  EXPECT_THAT(s.message(), HasSubstr("environment (AWS_ACCESS_KEY_ID)"));
}

// The store checks what libcurl signs: a wrong secret fails the signature.
TEST_F(S3ClientTest, WrongSecretFailsTheSignature) {
  S3Config config = server_->Config();
  config.secret_access_key = "not-the-secret";
  S3Client c(config, Quick());
  absl::Status s = c.PutObject(kBucket, "denied/y", "y");
  ASSERT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("SignatureDoesNotMatch"));
  EXPECT_EQ(c.HeadObject(kBucket, "denied/y").status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(S3ClientTest, MissingBucketIsNotFound) {
  S3Client c(server_->Config(), Quick());
  absl::Status s = c.PutObject("no-such-bucket", "x", "x");
  ASSERT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("NoSuchBucket"));
}

TEST_F(S3ClientTest, UnreachableStoreIsUnavailableAfterBoundedRetries) {
  S3Config config = server_->Config();
  config.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  S3ClientOptions o = Quick();
  o.max_attempts = 4;
  S3Client c(config, o);
  absl::Status s = c.PutObject(kBucket, "x", "x");
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("after 4 tries"));
  EXPECT_THAT(s.message(), HasSubstr("127.0.0.1:1"));
}

TEST_F(S3ClientTest, CancelEndsTheRetries) {
  S3Config config = server_->Config();
  config.endpoint = "http://127.0.0.1:1";
  std::atomic<bool> cancel{false};
  S3ClientOptions o = Quick();
  o.max_attempts = 1000;
  o.initial_backoff = absl::Seconds(1);
  o.cancel = &cancel;
  S3Client c(config, o);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel = true;
  });
  absl::Status s = c.PutObject(kBucket, "x", "x");
  t.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
}

TEST_F(S3ClientTest, AStoreThatComesBackIsReachedAgain) {
  S3Client c(server_->Config(), Quick());
  ASSERT_TRUE(c.PutObject(kBucket, "restart/before", "b").ok());
  ASSERT_TRUE(server_->Kill().ok());
  EXPECT_EQ(c.PutObject(kBucket, "restart/during", "d").code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(server_->Restart().ok());
  ASSERT_TRUE(c.PutObject(kBucket, "restart/after", "a").ok());
  auto got = c.GetObject(kBucket, "restart/before");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "b");
}

}  // namespace
}  // namespace loom::object_store
