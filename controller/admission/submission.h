// Submission: a spec (defaults applied and validated by the caller) is
// given its queue and priority, its paths confined (path_policy.h), its
// init_from resolved to a checkpoint, its checkpoint directory checked
// free, and a plan for the live workers (job_planning.h); it is stored
// PENDING, durably, before it is answered.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_ADMISSION_SUBMISSION_H_
#define LOOM_CONTROLLER_ADMISSION_SUBMISSION_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "controller/admission/job_planning.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/jobs/job_table.h"
#include "controller/scheduling/queue_config.h"
#include "controller/workers/worker_registry.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class Submissions {
 public:
  struct Options {
    // See JobManagerOptions.
    std::string checkpoint_root;
    std::vector<std::string> extra_checkpoint_roots;
    std::vector<std::string> data_roots;
  };
  // All must outlive this.
  Submissions(JobTable* jobs, const WorkerRegistry* workers, CheckpointCatalog* catalog,
              const Clock* clock, const scheduling::QueueConfig* queues, Options options);

  // `valid` is ValidateJobSpec's verdict on `spec` (defaults applied): its
  // INVALID_ARGUMENT / UNIMPLEMENTED is returned (a tensor or pipeline
  // layout that would not even fit the live workers says so). Then the
  // queue and priority must be ones the configuration defines, and `role`
  // ("user", "admin"; empty: not checked) one the queue takes, else
  // PERMISSION_DENIED naming scheduling.queue; paths are confined, init_from
  // resolved, the checkpoint directory checked free; the plan
  // (parallelism.auto chooses the degrees, an explicit layout is evaluated)
  // must fit the registered workers, else INVALID_ARGUMENT naming the
  // parallelism field. The job, stored PENDING with `submitted_by`, or
  // UNAVAILABLE when the store did not take it (nothing kept).
  absl::StatusOr<JobRecord*> Submit(loom::v1::JobSpec spec, const absl::Status& valid,
                                    std::string submitted_by, absl::string_view role);
  // The live cluster as the planner sees it, for `spec`'s gang.
  absl::StatusOr<LiveTopology> LiveTopologyFor(const loom::v1::JobSpec& spec) const;
  // Plans `request`'s spec (defaults applied, validated; layouts that do not
  // execute yet are allowed) on its topology_yaml, or else on `live`
  // (called once; it takes the lock itself). INVALID_ARGUMENT for a bad
  // spec, topology or top_k; FAILED_PRECONDITION when nothing fits. Pure
  // computation: called without the lock.
  static absl::StatusOr<loom::v1::PlanResponse> Plan(
      const loom::v1::PlanRequest& request,
      const std::function<absl::StatusOr<LiveTopology>(const loom::v1::JobSpec&)>& live);

 private:
  // FAILED_PRECONDITION naming checkpoint.dir if an unfinished job's
  // checkpoint directory is `dir`, or holds it, or lies inside it.
  absl::Status CheckCheckpointDirFree(const std::string& dir) const;
  // init_from.job (and step) -> init_from.path: that job's committed
  // checkpoint at the step (0: its newest), whose model must be this
  // spec's. INVALID_ARGUMENT naming the field otherwise.
  absl::Status ResolveInitFrom(loom::v1::JobSpec* spec);

  JobTable* const jobs_;
  const WorkerRegistry* const workers_;
  CheckpointCatalog* const catalog_;
  const Clock* const clock_;
  const scheduling::QueueConfig* const queues_;
  const Options options_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_ADMISSION_SUBMISSION_H_
