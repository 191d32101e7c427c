#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kPromtool[] = "/usr/bin/promtool";

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // Names lowercased.
  std::string body;
};

// Connects to 127.0.0.1:port; returns the socket, or -1.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A minimal HTTP/1.1 client: sends one request with "Connection: close" and
// reads until the server closes. Returns status 0 on transport failure.
HttpResponse Fetch(int port, const std::string& method,
                   const std::string& path) {
  HttpResponse response;
  int fd = Connect(port);
  if (fd < 0) return response;
  const std::string request = absl::StrCat(
      method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
      "Connection: close\r\nContent-Length: 0\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return response;
  }
  std::string raw;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) raw.append(buffer, n);
  close(fd);

  const size_t header_end = raw.find("\r\n\r\n");
  if (header_end == std::string::npos) return response;
  std::vector<std::string> lines =
      absl::StrSplit(raw.substr(0, header_end), "\r\n");
  // "HTTP/1.1 200 OK"
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 ||
      !absl::SimpleAtoi(status_line[1], &response.status)) {
    return response;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    response.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  response.body = raw.substr(header_end + 4);
  return response;
}

// Runs `command` through the shell; returns its exit code and output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    output.append(buffer, n);
  }
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

class ExposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& tokens = BuildCounter()
                       .Name("loom_worker_tokens_total")
                       .Help("Tokens processed by the worker.")
                       .Labels({{"worker", "w0"}})
                       .Register(*registry_);
    tokens.Add({{"phase", "train"}}).Increment(4096);
    tokens.Add({{"phase", "eval \"quoted\" \\ and\nnewline"}}).Increment(3);
    BuildGauge()
        .Name("loom_worker_gpu_memory_bytes")
        .Help("GPU memory in use.\nSecond help line with a \\ backslash.")
        .Register(*registry_)
        .Add({{"gpu", "0"}})
        .Set(1.5e9);
    auto& steps = BuildHistogram()
                      .Name("loom_worker_step_time_seconds")
                      .Help("Wall time per training step.")
                      .Register(*registry_)
                      .Add({{"job", "j1"}}, ExponentialBuckets(0.01, 10, 4));
    for (double v : {0.005, 0.2, 0.3, 7.0, 40.0}) steps.Observe(v);

    absl::StatusOr<std::unique_ptr<Exposer>> exposer =
        Exposer::Start("127.0.0.1:0");
    ASSERT_TRUE(exposer.ok()) << exposer.status();
    exposer_ = std::move(*exposer);
    exposer_->RegisterCollectable(registry_);
  }

  void TearDown() override { exposer_.reset(); }

  std::shared_ptr<Registry> registry_ = std::make_shared<Registry>();
  std::unique_ptr<Exposer> exposer_;
};

TEST_F(ExposerTest, ReportsBoundPortAndAddress) {
  EXPECT_GT(exposer_->port(), 0);
  EXPECT_EQ(exposer_->address(), absl::StrCat("127.0.0.1:", exposer_->port()));
}

