// The prune log of a checkpoint directory, for honest checkpoints.
//
// Retention deletes old checkpoints, and the rank that prunes reports what
// it deleted to the controller. A rank can be killed between the delete and
// the report (its attempt was fenced, its worker died), and then the
// controller's catalog would call a checkpoint that retention removed
// "missing". So a pruning rank first appends the checkpoint's directory
// name to <dir>/PRUNED (one name a line, written and fsync'd before the
// delete starts), and the catalog reads that log before it calls anything
// missing: a name in the log was pruned, whoever pruned it and whether or
// not the report arrived. Only the claim holder of the directory prunes
// (checkpoint_fence.h), so appends do not interleave.
#ifndef LOOM_COMMON_PRUNE_LOG_H_
#define LOOM_COMMON_PRUNE_LOG_H_

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

inline constexpr char kPruneLogName[] = "PRUNED";

// Appends `name` (a checkpoint's directory or file name inside `dir`, no
// '/' or newline) to <dir>/PRUNED and fsyncs it. INVALID_ARGUMENT for such
// a name; the I/O error otherwise.
absl::Status AppendPruneLog(const std::string& dir, const std::string& name);

// The names in <dir>/PRUNED; empty when there is no log. A torn last line
// (a crash during an append) is ignored.
absl::StatusOr<std::set<std::string>> ReadPruneLog(const std::string& dir);

}  // namespace loom

#endif  // LOOM_COMMON_PRUNE_LOG_H_
