// Small file helpers with no gRPC or LibTorch dependency.
#ifndef LOOM_COMMON_FILE_UTIL_H_
#define LOOM_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

// Whole file. NOT_FOUND if missing, PERMISSION_DENIED if unreadable.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to `path` with `mode`, atomically (temp + fsync + rename).
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
