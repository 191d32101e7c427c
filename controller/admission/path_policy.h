// Where a job may read and write: the controller
// confines every job's data and checkpoint paths to roots it is configured
// with, so that a spec cannot make ranks read /etc/shadow or prune /etc.
//
// A path is confined after resolving it as the ranks would: it must be
// absolute; ".", ".." and symlinks are resolved for the part that exists
// (std::filesystem::weakly_canonical) and the rest is normalised
// lexically; the result must equal a root or lie beneath it, component by
// component (so /srv/data2 is not under /srv/data), the root resolved the
// same way. A data entry with wildcards (data.train: ["/srv/data/x_*.bin"])
// is confined by the directory before its first wildcard component, and a
// wildcard component may not be "..". The spec is rewritten to the resolved
// paths, so a symlink swapped in after the check does not move a job's
// checkpoint directory elsewhere (a symlink made later *inside* a root is
// the root owner's business).
#ifndef LOOM_CONTROLLER_ADMISSION_PATH_POLICY_H_
#define LOOM_CONTROLLER_ADMISSION_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

struct PathRoots {
  // Where data.train / data.validation may point (--data_root, several).
  // Empty: data paths are not confined (the controller warns at start).
  std::vector<std::string> data;
  // Where checkpoint.dir may point (--checkpoint_root, several); the first
  // is also where jobs that name no directory get <root>/<job id>.
  std::vector<std::string> checkpoint;
};

// `path` resolved and confined to `roots` (non-empty), or INVALID_ARGUMENT
// starting with `field`: "<field>: <path> is outside ...; allowed: <roots>".
absl::StatusOr<std::string> ConfinePath(absl::string_view field, const std::string& path,
                                        const std::vector<std::string>& roots);

// Confines (and rewrites) spec.data.train[i], spec.data.validation[i] and a
// non-empty spec.checkpoint.dir, which must lie strictly beneath a root.
// The first error, naming its field.
absl::Status ConfineJobPaths(const PathRoots& roots, loom::v1::JobSpec* spec);

// True if `path` equals `root` or lies beneath it, component by component
// (both already resolved).
bool PathIsUnder(const std::string& path, const std::string& root);

// Splits a comma-separated flag value; empty items are dropped.
std::vector<std::string> SplitRoots(absl::string_view flag);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_ADMISSION_PATH_POLICY_H_