TEST_F(ExposerTest, GetMetricsServesTextFormat) {
  HttpResponse response = Fetch(exposer_->port(), "GET", "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.headers["content-type"],
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(response.headers["content-length"],
            absl::StrCat(response.body.size()));
  EXPECT_EQ(response.body, SerializeText(registry_->Collect()));
  EXPECT_THAT(response.body,
              HasSubstr("loom_worker_tokens_total{phase=\"train\","
                        "worker=\"w0\"} 4096\n"));
  EXPECT_THAT(response.body,
              HasSubstr("loom_worker_step_time_seconds_bucket{job=\"j1\","
                        "le=\"1\"} 3\n"));
  EXPECT_THAT(response.body,
              HasSubstr("loom_worker_gpu_memory_bytes{gpu=\"0\"} 1500000000\n"));

  // Values are read at scrape time.
  BuildGauge()
      .Name("loom_worker_gpu_memory_bytes")
      .Help("GPU memory in use.\nSecond help line with a \\ backslash.")
      .Register(*registry_)
      .Add({{"gpu", "0"}})
      .Set(2);
  EXPECT_THAT(Fetch(exposer_->port(), "GET", "/metrics?debug=1").body,
              HasSubstr("loom_worker_gpu_memory_bytes{gpu=\"0\"} 2\n"));
}

TEST_F(ExposerTest, HeadHasHeadersOnly) {
  HttpResponse response = Fetch(exposer_->port(), "HEAD", "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.headers["content-type"],
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(response.body, "");
}

TEST_F(ExposerTest, OtherPathsAre404AndOtherMethods405) {
  for (const char* path : {"/", "/metrics/", "/metricsx", "/favicon.ico"}) {
    EXPECT_EQ(Fetch(exposer_->port(), "GET", path).status, 404) << path;
  }
  HttpResponse post = Fetch(exposer_->port(), "POST", "/metrics");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.headers["allow"], "GET, HEAD");
}

TEST_F(ExposerTest, ServesEveryRegistryAndForgetsDroppedOnes) {
  auto second = std::make_shared<Registry>();
  BuildGauge().Name("aaa_first_in_output").Help("a").Register(*second).Add(
      {}).Set(7);
  exposer_->RegisterCollectable(second);
  HttpResponse response = Fetch(exposer_->port(), "GET", "/metrics");
  EXPECT_THAT(response.body,
              StartsWith("# HELP aaa_first_in_output a\n"
                         "# TYPE aaa_first_in_output gauge\n"
                         "aaa_first_in_output 7\n"
                         "# HELP loom_worker_gpu_memory_bytes"));

  exposer_->RemoveCollectable(second);
  EXPECT_THAT(Fetch(exposer_->port(), "GET", "/metrics").body,
              StartsWith("# HELP loom_worker_gpu_memory_bytes"));

  // The Exposer holds only weak references.
  registry_.reset();
  response = Fetch(exposer_->port(), "GET", "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "");
}

TEST_F(ExposerTest, PromtoolAcceptsOutput) {
  // promtool is a declared dependency (scripts/install-deps.sh): missing is a failure.
  ASSERT_EQ(access(kPromtool, X_OK), 0) << kPromtool << " not installed (Debian package prometheus)";
  HttpResponse response = Fetch(exposer_->port(), "GET", "/metrics");
  ASSERT_EQ(response.status, 200);
  const std::string path = absl::StrCat(::testing::TempDir(), "/metrics_",
                                        getpid(), ".prom");
  {
    std::ofstream file(path, std::ios::binary);
    file << response.body;
    ASSERT_TRUE(file.good());
  }
  auto [exit_code, output] =
      RunCommand(absl::StrCat(kPromtool, " check metrics < ", path, " 2>&1"));
  std::remove(path.c_str());
  EXPECT_EQ(exit_code, 0) << output << "\nfor input:\n" << response.body;
  EXPECT_EQ(output, "") << "for input:\n" << response.body;
}

TEST_F(ExposerTest, DestructorStopsServing) {
  const int port = exposer_->port();
  ASSERT_EQ(Fetch(port, "GET", "/metrics").status, 200);
  exposer_.reset();
  int fd = Connect(port);
  if (fd >= 0) close(fd);
  EXPECT_LT(fd, 0);
}

TEST(ExposerStartTest, PortInUseIsAnError) {
  // Hold a listening socket on a free port, then ask for that port.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  absl::StatusOr<std::unique_ptr<Exposer>> exposer =
      Exposer::Start(absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(exposer.status().code(), absl::StatusCode::kUnavailable)
      << exposer.status();
  EXPECT_THAT(exposer.status().message(), HasSubstr("Address already in use"));
  close(fd);

  // Same with the port held by another Exposer.
  absl::StatusOr<std::unique_ptr<Exposer>> first =
      Exposer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<Exposer>> second =
      Exposer::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable)
      << second.status();
  EXPECT_EQ(Fetch((*first)->port(), "GET", "/metrics").status, 200);
}

TEST(ExposerStartTest, InvalidArguments) {
  EXPECT_EQ(Exposer::Start("").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Exposer::Start("127.0.0.1:0,127.0.0.1:0").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Exposer::Start("127.0.0.1:0", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Exposer::Start("not an address").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Exposer::Start("127.0.0.1:99999").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace metrics
}  // namespace loom
