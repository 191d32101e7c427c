#include "worker/snapshot_dirs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace loom::worker {
namespace fs = std::filesystem;

std::string DefaultSnapshotRoot() {
  std::error_code ec;
  if (!fs::is_directory("/dev/shm", ec)) return "";
  return absl::StrCat("/dev/shm/loom-snapshots-", ::getuid());
}

bool ClaimSnapshotWriter(const std::string& job_dir, int64_t attempt) {
  std::error_code ec;
  fs::create_directories(job_dir, ec);
  if (ec) return false;
  const std::string path = absl::StrCat(job_dir, "/WRITER-g", attempt, ".lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;
  }
  return true;  // the descriptor stays open, and the lock held, until exit
}

namespace {

// The newest modification time under `dir` (itself included).
absl::Time NewestChange(const fs::path& dir) {
  absl::Time newest = absl::InfinitePast();
  auto consider = [&](const fs::path& p) {
    struct stat st;
    if (::lstat(p.c_str(), &st) == 0) {
      newest = std::max(newest, absl::TimeFromTimespec(st.st_mtim));
    }
  };
  consider(dir);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec),
       end;
       !ec && it != end; it.increment(ec)) {
    consider(it->path());
  }
  return newest;
}

// True if a live process holds one of `dir`'s writer locks.
bool WriterLive(const fs::path& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!absl::StartsWith(name, "WRITER-g") || !absl::EndsWith(name, ".lock")) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
    ::close(fd);
    if (held) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> RemoveIdleSnapshotDirs(const std::string& root, absl::Duration max_idle,
                                                absl::Time now) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec) || e.is_symlink(ec)) continue;
    if (now - NewestChange(e.path()) < max_idle || WriterLive(e.path())) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) removed.push_back(e.path().filename().string());
  }
  return removed;
}

SnapshotJanitor::SnapshotJanitor(std::string root, absl::Duration max_idle, absl::Duration period)
    : thread_([this, root = std::move(root), max_idle, period] {
        std::unique_lock<std::mutex> lock(mu_);
        while (!stop_) {
          lock.unlock();
          for (const std::string& name : RemoveIdleSnapshotDirs(root, max_idle, absl::Now())) {
            std::cerr << "loom-worker: removed the in-memory snapshots in " << root << "/" << name
                      << " (none written for " << absl::FormatDuration(max_idle)
                      << ", no rank of the job here)" << std::endl;
          }
          lock.lock();
          cv_.wait_for(lock, absl::ToChronoMilliseconds(period), [this] { return stop_; });
        }
      }) {}

SnapshotJanitor::~SnapshotJanitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace loom::worker
