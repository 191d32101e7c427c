// Operators' actions on nodes: cordon, uncordon and drain.
//
// A cordon keeps a node's workers out of placement (WorkerRegistry::Cordon)
// and is written to the store, so that it outlives a controller restart and
// a failover; an operator's cordon lasts until it is uncordoned unless it
// was given a time. A drain cordons the node, then moves every job whose
// current attempt has ranks there through the preemptor's save-and-stop
// (MoveIntent::kDrain): a DRAINING event names the node, who asked and the
// deadline; once the job's ranks are gone (FinishMove) a DRAINED event
// gives the checkpoint it resumes from and the steps that cost (0 when the
// save committed in time), and the job is re-planned without the node
// (elastic, through the replanner) or placed again elsewhere. No restart is
// counted. A job whose ranks had not started training is moved at once.
//
// Nodes of a pool that scales down drain a few seconds apart. So that an
// elastic job moves once, not once per node, a drained elastic job is
// re-planned only when no node has drained for kSettle: until then it waits
// PENDING (not placed), and the re-plan leaves out every node drained
// meanwhile (Tick).
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_DRAINS_DRAINS_H_
#define LOOM_CONTROLLER_DRAINS_DRAINS_H_

#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/admission/schedule_signal.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/elastic/replanner.h"
#include "controller/jobs/job_table.h"
#include "controller/preemption/preemptor.h"
#include "controller/store/store.h"
#include "controller/workers/worker_registry.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class Drains : public MoveHandler {
 public:
  static constexpr size_t kMaxReasonBytes = 512;
  static constexpr int64_t kMaxCordonSeconds = 366 * 24 * 3600;
  static constexpr int64_t kMaxDeadlineSeconds = 24 * 3600;
  static constexpr absl::Duration kSettle = absl::Seconds(5);

  // All must outlive this; `replanner` may be null (then no job is
  // re-planned: each is placed again as it was).
  Drains(JobTable* jobs, WorkerRegistry* workers, Preemptor* preemptor, Replanner* replanner,
         CheckpointCatalog* catalog, Store* store, ScheduleSignal* schedule, const Clock* clock);

  // `by` is who asked, as events and the cordon's reason record it ("user
  // 'ada'"). Each answers INVALID_ARGUMENT naming the field for an empty or
  // over-long node, a reason over kMaxReasonBytes, or a time out of range;
  // NOT_FOUND for a node no worker has registered from; UNAVAILABLE when
  // the store does not take the cordon (then nothing changed).
  absl::StatusOr<loom::v1::CordonNodeResponse> Cordon(const loom::v1::CordonNodeRequest& request,
                                                      const std::string& by);
  absl::StatusOr<loom::v1::CordonNodeResponse> Uncordon(
      const loom::v1::UncordonNodeRequest& request, const std::string& by);
  absl::StatusOr<loom::v1::DrainNodeResponse> Drain(const loom::v1::DrainNodeRequest& request,
                                                    const std::string& by);

  // A worker's heartbeat carries its node's notice (a SIGTERM, a notice
  // file, a cloud's spot or preemption notice): the node is drained by the
  // notice's deadline, once per worker and notice (a sooner deadline drains
  // again; a node's daemon that registers again is a new worker).
  // Its cordon ends when a new worker registers from the node (Registered),
  // or a minute after the deadline. The events name the source
  // and how long the notice gave ("aws-spot notice, 118s before the node
  // goes").
  void Notice(const loom::v1::WorkerInfo& worker, const loom::v1::NodeNotice& notice);
  // A worker registered from `node`: a cordon that a notice of the node's
  // previous daemon set is lifted, since the node is back (a pod replaced,
  // `local restart`); an operator's cordon stays.
  void Registered(const std::string& node, const std::string& worker_id);
  // The worker's heartbeat carries no notice (any it had was taken back):
  // a later notice is a new one. What was drained stays drained.
  void NoNotice(const std::string& worker_id) {
    if (!noticed_.empty()) noticed_.erase(worker_id);
  }

  // A drained job's ranks are all gone: DRAINED, then re-planned or
  // placed again.
  void FinishMove(JobRecord& rec, const PreemptionInProgress& move) override;
  // Each tick: re-plans the drained elastic jobs once drains have settled.
  void Tick();

 private:
  absl::Status CheckNode(const std::string& node) const;
  // Cordons `node` until `cordon_until` and moves its jobs, each asked to
  // save within `deadline` (0: the queues' grace); `who` says who and why.
  absl::StatusOr<loom::v1::DrainNodeResponse> DrainFor(const std::string& node,
                                                       absl::Duration deadline,
                                                       absl::Time cordon_until,
                                                       const std::string& who);
  // Cordons `node` until `until` in the registry and the store.
  absl::Status Put(const std::string& node, absl::Time until, const std::string& reason);
  // The node's workers as ListWorkers shows them.
  google::protobuf::RepeatedPtrField<loom::v1::WorkerInfo> WorkersOf(const std::string& node) const;

  JobTable* const jobs_;
  WorkerRegistry* const workers_;
  Preemptor* const preemptor_;
  Replanner* const replanner_;
  CheckpointCatalog* const catalog_;
  Store* const store_;
  ScheduleSignal* const schedule_;
  const Clock* const clock_;
  std::map<std::string, absl::Time> noticed_;     // worker id -> its notice's deadline
  absl::Time last_drain_ = absl::InfinitePast();  // the newest drain or notice
  // Nodes whose cordon a notice set -> the worker that gave it.
  std::map<std::string, std::string> notice_cordons_;
  std::set<std::string> drained_lately_;          // nodes drained since the last settle
  // Drained elastic jobs waiting to be re-planned (job id -> the layout
  // generation they waited with: one re-planned meanwhile is left alone).
  std::map<std::string, int64_t> replans_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_DRAINS_DRAINS_H_
