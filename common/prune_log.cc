#include "common/prune_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"

namespace loom {

absl::Status AppendPruneLog(const std::string& dir, const std::string& name) {
  if (name.empty() || name.find_first_of("/\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("prune log: \"", name, "\" is not a checkpoint name"));
  }
  const std::string path = absl::StrCat(dir, "/", kPruneLogName);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  }
  // The leading newline ends a line that a crash tore mid-append, so that
  // this name is never glued to its remains.
  const std::string line = "\n" + name + "\n";
  const ssize_t n = ::write(fd, line.data(), line.size());
  const int write_errno = errno;
  const int sync = n == static_cast<ssize_t>(line.size()) ? ::fsync(fd) : -1;
  const int sync_errno = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) {
    return absl::UnavailableError(
        absl::StrCat("append to ", path, ": ", n < 0 ? std::strerror(write_errno) : "short write"));
  }
  if (sync != 0) {
    return absl::UnavailableError(absl::StrCat("fsync ", path, ": ", std::strerror(sync_errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::set<std::string>> ReadPruneLog(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(absl::StrCat(dir, "/", kPruneLogName));
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return std::set<std::string>();
    return text.status();
  }
  std::set<std::string> names;
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  // Every complete line ends with '\n': the piece after the last one is
  // empty, or a torn append.
  lines.pop_back();
  for (std::string& line : lines) {
    if (!line.empty()) names.insert(std::move(line));
  }
  return names;
}

}  // namespace loom
