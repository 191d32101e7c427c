// Small file helpers with no gRPC or LibTorch dependency.
#ifndef LOOM_COMMON_FILE_UTIL_H_
#define LOOM_COMMON_FILE_UTIL_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

// Whole file. NOT_FOUND if missing, PERMISSION_DENIED if unreadable.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Whole file, if it is a regular file this user owns, of at most
// `max_bytes`, opened without following a symlink: for state kept in a
// shared directory such as /tmp, which another user could have planted.
// NOT_FOUND if missing; FAILED_PRECONDITION if it is not such a file.
absl::StatusOr<std::string> ReadOwnedFile(const std::string& path, size_t max_bytes);

// Writes `contents` to `path` with `mode`, atomically (temp + fsync +
// rename; the temporary file is created afresh, never through a symlink).
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents,
                                 int mode = 0644);

// Same with mode 0600.
inline absl::Status WritePrivateFile(const std::string& path, const std::string& contents) {
  return WriteFileAtomically(path, contents, 0600);
}

// mkdir -p.
absl::Status MakeDirs(const std::string& path, int mode = 0755);

}  // namespace loom

#endif  // LOOM_COMMON_FILE_UTIL_H_
