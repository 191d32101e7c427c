#include "common/object_store/s3_test_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/object_store/s3_client.h"

#ifndef LOOM_RADOSGW_SCRIPT
#error "LOOM_RADOSGW_SCRIPT must name tests/object_store/radosgw.sh"
#endif

namespace loom::object_store {
namespace {

// A port the kernel just gave out and took back: free, unless someone
// takes it in the moment before the script binds it.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

}  // namespace

absl::StatusOr<std::unique_ptr<S3TestServer>> S3TestServer::Start(const std::string& bucket,
                                                                  const Options& options) {
  if (access("/usr/bin/radosgw", X_OK) != 0 || access("/usr/bin/ceph-osd", X_OK) != 0) {
    return absl::FailedPreconditionError(
        "Ceph's RADOS Gateway is not installed: run ./scripts/install-deploy-deps.sh (it "
        "installs ceph-mon, ceph-mgr, ceph-osd, radosgw and ceph-common)");
  }
  std::unique_ptr<S3TestServer> s(new S3TestServer());
  char tmpl[] = "/tmp/loom-rgw-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  s->tmp_ = tmpl;
  const int mon_port = FreePort(), rgw_port = FreePort();
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  const std::string log = s->tmp_ + "/script.log";
  const std::string dir = s->tmp_ + "/cluster";
  // The script's environment: this process's, with its two ports.
  s->address_ = options.address;
  std::vector<std::string> env_strings = {absl::StrCat("MON_PORT=", mon_port),
                                          absl::StrCat("RGW_PORT=", rgw_port),
                                          absl::StrCat("RGW_ADDR=", options.address)};
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, "MON_PORT=", 9) != 0 && strncmp(*e, "RGW_PORT=", 9) != 0 &&
        strncmp(*e, "RGW_ADDR=", 9) != 0) {
      env_strings.push_back(*e);
    }
  }
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options.prefix;
  for (const char* a : {"/bin/bash", LOOM_RADOSGW_SCRIPT, dir.c_str()}) args.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (options.nice > 0) setpriority(PRIO_PROCESS, 0, options.nice);  // the daemons inherit it
    dup2(pipe_fds[1], 1);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 2);
    execvpe(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  s->pid_ = pid;
  s->out_ = fdopen(pipe_fds[0], "r");
  absl::StatusOr<std::string> ready = s->WaitForLine("READY ", 120);
  if (!ready.ok()) return ready.status();
  std::vector<std::string> f = absl::StrSplit(*ready, ' ');
  if (f.size() != 4) return absl::InternalError(absl::StrCat("radosgw.sh said: ", *ready));
  s->endpoint_ = f[1];
  s->key_ = f[2];
  s->secret_ = f[3];
  s->port_ = rgw_port;
  absl::Status made = s->CreateBucket(bucket);
  if (!made.ok()) return made;
  return s;
}

absl::StatusOr<std::string> S3TestServer::WaitForLine(const std::string& prefix, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::string line;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fileno(out_), POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[512];
    if (fgets(buf, sizeof(buf), out_) == nullptr) break;  // the script ended
    line = buf;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line.rfind(prefix, 0) == 0) return line;
  }
  absl::StatusOr<std::string> log = ReadFile(tmp_ + "/script.log");
  std::string tail = log.ok() ? *log : "";
  if (tail.size() > 3000) tail = tail.substr(tail.size() - 3000);
  return absl::UnavailableError(absl::StrCat("radosgw.sh did not say \"", prefix, "\" within ",
                                             seconds, " s; its log ends:\n", tail));
}

S3TestServer::~S3TestServer() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    // It stops the daemons and removes its directory; then it is made sure.
    for (int i = 0; i < 100; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  if (out_ != nullptr) fclose(out_);
  std::error_code ec;
  std::filesystem::remove_all(tmp_, ec);
}

S3Config S3TestServer::Config() const {
  S3Config c;
  c.endpoint = endpoint_;
  c.region = "us-east-1";
  c.path_style = true;
  c.access_key_id = key_;
  c.secret_access_key = secret_;
  c.credentials_source = "the test store's user";
  return c;
}

std::vector<std::string> S3TestServer::Environment() const {
  return {absl::StrCat("AWS_ENDPOINT_URL=", endpoint_), "AWS_REGION=us-east-1",
          absl::StrCat("AWS_ACCESS_KEY_ID=", key_),
          absl::StrCat("AWS_SECRET_ACCESS_KEY=", secret_)};
}

absl::Status S3TestServer::CreateBucket(const std::string& bucket) {
  S3Client client(Config());
  return client.CreateBucket(bucket);
}

absl::Status S3TestServer::Kill() {
  if (pid_ <= 0) return absl::FailedPreconditionError("the store is not running");
  kill(pid_, SIGUSR1);
  // Gone once a connection is refused.
  for (int i = 0; i < 100; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, address_.c_str(), &addr.sin_addr);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    const bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (!up) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError("the gateway still answers 5 s after it was killed");
}

absl::Status S3TestServer::Restart() {
  if (pid_ <= 0) return absl::FailedPreconditionError("the store is not running");
  kill(pid_, SIGUSR2);
  return WaitForLine("GATEWAY UP", 60).status();
}

}  // namespace loom::object_store
