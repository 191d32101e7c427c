// RankCommands over the worker registry: each command is queued on the
// worker's next heartbeat answer (Worker::pending_commands). Called with
// the controller's lock held.
#ifndef LOOM_CONTROLLER_WORKERS_WORKER_RANK_COMMANDS_H_
#define LOOM_CONTROLLER_WORKERS_WORKER_RANK_COMMANDS_H_

#include <string>

#include "controller/jobs/rank_commands.h"
#include "controller/workers/worker_registry.h"

namespace loom::controller {

class WorkerRankCommands : public RankCommands {
 public:
  // `workers` must outlive this.
  explicit WorkerRankCommands(WorkerRegistry* workers) : workers_(workers) {}
  void Stop(const JobRecord& rec, const std::string& reason,
            const std::string& except_worker) override;
  void SaveAndStop(const JobRecord& rec, const std::string& reason) override;

 private:
  WorkerRegistry* const workers_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_WORKERS_WORKER_RANK_COMMANDS_H_
