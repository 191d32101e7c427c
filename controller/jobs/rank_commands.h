// What the job table and the subsystems ask of a job's running ranks. The
// implementation (workers/worker_rank_commands.h) queues the commands on
// the workers' next heartbeat answers; tests may record them instead.
// Called with the controller's lock held.
#ifndef LOOM_CONTROLLER_JOBS_RANK_COMMANDS_H_
#define LOOM_CONTROLLER_JOBS_RANK_COMMANDS_H_

#include <string>

#include "controller/jobs/job_record.h"

namespace loom::controller {

class RankCommands {
 public:
  virtual ~RankCommands() = default;
  // Stops every rank of `rec`'s current attempt (on every alive worker but
  // `except_worker`), withdrawing starts not yet delivered.
  virtual void Stop(const JobRecord& rec, const std::string& reason,
                    const std::string& except_worker) = 0;
  // Asks every rank of `rec`'s current attempt to save a checkpoint at its
  // next step boundary and then stop (StopRank.checkpoint_first).
  virtual void SaveAndStop(const JobRecord& rec, const std::string& reason) = 0;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOBS_RANK_COMMANDS_H_
