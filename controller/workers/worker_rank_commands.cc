#include "controller/workers/worker_rank_commands.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>


namespace loom::controller {

using Worker = WorkerRegistry::Worker;
using RankSlot = WorkerRegistry::RankSlot;
using loom::v1::JobState;

void WorkerRankCommands::Stop(const JobRecord& rec, const std::string& reason,
                              const std::string& except_worker) {
  std::set<std::string> workers;
  for (const auto& r : rec.job.ranks()) workers.insert(r.worker_id());
  for (const std::string& wid : workers) {
    if (wid == except_worker) continue;
    Worker* found = workers_->FindAlive(wid);
    if (found == nullptr) continue;
    Worker& w = *found;
    // A start that was never delivered is simply withdrawn.
    auto& cmds = w.pending_commands;
    cmds.erase(std::remove_if(cmds.begin(), cmds.end(),
                              [&](const loom::v1::WorkerCommand& c) {
                                return c.has_start() && c.start().job_id() == rec.job.id();
                              }),
               cmds.end());
    loom::v1::WorkerCommand cmd;
    cmd.mutable_stop()->set_job_id(rec.job.id());
    cmd.mutable_stop()->set_reason(reason);
    cmds.push_back(std::move(cmd));
  }
}

void WorkerRankCommands::SaveAndStop(const JobRecord& rec, const std::string& reason) {
  std::set<std::string> workers;
  for (const auto& r : rec.job.ranks()) workers.insert(r.worker_id());
  for (const std::string& wid : workers) {
    Worker* w = workers_->FindAlive(wid);
    if (w == nullptr) continue;
    loom::v1::WorkerCommand cmd;
    loom::v1::StopRank* stop = cmd.mutable_stop();
    stop->set_job_id(rec.job.id());
    stop->set_generation(rec.job.generation());
    stop->set_checkpoint_first(true);
    stop->set_reason(reason);
    w->pending_commands.push_back(std::move(cmd));
  }
}

}  // namespace loom::controller
