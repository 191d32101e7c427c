#include "worker/rank_process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <iostream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/snapshot_dirs.h"
#include "worker/telemetry/telemetry.h"

namespace loom::worker {

absl::StatusOr<std::optional<WarmAssignment>> AwaitWarmAssignment() {
  const double loaded = telemetry::SecondsSinceProcessStart();
  std::cerr << "loom-rank (warm, pid " << getpid() << "): loaded in "
            << absl::StrFormat("%.2f", loaded) << " s, waiting for an assignment" << std::endl;
  const auto waiting_at = std::chrono::steady_clock::now();
  std::string line;
  if (!std::getline(std::cin, line) || line.empty()) return std::nullopt;
  const size_t tab = line.find('\t');
  if (tab == std::string::npos) {
    return absl::InvalidArgumentError("warm rank: the worker sent no assignment and log path");
  }
  WarmAssignment out;
  out.assignment_path = line.substr(0, tab);
  const std::string log = line.substr(tab + 1);
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("warm rank: cannot open its log ", log));
  dup2(fd, STDERR_FILENO);
  close(fd);
  if (const int devnull = open("/dev/null", O_RDONLY); devnull >= 0) {
    dup2(devnull, STDIN_FILENO);
    close(devnull);
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting_at).count();
  out.note = absl::StrFormat(
      " (a warm rank: LibTorch loaded in %.2f s, %.1f s before its assignment)", loaded, waited);
  return out;
}

std::string FetchFromObjectStore(const std::string& remote, const std::string& dir,
                                 std::optional<int64_t> resume_step, bool* ok) {
  if (ok != nullptr) *ok = false;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string bin = n > 0 ? std::string(self, n) : std::string("loom-rank");
  bin = bin.substr(0, bin.rfind('/') + 1) + "loom-ckpt";
  const std::string step = resume_step.has_value() ? std::to_string(*resume_step) : "";
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "nothing restored: pipe failed";
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return "nothing restored: fork failed";
  }
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    if (resume_step.has_value()) {
      execl(bin.c_str(), "loom-ckpt", "fetch", remote.c_str(), dir.c_str(), "--resume-step",
            step.c_str(), static_cast<char*>(nullptr));
    } else {
      execl(bin.c_str(), "loom-ckpt", "fetch", remote.c_str(), dir.c_str(),
            static_cast<char*>(nullptr));
    }
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t got; (got = read(fds[0], buf, sizeof(buf))) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (ok != nullptr) *ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && out.empty()) {
    return absl::StrCat("nothing restored: could not run ", bin, "; resuming from ", dir, " alone");
  }
  return out.empty() ? absl::StrCat(bin, " fetch ended with status ", status) : out;
}

namespace {

// FNV-1a (64 bits): a stable name for a path (std::hash may differ between
// builds, and ranks of two builds may share a node).
uint64_t Fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

RankSnapshots ChooseRankSnapshots(bool disable, int64_t interval_steps, int64_t max_bytes,
                                  const std::string& job_id, const std::string& checkpoint_dir,
                                  int64_t attempt, uint64_t memory_per_rank) {
  RankSnapshots out;
  const char* root = getenv(kSnapshotDirEnv);
  if (disable || root == nullptr || *root == '\0' || job_id.empty()) return out;
  out.dir =
      absl::StrCat(root, "/", job_id, "-", absl::Hex(Fnv1a64(checkpoint_dir), absl::kZeroPad16));
  out.interval = interval_steps > 0 ? interval_steps : 1;
  out.max_bytes = max_bytes > 0 ? static_cast<uint64_t>(max_bytes) : memory_per_rank / 4;
  out.writer = ClaimSnapshotWriter(out.dir, attempt);
  return out;
}

}  // namespace loom::worker
