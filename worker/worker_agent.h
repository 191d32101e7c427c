// The worker daemon's control loop: registers with the controller,
// heartbeats (reporting running ranks and a free rendezvous port, receiving
// start/stop commands), starts and stops ranks through RankSupervisor, and
// forwards rank events and exits to the controller.
//
// Faults: the worker holds a lease renewed by every answered
// heartbeat; past its grace it kills its ranks (EnforceLease). When the
// controller forgets it (a restart), it registers again with the ranks
// still running, which the controller re-adopts. Reports are kept and
// retried, in order, while the controller is unreachable or the worker is
// re-registering; a report the controller refuses as from a stale attempt
// stops that attempt's ranks here.
//
// Thread model: Run() owns the heartbeat loop on the caller's thread; one
// sender thread drains the outgoing queue of events/exits. Rank callbacks
// only enqueue. Stop() ends both and is safe from any thread.
#ifndef LOOM_WORKER_WORKER_AGENT_H_
#define LOOM_WORKER_WORKER_AGENT_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "loom/v1/service.grpc.pb.h"
#include "worker/checkpoint_uploader.h"
#include "worker/controller_link.h"
#include "worker/free_port.h"
#include "worker/log_shipper.h"
#include "worker/rank_supervisor.h"

namespace loom::worker {

struct WorkerOptions {
  std::string node;              // defaults to the host name
  std::string address = "127.0.0.1";  // how other ranks reach this node
  std::string zone;              // failure domains, reported at registration;
  std::string rack;              // empty = not known
  // The machine this worker shares with any other worker that reports the
  // same id (RegisterWorkerRequest.host_id); empty = the kernel's boot id.
  std::string host_id;
  int slots = 1;
  // Memory lent to ranks, reported at registration for the planner (which
  // divides it over the slots); 0 = the host's RAM.
  uint64_t memory_bytes = 0;
  int gpus = 0;                  // GPUs ranks may train on (CUDA devices 0..gpus-1)
  std::string token;
  std::string rank_binary;
  std::string work_dir;
  std::string metrics_address;   // reported to the controller
  // Measured at start-up (cpu_probe.h) and reported at registration for the
  // controller's planner; 0 = not measured (the controller then estimates).
  double gemm_flops_per_second_per_thread = 0;
  double memory_bandwidth_bytes_per_second = 0;
  std::string gemm_source;
  // `loom-rank --probe` (cpu_probe.h, ProbeBlocks); 0 = not measured.
  double block_fixed_seconds = 0;
  double block_seconds_per_activation = 0;
  double allreduce_latency_seconds = 0;
  double allreduce_bytes_per_second = 0;
  double tensor_collective_extra_seconds = 0;
  double tensor_collective_idle_fraction = 0;
  double concurrent_slowdown = 0;
  // Carbon intensity of this node's electricity, grams CO2-eq per kWh; the
  // ranks' energy times this is exported as loom_worker_co2_grams_total.
  double grid_intensity_g_per_kwh = 475;
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration stop_grace = absl::Seconds(5);
  // Warm ranks (RankSupervisorOptions::warm_ranks, warm_after).
  int warm_ranks = 0;
  absl::Duration warm_after = absl::Seconds(20);
  // Called on Run()'s thread when the worker becomes registered (true) and
  // when the controller forgets it or Run() returns (false). Optional.
  std::function<void(bool registered)> on_registration;
  // The object-store tier's uploads (checkpoint_uploader.h): part size,
  // files at once, the send-rate cap, the CPUs they may use, and when a slow
  // store counts as failed, so that an upload never takes more of the node
  // than stated. `uploader` and `config` are set by the agent.
  CheckpointUploader::Options upload;
  // Whether this node is going away (node_notice.h), asked at every
  // heartbeat, which then carries it. Optional.
  std::function<std::optional<loom::v1::NodeNotice>()> notice;
};

class WorkerAgent {
 public:
  // `stub` and `registry` are shared with the caller; the agent keeps them.
  WorkerAgent(WorkerOptions options, std::shared_ptr<loom::v1::WorkerService::StubInterface> stub,
              std::shared_ptr<metrics::Registry> registry);
  // Several controllers (active/standby): `link` follows the leader.
  WorkerAgent(WorkerOptions options, std::shared_ptr<ControllerLink> link,
              std::shared_ptr<metrics::Registry> registry);
  ~WorkerAgent();

