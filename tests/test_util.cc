#include "tests/test_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <chrono>
#include <iterator>
#include <thread>

namespace loom::testing {

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
  char* d = mkdtemp(tmpl.data());
  return d ? std::string(d) : std::string();
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

static std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CommandResult RunCommand(const std::string& command) {
  std::string dir = MakeTempDir("loom_cmd");
  std::string out = dir + "/out", err = dir + "/err";
  std::string full = command + " >" + out + " 2>" + err;
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = Slurp(out);
  r.err = Slurp(err);
  unlink(out.c_str());
  unlink(err.c_str());
  rmdir(dir.c_str());
  return r;
}

HttpResponse HttpGet(const std::string& address, const std::string& path) {
  HttpResponse r;
  auto colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  int port = std::atoi(address.substr(colon + 1).c_str());
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return r;
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string data;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) data.append(buf, n);
  close(fd);
  auto sep = data.find("\r\n\r\n");
  if (sep == std::string::npos) return r;
  r.headers = data.substr(0, sep);
  r.body = data.substr(sep + 4);
  auto sp = r.headers.find(' ');
  if (sp != std::string::npos) r.status = std::atoi(r.headers.c_str() + sp + 1);
  return r;
}

bool ProcessAlive(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == EPERM;
  // A zombie counts as dead.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  auto rp = line.rfind(')');
  return rp == std::string::npos || rp + 2 >= line.size() || line[rp + 2] != 'Z';
}

bool WaitFor(const std::function<bool()>& pred, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return pred();
}

std::string RankProcessIdentity(int pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream in(proc + "/cmdline");
  std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (cmd.find("loom-rank") == std::string::npos) return "";
  // A warm rank's command line is `loom-rank --warm`; its log, which names
  // the job, is its stderr.
  char log[4096];
  const ssize_t n = readlink((proc + "/fd/2").c_str(), log, sizeof(log) - 1);
  if (n > 0) cmd.append("\n").append(log, static_cast<size_t>(n));
  return cmd;
}

std::set<int> RankPidsOf(const std::string& job) {
  std::set<int> pids;
  DIR* d = opendir("/proc");
  if (d == nullptr) return pids;
  while (dirent* e = readdir(d)) {
    const int pid = atoi(e->d_name);
    if (pid <= 0) continue;
    if (RankProcessIdentity(pid).find(job) != std::string::npos && ProcessAlive(pid)) {
      pids.insert(pid);
    }
  }
  closedir(d);
  return pids;
}

}  // namespace loom::testing
