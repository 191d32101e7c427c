#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace loom {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> ReadOwnedFile(const std::string& path, size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      static_cast<size_t>(st.st_size) > max_bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": not a regular file of this user's of at most ", max_bytes, " bytes"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = read(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(off);
  return text;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents, int mode) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  unlink(tmp.c_str());  // a leftover, or something planted: created afresh below
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(tmp, ": ", std::strerror(errno)));
  fchmod(fd, mode);
  size_t off = 0;
  while (off < contents.size()) {
    ssize_t n = write(fd, contents.data() + off, contents.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat(tmp, ": write failed: ", std::strerror(err)));
    }
    off += n;
  }
  if (fsync(fd) != 0) {
    int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat(tmp, ": fsync failed: ", std::strerror(err)));
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("rename to ", path, ": ", std::strerror(err)));
  }
  // The rename is durable only once the directory entry is on disk.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path, int mode) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if ((i == path.size() || path[i] == '/') && !cur.empty()) {
      if (mkdir(cur.c_str(), mode) != 0) {
        struct stat st;
        if (errno != EEXIST) {
          return absl::PermissionDeniedError(
              absl::StrCat("mkdir ", cur, ": ", std::strerror(errno)));
        }
        if (stat(cur.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
          return absl::FailedPreconditionError(absl::StrCat(cur, " exists and is not a directory"));
        }
      }
    }
    if (i < path.size()) cur.push_back(path[i]);
  }
  return absl::OkStatus();
}

}  // namespace loom