  // Registers (retrying while the controller is unreachable) and heartbeats
  // until Stop(). Re-registers when the controller forgets this worker.
  void Run();
  void Stop();
  // How many ranks run here now.
  size_t RanksRunning();
  // No rank runs or is being reaped, and every report queued so far (step
  // events, rank exits) has been delivered to the controller or given up.
  // A worker leaving after a drain waits for this: its ranks' exits tell
  // the controller that they saved and stopped; without them it would count
  // the ranks lost when the worker's lease ran out.
  bool Quiet();

 private:
  struct Outgoing {
    bool is_exit = false;
    std::string job_id;
    int64_t generation = 0;
    loom::v1::RankEvent event;
    RankExit exit;
  };
  absl::Status Register();
  // One heartbeat, answered within `timeout`; an answer renews the lease
  // from when it was sent.
  absl::Status HeartbeatOnce(absl::Duration timeout);
  // Kills every rank when no heartbeat or registration has been answered
  // for the lease grace (counted from when it was sent); see
  // controller/job_manager.h on why the controller's times are ordered
  // after it. With `last_chance`, it first sends one more heartbeat,
  // answered within LastChance(grace), and keeps the ranks if that renews
  // the lease: the controller answers a worker's heartbeat only while it
  // holds the worker alive, so while it has placed none of the worker's
  // ranks elsewhere. That is the case after this host, or this worker, was
  // paused past the grace (a VM frozen, a stall) while the controller still
  // counts the worker alive (it does not count its own pauses either); the
  // answer comes at once, where before the ranks were killed and the job
  // restarted for nothing. Cut off, the worker kills its ranks at most
  // LastChance(grace) later than without it, which the controller's lease
  // margin covers.
  void EnforceLease(bool last_chance);
  // The last heartbeat's deadline: a tenth of the grace, at most 0.5 s
  // (the controller's lease margin is 2 s).
  static absl::Duration LastChance(absl::Duration grace) {
    return std::min(absl::Milliseconds(500), grace / 10);
  }
  // A regular heartbeat's deadline: rpc_timeout, but while ranks run here
  // no later than LastChance(grace) past the lease's end, so that a
  // heartbeat hanging on a cut-off controller cannot hold back
  // EnforceLease (rpc_timeout, 5 s, is longer than a short grace: with a
  // 3 s lease the ranks were killed 5.5 s after the last answer, past the
  // controller's 5 s, and once trained on to the end).
  absl::Duration HeartbeatTimeout();
  // The lease as it stands: when it was last renewed (InfinitePast: never)
  // and its grace.
  struct LeaseView {
    absl::Time renewed;
    absl::Duration grace;
  };
  LeaseView Lease();
  void HandleCommand(const loom::v1::WorkerCommand& cmd);
  void SenderLoop();
  // Calls `call` with the current worker id until it is neither
  // unreachable (UNAVAILABLE, DEADLINE_EXCEEDED, with backoff up to 1 s) nor
  // answered "unknown worker" (then it waits for the next registration),
  // or the agent stops. Returns the last status.
  grpc::Status Deliver(const std::function<grpc::Status(const std::string& worker_id)>& call);
  void OnEvent(const std::string& job_id, int rank, int64_t generation,
               const loom::v1::RankEvent& event);
  void OnExit(const RankExit& exit);
  // Queues `e` for the controller, in the report of `job_id`'s attempt.
  void Queue(const std::string& job_id, int64_t generation, const loom::v1::RankEvent& e);
  // A call's context with the token and a deadline `timeout` from now
  // (rpc_timeout unless given).
  std::unique_ptr<grpc::ClientContext> NewContext();
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout);

