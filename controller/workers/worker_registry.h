// The controller's worker registry: the workers that registered, their
// leases, and the rank slots (and GPUs) each holds. No gRPC types.
//
// A worker is alive from its registration until it has been silent (no
// heartbeat) for more than worker_timeout; then ExpireLeases declares it
// dead, and it stays dead: its heartbeats are NOT_FOUND and it must
// register again, under a new id. A node registering again means its
// previous daemon is gone: the coordinator removes the node's previous
// worker (RemoveNode) and learns what it held. The lease protocol the
// timeout belongs to is described in workers/worker_liveness.h.
//
// What a worker holds (slots, pending commands, unconfirmed starts) is data
// here; what it means for jobs (failing, restarting, re-adopting) is the
// coordinator's (workers/worker_liveness.h).
//
// Not thread-safe: the coordinator's mutex guards every call, and the
// Worker pointers and references handed out, which stay valid until that
// worker is removed (RemoveNode).
#ifndef LOOM_CONTROLLER_WORKERS_WORKER_REGISTRY_H_
#define LOOM_CONTROLLER_WORKERS_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "controller/admission/scheduler.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

struct WorkerRegistryOptions {
  // A worker whose last heartbeat is older than this is declared dead
  // (JobManagerOptions::worker_timeout).
  absl::Duration worker_timeout = absl::Seconds(10);
  // The controller's own pauses are not the workers' silence. When the
  // registry saw nothing for longer than this (neither an ExpireLeases
  // call, which the coordinator makes every ~100 ms, nor a heartbeat), the
  // controller was not running (its host or VM frozen, the process stopped
  // or starved): the time beyond this is not counted against the workers
  // it had heard from before the gap, so a worker that heartbeats within
  // its timeout of the controller waking is not declared dead for the
  // controller's absence. That includes a worker heard after the last
  // check but just before the pause. Only declarations are delayed (never
  // the other way), by at most the pauses; checks that keep coming late
  // still expire a silent worker, more slowly. InfiniteDuration: no pause
  // is credited.
  absl::Duration pause_threshold = absl::InfiniteDuration();
};

class WorkerRegistry {
 public:
  struct RankSlot {
    std::string job_id;
    int rank = 0;
    int gpu = -1;  // the GPU it holds on the worker, or -1
  };
  struct Worker {
    loom::v1::WorkerInfo info;
    absl::Time last_heartbeat;
    // What its silence is counted from: last_heartbeat, moved later by the
    // controller's own pauses since (WorkerRegistryOptions::pause_threshold).
    absl::Time lease_from;
    int rendezvous_port = 0;  // 0 = none fresh since last use
    std::vector<loom::v1::WorkerCommand> pending_commands;
    std::vector<RankSlot> ranks;  // ranks placed here and not yet exited
    // Starts delivered but not yet confirmed (by the rank showing up as
    // running, or exiting), with when they were last sent. A heartbeat
    // response can be lost; unconfirmed starts are sent again.
    std::map<std::pair<std::string, int>, std::pair<loom::v1::StartRank, absl::Time>> unacked;
    // The registry's own: where an alive worker sits in the lease order.
    std::list<Worker*>::iterator lease_entry;
  };
  // A worker that left the alive set (declared dead, or replaced by its
  // node's new worker), and what it held then.
  struct DepartedWorker {
    loom::v1::WorkerInfo info;  // as it was; info.alive(): it was alive until now
    absl::Time last_heartbeat;
    absl::Duration silent;         // how long it had been silent then
    absl::Duration paused;         // of that, the controller's own pauses (not counted)
    std::vector<RankSlot> ranks;   // the slots it held (none if it was dead already)
  };
  struct HeartbeatRecord {
    Worker* worker = nullptr;
    // It had no fresh rendezvous port and now has one (a job waiting for
    // it may be placed).
    bool rendezvous_port_came = false;
  };

  // `clock` must outlive the registry.
  WorkerRegistry(const Clock* clock, WorkerRegistryOptions options);

  // INVALID_ARGUMENT naming the field for a registration no worker may
  // make: empty node or address, slots < 1, gpus outside [0, 1024], a
  // measured figure that is negative or not finite, host_id over 256
  // characters. Changes nothing.
  static absl::Status ValidateRegistration(const loom::v1::RegisterWorkerRequest& req);

  // Removes the worker last registered on `node` (alive or dead) and
  // returns what it held; nullopt when the node has none. The alive count
  // drops if it was alive.
  std::optional<DepartedWorker> RemoveNode(const std::string& node);
  // Adds a worker for a request ValidateRegistration accepted, alive with a
  // heartbeat now and nothing held, under a new id "<node>-<6 hex digits>";
  // it becomes the node's worker. Remove the node's previous worker first
  // (RemoveNode): two workers of one node would both be offered.
  Worker& Add(const loom::v1::RegisterWorkerRequest& req);

  // Records a heartbeat of `worker_id` now, and the fresh rendezvous port it
  // offers (kept if in (0, 65536)). NOT_FOUND for an unknown or dead worker
  // (it must register again).
  absl::StatusOr<HeartbeatRecord> RecordHeartbeat(const std::string& worker_id,
                                                  int rendezvous_port);

