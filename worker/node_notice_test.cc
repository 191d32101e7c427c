#include "worker/node_notice.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace loom::worker {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1800000000);

TEST(NodeNoticeTest, AFileGivesSecondsATimeOrTheDefault) {
  loom::v1::NodeNotice empty = NodeNoticeWatcher::FromFile("\n", kNow, absl::Seconds(30));
  EXPECT_EQ(empty.source(), "file");
  EXPECT_EQ(empty.deadline_unix_ms(), absl::ToUnixMillis(kNow + absl::Seconds(30)));
  EXPECT_EQ(empty.detail(), "the notice file appeared");
  loom::v1::NodeNotice seconds = NodeNoticeWatcher::FromFile("120\n", kNow, absl::Seconds(30));
  EXPECT_EQ(seconds.deadline_unix_ms(), absl::ToUnixMillis(kNow + absl::Seconds(120)));
  EXPECT_EQ(seconds.detail(), "the notice file says 120");
  loom::v1::NodeNotice at =
      NodeNoticeWatcher::FromFile("2027-01-15T08:00:00Z", kNow, absl::Seconds(30));
  EXPECT_EQ(at.deadline_unix_ms(), 1800000000000);
  loom::v1::NodeNotice junk = NodeNoticeWatcher::FromFile("soon", kNow, absl::Seconds(30));
  EXPECT_EQ(junk.deadline_unix_ms(), absl::ToUnixMillis(kNow + absl::Seconds(30)));
}

TEST(NodeNoticeTest, MetadataInTheShapesOfAwsSpotAndGcePreemption) {
  EXPECT_FALSE(NodeNoticeWatcher::FromMetadata(404, "Not Found", kNow).has_value());
  auto aws = NodeNoticeWatcher::FromMetadata(
      200, R"({"action": "terminate", "time": "2027-01-15T08:22:00Z"})", kNow);
  ASSERT_TRUE(aws.has_value());
  EXPECT_EQ(aws->source(), "aws-spot");
  EXPECT_EQ(aws->deadline_unix_ms(), 1800001320000);
  EXPECT_EQ(aws->detail(), "spot instance-action terminate at 2027-01-15T08:22:00Z");
  EXPECT_FALSE(NodeNoticeWatcher::FromMetadata(200, "FALSE", kNow).has_value());
  auto gce = NodeNoticeWatcher::FromMetadata(200, "TRUE", kNow);
  ASSERT_TRUE(gce.has_value());
  EXPECT_EQ(gce->source(), "gce-preemption");
  EXPECT_EQ(gce->deadline_unix_ms(), absl::ToUnixMillis(kNow + absl::Seconds(30)));
  EXPECT_FALSE(NodeNoticeWatcher::FromMetadata(200, "{\"action\": 1}", kNow).has_value());
  EXPECT_FALSE(NodeNoticeWatcher::FromMetadata(200, "<html>", kNow).has_value());
}

TEST(NodeNoticeTest, TheFirstNoticeHoldsUnlessALaterOneIsSooner) {
  NodeNoticeWatcher watcher({});
  EXPECT_FALSE(watcher.Current().has_value());
  loom::v1::NodeNotice a;
  a.set_source("sigterm");
  a.set_deadline_unix_ms(5000);
  watcher.Raise(a);
  loom::v1::NodeNotice later = a;
  later.set_source("file");
  later.set_deadline_unix_ms(9000);
  watcher.Raise(later);
  EXPECT_EQ(watcher.Current()->source(), "sigterm");
  loom::v1::NodeNotice sooner = a;
  sooner.set_source("aws-spot");
  sooner.set_deadline_unix_ms(3000);
  watcher.Raise(sooner);
  EXPECT_EQ(watcher.Current()->source(), "aws-spot");
}

// Bounded waits: at most ~10 s each.
bool WaitForNotice(NodeNoticeWatcher& w) {
  for (int i = 0; i < 100 && !w.Current().has_value(); ++i) absl::SleepFor(absl::Milliseconds(100));
  return w.Current().has_value();
}

TEST(NodeNoticeTest, SeesAFileThatAppears) {
  char tmpl[] = "/tmp/loom_notice_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/notice";
  NodeNoticeOptions o;
  o.file = path;
  o.poll_interval = absl::Milliseconds(50);
  NodeNoticeWatcher watcher(o);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(watcher.Current().has_value());
  std::ofstream(path) << "45\n";
  ASSERT_TRUE(WaitForNotice(watcher));
  EXPECT_EQ(watcher.Current()->source(), "file");
  EXPECT_NEAR(watcher.Current()->deadline_unix_ms(), absl::ToUnixMillis(absl::Now()) + 45000, 5000);
  // Taken back: withdrawn.
  unlink(path.c_str());
  for (int i = 0; i < 100 && watcher.Current().has_value(); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_FALSE(watcher.Current().has_value());
  rmdir(dir.c_str());
}

TEST(NodeNoticeTest, PollsAMetadataEndpointOnLoopback) {
  httplib::Server server;
  std::atomic<bool> noticed{false};
  std::atomic<int> flavored{0};
  server.Get("/latest/meta-data/spot/instance-action", [&](const httplib::Request& req,
                                                           httplib::Response& res) {
    if (req.get_header_value("Metadata-Flavor") == "Google") ++flavored;
    if (!noticed) {
      res.status = 404;
      return;
    }
    res.set_content(R"({"action": "stop", "time": "2027-01-15T08:22:00Z"})", "application/json");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  NodeNoticeOptions o;
  o.url = absl::StrCat("http://127.0.0.1:", port, "/latest/meta-data/spot/instance-action");
  o.poll_interval = absl::Milliseconds(50);
  o.url_interval = absl::Milliseconds(50);
  {
    NodeNoticeWatcher watcher(o);
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_FALSE(watcher.Current().has_value());
    noticed = true;
    ASSERT_TRUE(WaitForNotice(watcher));
    EXPECT_EQ(watcher.Current()->source(), "aws-spot");
    EXPECT_EQ(watcher.Current()->deadline_unix_ms(), 1800001320000);
    // A SIGTERM's notice holds for good; the endpoint's goes when it stops
    // saying so.
    loom::v1::NodeNotice term;
    term.set_source("sigterm");
    term.set_deadline_unix_ms(1900000000000);
    watcher.Raise(term);
    EXPECT_EQ(watcher.Current()->source(), "aws-spot");  // the sooner
    noticed = false;
    for (int i = 0; i < 100 && watcher.Current()->source() != "sigterm"; ++i) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_EQ(watcher.Current()->source(), "sigterm");
  }
  EXPECT_GT(flavored.load(), 0);
  server.stop();
  serving.join();
}

}  // namespace
}  // namespace loom::worker
