// What checkpoint retention would delete now from each tier of a job, and
// why (`loomctl checkpoints gc JOB --dry-run`). The pruning itself happens
// where the checkpoints are written: rank 0 prunes the checkpoint directory
// after each commit, the worker that uploads prunes the object store after
// each upload. This class reaches the same verdicts with the same function
// (common/formats/retention.h) from what the tiers hold now, and deletes
// nothing. It reads the directory and the object store, so callers must
// not hold locks others need while it runs. No gRPC types but the messages.
#ifndef LOOM_CONTROLLER_CHECKPOINTS_RETENTION_PLANNER_H_
#define LOOM_CONTROLLER_CHECKPOINTS_RETENTION_PLANNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/object_store/s3_config.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class RetentionPlanner {
 public:
  using ConfigSource = std::function<absl::StatusOr<object_store::S3Config>()>;
  // `config`: where the object store is and who may read it (default: the
  // process environment, as the workers take it).
  explicit RetentionPlanner(ConfigSource config = nullptr);

  // The verdicts for `job` (its spec says the tiers, the policies and the
  // rollback window), with `holds` (jobs/job_table.h CheckpointHolds) kept.
  // An object store that cannot be listed is remote_error, not an error.
  loom::v1::PlanCheckpointRetentionResponse Plan(const loom::v1::Job& job,
                                                 const std::map<int64_t, std::string>& holds);

 private:
  ConfigSource config_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_CHECKPOINTS_RETENTION_PLANNER_H_
