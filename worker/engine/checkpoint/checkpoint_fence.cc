#include "worker/engine/checkpoint/checkpoint_fence.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;

constexpr char kVolumeFullPayload[] = "type.loom.dev/loom.engine.CheckpointVolumeFull";
constexpr char kFencedPayload[] = "type.loom.dev/loom.engine.CheckpointFenced";
constexpr char kFenceMagic[] = "loom-fence 1";

absl::Status Fenced(const std::string& dir, const FenceToken& mine, const FenceToken& holder) {
  absl::Status status = absl::FailedPreconditionError(absl::StrCat(
      "checkpoint directory ", dir, " is fenced: attempt ", mine.attempt, " of job '",
      mine.owner, "' no longer owns it (attempt ", holder.attempt, " of job '", holder.owner,
      "' claimed it); this attempt must stop"));
  status.SetPayload(kFencedPayload, absl::Cord("1"));
  return status;
}

// flock(2) on <dir>/FENCE.lock for the object's lifetime.
class FenceLock {
 public:
  static absl::StatusOr<FenceLock> Acquire(const std::string& dir) {
    const std::string path = (fs::path(dir) / kFenceLockFileName).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return CheckpointErrnoError("open", path);
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      absl::Status error = CheckpointErrnoError("flock", path);
      ::close(fd);
      return error;
    }
    return FenceLock(fd);
  }
  FenceLock(FenceLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FenceLock& operator=(FenceLock&&) = delete;
  ~FenceLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }

 private:
  explicit FenceLock(int fd) : fd_(fd) {}
  int fd_;
};

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return CheckpointErrnoError("open", dir);
  const bool ok = ::fsync(fd) == 0;
  absl::Status status = ok ? absl::OkStatus() : CheckpointErrnoError("fsync", dir);
  ::close(fd);
  return status;
}

// Writes FENCE durably (temporary file, fsync, rename, fsync of dir).
// Caller holds the lock.
absl::Status WriteFence(const std::string& dir, const FenceToken& token) {
  const std::string path = (fs::path(dir) / kFenceFileName).string();
  const std::string temp = absl::StrCat(path, ".tmp-", ::getpid());
  const std::string text = absl::StrCat(kFenceMagic, "\n", token.owner, "\n", token.attempt, "\n");
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return CheckpointErrnoError("create", temp);
  absl::Status status;
  size_t done = 0;
  while (status.ok() && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = CheckpointErrnoError("write", temp);
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (status.ok() && ::fsync(fd) != 0) status = CheckpointErrnoError("fsync", temp);
  if (::close(fd) != 0 && status.ok()) status = CheckpointErrnoError("close", temp);
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = CheckpointErrnoError("rename", temp);
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return SyncDirectory(dir);
}

absl::Status CheckToken(const FenceToken& token) {
  if (token.owner.find('\n') != std::string::npos || token.attempt < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad fencing token (owner '", token.owner, "', attempt ", token.attempt,
                     "): the owner may not hold a newline and the attempt must be >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckpointErrnoError(absl::string_view what, const std::string& path) {
  const int error = errno;
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(error));
  if (error != ENOSPC && error != EDQUOT) return absl::InternalError(message);
  absl::Status full = absl::ResourceExhaustedError(message);
  full.SetPayload(kVolumeFullPayload, absl::Cord("1"));
  return full;
}

bool IsCheckpointVolumeFull(const absl::Status& status) {
  return absl::IsResourceExhausted(status) && status.GetPayload(kVolumeFullPayload).has_value();
}

bool IsCheckpointFenced(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) && status.GetPayload(kFencedPayload).has_value();
}

absl::StatusOr<FenceToken> ReadFence(const std::string& dir) {
  const std::string path = (fs::path(dir) / kFenceFileName).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no claim"));
    return CheckpointErrnoError("open", path);
  }
  std::string text;
  char buffer[512];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status error = CheckpointErrnoError("read", path);
      ::close(fd);
      return error;
    }
    if (n == 0 || text.size() > 4096) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  FenceToken token;
  if (lines.size() != 4 || lines[0] != kFenceMagic || !lines[3].empty() ||
      !absl::SimpleAtoi(lines[2], &token.attempt) || token.attempt < 0) {
    return absl::InternalError(absl::StrCat(
        path, " does not parse as a Loom fencing token (expected '", kFenceMagic,
        "', the owner and the attempt on three lines); it is left as it is: move it away "
        "only if no attempt of the job that owns this directory is running"));
  }
  token.owner = lines[1];
  return token;
}

absl::Status CheckFenceHeld(const std::string& dir, const FenceToken& token) {
  // FENCE is replaced by rename, so a read without the lock sees one whole
  // claim, the old or the new.
  absl::StatusOr<FenceToken> holder = ReadFence(dir);
  if (!holder.ok()) return absl::OkStatus();
  if (holder->owner == token.owner && holder->attempt == token.attempt) return absl::OkStatus();
  return Fenced(dir, token, *holder);
}

absl::Status ClaimCheckpointDir(const std::string& dir, const FenceToken& token,
                                const std::function<void()>& on_claimed) {
  RETURN_IF_ERROR(CheckToken(token));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    errno = ec.value();
    return CheckpointErrnoError("mkdir", dir);
  }
  ASSIGN_OR_RETURN(FenceLock lock, FenceLock::Acquire(dir));
  absl::StatusOr<FenceToken> holder = ReadFence(dir);
  if (!holder.ok() && !absl::IsNotFound(holder.status())) return holder.status();
  if (holder.ok() && holder->owner == token.owner && holder->attempt > token.attempt) {
    return Fenced(dir, token, *holder);
  }
  if (!holder.ok() || holder->owner != token.owner || holder->attempt != token.attempt) {
    RETURN_IF_ERROR(WriteFence(dir, token));
  }
  if (on_claimed) on_claimed();
  return absl::OkStatus();
}

absl::Status WhileFenceHeld(const std::string& dir, const FenceToken& token,
                            const std::function<absl::Status()>& fn) {
  RETURN_IF_ERROR(CheckToken(token));
  ASSIGN_OR_RETURN(FenceLock lock, FenceLock::Acquire(dir));
  absl::StatusOr<FenceToken> holder = ReadFence(dir);
  if (absl::IsNotFound(holder.status())) {
    RETURN_IF_ERROR(WriteFence(dir, token));
  } else if (!holder.ok()) {
    return holder.status();
  } else if (holder->owner != token.owner || holder->attempt != token.attempt) {
    return Fenced(dir, token, *holder);
  }
  return fn();
}

absl::Status ExplainSaveFailure(const std::string& dir, const FenceToken& token,
                                absl::Status error) {
  if (error.ok() || IsCheckpointFenced(error) || !CheckToken(token).ok()) return error;
  absl::StatusOr<FenceLock> lock = FenceLock::Acquire(dir);
  if (!lock.ok()) return error;
  absl::StatusOr<FenceToken> holder = ReadFence(dir);
  if (!holder.ok() || (holder->owner == token.owner && holder->attempt == token.attempt)) {
    return error;
  }
  absl::Status fenced = Fenced(dir, token, *holder);
  absl::Status explained(fenced.code(),
                         absl::StrCat(fenced.message(), " (the save failed: ", error.message(), ")"));
  explained.SetPayload(kFencedPayload, absl::Cord("1"));
  return explained;
}

}  // namespace loom::engine