  const WorkerOptions options_;
  // Makes one call through the link: `call(stub, ctx)` with a context from
  // NewContext(timeout), then lets the link see how it went.
  template <typename Call>
  grpc::Status CallController(absl::Duration timeout, Call call, ControllerLink::Target* used);
  std::shared_ptr<ControllerLink> link_;
  std::shared_ptr<metrics::Registry> registry_;

  std::mutex mu_;
  std::condition_variable cv_;
  static constexpr size_t kMaxOutgoing = 100000;
  std::deque<Outgoing> outgoing_;   // guarded by mu_; at most kMaxOutgoing
  bool sending_ = false;            // guarded by mu_: the sender holds a batch
  std::string worker_id_;           // guarded by mu_
  absl::Duration heartbeat_interval_ = absl::Milliseconds(500);
  // The lease: when the last answered heartbeat or registration was sent
  // (InfinitePast: never), and the grace the controller gave.
  absl::Time lease_renewed_ = absl::InfinitePast();   // guarded by mu_
  absl::Duration lease_grace_ = absl::Seconds(10);    // guarded by mu_
  std::atomic<bool> stop_{false};

  metrics::Family<metrics::Gauge>& step_time_;
  metrics::Family<metrics::Gauge>& tokens_per_second_;
  metrics::Family<metrics::Gauge>& loss_;
  metrics::Family<metrics::Gauge>& val_loss_;
  metrics::Family<metrics::Gauge>& lr_;
  metrics::Family<metrics::Gauge>& step_;
  metrics::Family<metrics::Counter>& tokens_total_;
  metrics::Family<metrics::Gauge>& mfu_;
  metrics::Family<metrics::Gauge>& model_flops_;
  metrics::Family<metrics::Gauge>& peak_flops_;
  metrics::Family<metrics::Gauge>& memory_;
  metrics::Family<metrics::Gauge>& power_;
  metrics::Family<metrics::Counter>& energy_;
  metrics::Family<metrics::Gauge>& phase_;             // last step's split
  metrics::Family<metrics::Counter>& phase_total_;     // cumulative split
  metrics::Family<metrics::Counter>& nonfinite_skipped_;
  metrics::Family<metrics::Gauge>& loss_scale_;
  metrics::Family<metrics::Counter>& checkpoint_failures_;
  metrics::Family<metrics::Gauge>& batches_skipped_;
  metrics::Family<metrics::Gauge>& total_steps_;
  metrics::Family<metrics::Counter>& co2_;
  metrics::Gauge& grid_intensity_;
  metrics::Family<metrics::Counter>& rank_exits_;
  metrics::Gauge& ranks_running_;
  metrics::Counter& heartbeats_failed_;
  int64_t failed_heartbeats_in_a_row_ = 0;  // touched by Run() only
  metrics::Counter& lease_kills_;
  metrics::Counter& lease_last_chance_renewals_;

  // Per-job series of ranks that ended, with when: removed after
  // kSeriesGracePeriod so the last values get scraped but finished jobs do
  // not pile up series. Touched only by the heartbeat thread (Run) and OnExit
  // under mu_.
  static constexpr absl::Duration kSeriesGracePeriod = absl::Minutes(5);
  std::vector<std::pair<metrics::Labels, absl::Time>> ended_series_;  // guarded by mu_
  void RemoveEndedSeries(absl::Time now);

  // Ships the ranks' logs (log_shipper.h) from its own thread, every
  // kLogShipInterval, so a slow log never holds up step reports.
  static constexpr absl::Duration kLogShipInterval = absl::Milliseconds(250);
  void LogLoop();
  // The rank-0 jobs here with a remote tier: job id -> (attempt, where its
  // checkpoints go and what the store keeps). Under mu_.
  std::map<std::string, std::pair<int64_t, CheckpointUploader::RemoteTier>> remote_tiers_;
  std::unique_ptr<CheckpointUploader> uploader_;  // reports through Queue
  std::unique_ptr<LogShipper> log_shipper_;     // outlives the supervisor, which feeds it
  std::unique_ptr<RankSupervisor> supervisor_;  // destroyed before the members above
  std::thread sender_;
  std::thread log_sender_;
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_WORKER_AGENT_H_
