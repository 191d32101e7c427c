// Helpers for integration tests that drive the real binaries.
#ifndef LOOM_TESTS_TEST_UTIL_H_
#define LOOM_TESTS_TEST_UTIL_H_

#include <functional>
#include <set>
#include <string>
#include <utility>

namespace loom::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `command` through /bin/sh, capturing stdout and stderr.
CommandResult RunCommand(const std::string& command);

// Plain HTTP/1.0 GET against "host:port"; returns the status code and body.
struct HttpResponse {
  int status = 0;
  std::string headers;
  std::string body;
};
HttpResponse HttpGet(const std::string& address, const std::string& path);

std::string MakeTempDir(const std::string& prefix);
std::string ShellQuote(const std::string& s);
bool ProcessAlive(int pid);
// Polls `pred` every 100 ms until it holds or `seconds` pass; its last answer.
bool WaitFor(const std::function<bool()>& pred, double seconds);
// A loom-rank process's command line and the file its stderr goes to (a
// rank's log: <work dir>/<job>/rank-<r>.log), "\n"-joined, for finding a
// job's ranks, warm-started ones included; "" for any other process.
std::string RankProcessIdentity(int pid);
// Pids of the live loom-rank processes whose RankProcessIdentity mentions
// `job`.
std::set<int> RankPidsOf(const std::string& job);

// Runs `command` (RunCommand) when it goes out of scope, on every return
// path: the cleanup of something a test or benchmark started.
class RunOnExit {
 public:
  explicit RunOnExit(std::string command) : command_(std::move(command)) {}
  ~RunOnExit() { RunCommand(command_); }
  RunOnExit(const RunOnExit&) = delete;
  RunOnExit& operator=(const RunOnExit&) = delete;

 private:
  std::string command_;
};

}  // namespace loom::testing

#endif  // LOOM_TESTS_TEST_UTIL_H_
