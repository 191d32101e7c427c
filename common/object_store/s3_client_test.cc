// The client against a real S3-compatible store (Ceph's RADOS Gateway on
// loopback), which checks every signature and payload hash.
#include "common/object_store/s3_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/object_store/s3_test_server.h"
#include "common/object_store/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::object_store {
namespace {

using ::testing::HasSubstr;

constexpr char kBucket[] = "loom-test";

// A store that answers errors: a front on loopback that answers its first
// `errors` requests "503 Slow Down" (an S3 error document, then closes the
// connection, as a store shedding load does) and relays every later
// connection to the real store, byte for byte.
class ErroringFront {
 public:
  ErroringFront(int store_port, int errors) : store_port_(store_port), errors_left_(errors) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len);
    ::listen(listen_fd_, 16);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~ErroringFront() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_.join();
    ::close(listen_fd_);
    for (std::thread& t : relays_) t.join();
  }
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  int errors_answered() const { return errors_answered_; }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      if (errors_left_ > 0) {
        --errors_left_;
        AnswerError(fd);
        continue;
      }
      relays_.emplace_back([this, fd] { Relay(fd); });
    }
  }
  // Reads the request (headers and a Content-Length body), answers 503.
  void AnswerError(int fd) {
    std::string in;
    char buf[4096];
    size_t end = std::string::npos;
    while ((end = in.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      in.append(buf, static_cast<size_t>(n));
    }
    size_t body = 0;
    const std::string lower = absl::AsciiStrToLower(in.substr(0, end));
    if (const size_t at = lower.find("content-length:"); at != std::string::npos) {
      absl::SimpleAtoi(
          absl::StripAsciiWhitespace(lower.substr(at + 15, lower.find('\r', at) - at - 15)), &body);
    }
    while (end != std::string::npos && in.size() < end + 4 + body) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      in.append(buf, static_cast<size_t>(n));
    }
    const std::string xml =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
        "<Message>Please reduce your request rate.</Message></Error>";
    const std::string reply = absl::StrCat(
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: ", xml.size(),
        "\r\nConnection: close\r\n\r\n", xml);
    // Counted before the client can see the answer (and return, and be
    // asked how many it got).
    ++errors_answered_;
    (void)!::write(fd, reply.data(), reply.size());
    ::close(fd);
  }
  void Relay(int client) {
    const int store = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(store_port_));
    if (::connect(store, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      pollfd p[2] = {{client, POLLIN, 0}, {store, POLLIN, 0}};
      char buf[65536];
      for (bool open = true; open && !stop_;) {
        if (::poll(p, 2, 100) <= 0) continue;
        for (int i = 0; i < 2 && open; ++i) {
          if (p[i].revents == 0) continue;
          const ssize_t n = ::read(p[i].fd, buf, sizeof(buf));
          open = n > 0 && ::write(p[1 - i].fd, buf, static_cast<size_t>(n)) == n;
        }
      }
    }
    ::close(store);
    ::close(client);
  }

  const int store_port_;
  std::atomic<int> errors_left_;
  std::atomic<int> errors_answered_{0};
  std::atomic<bool> stop_{false};
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_;
  std::vector<std::thread> relays_;  // only the accept thread adds
};

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

TEST_F(S3ClientTest, RangedGetGivesExactlyThoseBytesAndNothingPastTheEnd) {
  S3Client c(server_->Config(), Quick());
  const std::string body = TestBytes(300000, 4);
  ASSERT_TRUE(c.PutObject(kBucket, "ranged/x", body).ok());
  auto middle = c.GetObjectRange(kBucket, "ranged/x", 1000, 65536);
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_EQ(*middle, body.substr(1000, 65536));
  auto tail = c.GetObjectRange(kBucket, "ranged/x", 299990, 10);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(*tail, body.substr(299990));
  // Past the end: fewer bytes than asked, or none at all.
  EXPECT_EQ(c.GetObjectRange(kBucket, "ranged/x", 299990, 20).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(c.GetObjectRange(kBucket, "ranged/x", 400000, 20).status().code(),
            absl::StatusCode::kOutOfRange);
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

// A store that sheds load answers 503 Slow Down: the request is tried again
// with backoff and goes through once the store takes it.
TEST_F(S3ClientTest, ErrorAnswersAreRetriedUntilTheStoreTakesTheRequest) {
  ErroringFront front(server_->port(), 2);
  S3Config config = server_->Config();
  config.endpoint = front.endpoint();
  S3Client c(config, Quick());  // 3 tries
  ASSERT_TRUE(c.PutObject(kBucket, "shed/one", "payload").ok());
  EXPECT_EQ(front.errors_answered(), 2);
  auto got = S3Client(server_->Config(), Quick()).GetObject(kBucket, "shed/one");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "payload");
}

// One that keeps answering errors: UNAVAILABLE after the bounded tries (no
// retry loop), naming the store's answer; and an upload through it leaves
// no checkpoint listed.
TEST_F(S3ClientTest, AStoreThatKeepsAnsweringErrorsIsUnavailableAfterBoundedTries) {
  ErroringFront front(server_->port(), 1000);
  S3Config config = server_->Config();
  config.endpoint = front.endpoint();
  S3Client c(config, Quick());
  absl::Status s = c.PutObject(kBucket, "shed/two", "payload");
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("503"));
  EXPECT_THAT(s.message(), HasSubstr("SlowDown"));
  EXPECT_THAT(s.message(), HasSubstr("after 3 tries"));
  EXPECT_EQ(front.errors_answered(), 3);
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