  // Declares dead every alive worker silent for more than worker_timeout
  // (exactly worker_timeout is still alive): its pending commands are
  // dropped and its slots freed. Returns those workers in id order, with
  // the slots they held, for the coordinator to fail or restart the jobs
  // that had ranks there. Costs O(log n) per worker declared dead, not a
  // pass over every worker: it runs every tick, under the coordinator's
  // lock, with 10,000 workers heartbeating. (The lease order is the order
  // of heartbeats; should the clock step back, a worker is declared dead
  // late by at most that step, never early.) A gap longer than
  // options.pause_threshold since the registry last ran is credited to the
  // leases of the workers heard before it (see there): a pass over the
  // alive workers, only then.
  std::vector<DepartedWorker> ExpireLeases();
  // The controller pause time credited to leases so far.
  absl::Duration paused() const { return paused_; }

  // The worker with `id`, alive or dead; nullptr if none.
  Worker* Find(const std::string& id);
  const Worker* Find(const std::string& id) const;
  // The worker with `id` if it is alive; nullptr otherwise.
  Worker* FindAlive(const std::string& id);

  // What the scheduler may place on: every alive worker, in id order, with
  // its free slots and, when `with_free_gpus`, the GPUs no slot holds.
  std::vector<WorkerOffer> Offers(bool with_free_gpus) const;
  // Every registered worker's info as registered (dead ones too), in id
  // order: what the planner sees.
  std::vector<loom::v1::WorkerInfo> Infos() const;
  // Every registered worker, in id order, with slots_used and
  // last_heartbeat_unix_ms filled in (ListWorkers).
  std::vector<loom::v1::WorkerInfo> List() const;
  int alive_count() const { return alive_; }

  // --- slots
  void HoldSlot(Worker& w, RankSlot slot);
  // Rank `rank` of `job_id` exited on `w`: its slot is free and its start
  // no longer awaits confirmation.
  void RankExited(Worker& w, const std::string& job_id, int rank);
  // Frees the slots of `w` for which `gone` is true; whether any was.
  bool ReleaseSlotsIf(Worker& w, const std::function<bool(const RankSlot&)>& gone);
  // Frees every slot `job_id` holds, on every worker.
  void ReleaseJobSlots(const std::string& job_id);

  // --- cordons (by node: a worker that registers again keeps its node's)
  // Until `until` (InfiniteFuture: until Uncordon), the workers of `node`
  // are offered to no new rank (Offers leaves them out; ranks already there
  // keep running). Of two cordons of a node the one that ends later holds,
  // with its reason: a slow rank's 10-minute cordon does not shorten an
  // operator's. Returns the cordon in force afterwards.
  struct CordonEntry {
    absl::Time until;
    std::string reason;
  };
  CordonEntry Cordon(const std::string& node, absl::Time until, std::string reason);
  // Ends the node's cordon, whoever set it; whether it was cordoned.
  bool Uncordon(const std::string& node);
  // A cordon's end as the store keeps it (INT64_MAX: until uncordoned),
  // and back.
  static int64_t CordonEndToUnixMillis(absl::Time until);
  static absl::Time CordonEndFromUnixMillis(int64_t unix_ms);
  // Whether a worker has registered from `node` (alive or dead).
  bool HasNode(const std::string& node) const { return worker_by_node_.count(node) > 0; }
  // The worker registered on `node` (alive or not); null if none.
  const Worker* FindByNode(const std::string& node) const {
    auto it = worker_by_node_.find(node);
    return it == worker_by_node_.end() ? nullptr : Find(it->second);
  }
  // A worker on `node` holds its lease now.
  bool NodeAlive(const std::string& node) const {
    const Worker* w = FindByNode(node);
    return w != nullptr && w->info.alive();
  }
  // Whether `node` is cordoned now, and until when.
  bool IsCordoned(const std::string& node) const { return CordonedUntil(node).has_value(); }
  std::optional<absl::Time> CordonedUntil(const std::string& node) const;

 private:
  const Clock* const clock_;
  const WorkerRegistryOptions options_;
  std::map<std::string, Worker> workers_;              // by id, in id order
  // The same workers by id, for lookups: every heartbeat and step report
  // makes one, and a search of an ordered tree of 10,000 workers was ~6%
  // of the controller's CPU (perf, bench control-plane).
  std::unordered_map<std::string, Worker*> by_id_;
  std::map<std::string, std::string> worker_by_node_;  // node -> newest worker id there
  std::map<std::string, CordonEntry> cordons_;  // by node; expired ones linger harmlessly
  // The alive workers, by lease_from, oldest first.
  std::list<Worker*> lease_order_;
  // Credits a pause that ends at `now` (see pause_threshold) and marks the
  // registry active at `now`.
  void CreditPause(absl::Time now);
  // When ExpireLeases or RecordHeartbeat last ran (InfinitePast: never),
  // and the pause time credited to workers' leases so far.
  absl::Time last_activity_ = absl::InfinitePast();
  absl::Duration paused_ = absl::ZeroDuration();
  int alive_ = 0;
  uint64_t nonce_;  // makes ids of one node differ across controller runs
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_WORKERS_WORKER_REGISTRY_H_
