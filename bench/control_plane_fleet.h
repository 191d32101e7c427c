// A fleet of simulated Loom workers in one process, for the control-plane
// benchmark (bench/control_plane_bench.cc). Over real gRPC, each
// simulated worker does what worker/worker_agent.cc does, minus the ranks:
//   * registers (RegisterWorkerRequest with valid measured figures, a
//     host id of its own), again a second after a failure, and again at
//     once, with the ranks it runs, when a heartbeat answers NOT_FOUND;
//   * heartbeats with the ranks it runs and a rendezvous port, one at a
//     time, a period (jittered) after the previous one was answered (the
//     first at a random phase), as WorkerAgent::Run does;
//   * takes StartRank / StopRank commands from the answers: a started rank
//     is listed as running (with its generation) from the next heartbeat
//     on, and "trains": it finishes a step every step period from its
//     start, whatever the controller does. Its steps go to the controller
//     through ReportStepMetrics, filled as worker/rank_main.cc fills them,
//     one report at a time, each carrying every step finished since the
//     last (as WorkerAgent::SenderLoop batches a job's events; at most
//     kMaxStepsPerReport, the oldest dropped as the worker's bounded queue
//     drops them). A report answered `stop` or FAILED_PRECONDITION (a
//     stale attempt) ends the rank, as the worker's supervisor would.
// Watchers stream WatchJob on given jobs and time each step event from the
// step's time_unix_ms to its arrival.
//
// Threads: `queues` threads, each the only one to call Next on its
// grpc::CompletionQueue. Every worker, rank and watcher belongs to one
// queue and its state is touched only by that queue's thread (once its
// first RPC is out). Fleet's public methods are called from one other
// thread (the benchmark's main thread).
#ifndef LOOM_BENCH_CONTROL_PLANE_FLEET_H_
#define LOOM_BENCH_CONTROL_PLANE_FLEET_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "loom/v1/service.grpc.pb.h"

namespace loom::bench {

struct FleetOptions {
  std::string address;  // the controller, host:port
  std::string token;    // the workers' token (bearer)
  // The watchers' token: a user's (a worker's role may not watch jobs).
  std::string watch_token;
  int workers = 10000;
  int slots_per_worker = 1;
  // Connections to the controller, shared round-robin by the workers; each
  // channel has distinct arguments so that each is its own TCP connection.
  int channels = 16;
  int queues = 4;  // completion queues, one thread each (the bench: min(4, cores))
  std::chrono::milliseconds heartbeat_period{1000};
  double heartbeat_jitter = 0.05;  // each period uniform in period x [1 - j, 1 + j]
  std::chrono::milliseconds step_period{100};  // a running rank's step time
  // Every RPC's deadline: worker_agent.h's rpc_timeout.
  std::chrono::milliseconds rpc_deadline{5000};
  int registrations_in_flight = 64;  // at start-up, at most this many at once
  // Unary RPCs in flight at once, all kinds together (split evenly over the
  // queues); a send due beyond it waits, and its latency counts from when
  // it was due. The controller's synchronous gRPC server runs each RPC it
  // handles on a thread of its own with no cap (controller_main.cc): 10,000
  // workers' heartbeats stuck behind its lock grew it past the machine's
  // pid_max, failing every fork on the machine. The cap bounds that; a
  // healthy controller (11,000 RPCs/s answered within 50 ms: ~550 in
  // flight) stays under it.
  int max_rpcs_in_flight = 1024;
  uint64_t seed = 1;
};

// Counts and client-side latencies (from when the call was due, so any wait
// for a slot under FleetOptions::max_rpcs_in_flight included, to its
// completion, whatever its status) of the RPCs of one kind that were due
// while the window was open.
struct RpcStats {
  std::vector<double> latency_ms;
  // For each latency, when its RPC was due: seconds on the steady clock.
  std::vector<double> due_s;
  // For each latency, the part from when the call was started to its
  // completion (leaves out this process's lateness in sending it).
  std::vector<double> round_trip_ms;
  std::map<grpc::StatusCode, int64_t> codes;
  int64_t sent = 0;
  void Merge(const RpcStats& other);
};

struct FleetStats {
  RpcStats heartbeat;
  RpcStats step;
  // Steps the reports sent in the window carried, and steps dropped
  // unreported because too many piled up (whole run).
  int64_t steps_sent = 0;
  int64_t steps_dropped = 0;
  // Sends due in the window that started over 1 ms after they were due:
  // the load generator's own delay (a busy completion-queue thread, a late
  // timer, or a wait for a slot under max_rpcs_in_flight), which the
  // latencies "from due" include and those "from the call's start" do not.
  int64_t started_late = 0;
  // Step events the watchers received in the window, and for each the time
  // from the step's time_unix_ms (set when its report was sent) to its
  // arrival, in ms (both from the system clock, so ms resolution).
  int64_t watch_events = 0;
  std::vector<double> watch_delay_ms;
  // Whole run, window or not.
  int64_t register_errors = 0;
  int64_t reregistrations = 0;  // after a heartbeat answered NOT_FOUND
  int64_t starts = 0;           // StartRank commands taken (resends included)
  int64_t stops = 0;            // StopRank commands taken
  int64_t ranks_ended = 0;      // by a report answered stop or FAILED_PRECONDITION
  int64_t watches_ended_early = 0;  // streams that ended before Stop()
  // "<method> <code>" -> the message of the first such error.
  std::map<std::string, std::string> first_errors;
  void Merge(const FleetStats& other);
};

class Fleet {
 public:
  explicit Fleet(FleetOptions options);
  // Stops (bounded, see Stop) and joins the queue threads.
  ~Fleet();
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Starts the queue threads and the workers' registrations, at most
  // registrations_in_flight at a time; a worker heartbeats from its first
  // successful registration on. Once.
  void Start();
  // Workers registered at least once so far.
  int registered() const { return registered_.load(); }
  // Failed registrations so far (each is retried a second later).
  int64_t register_errors() const { return register_errors_.load(); }
  // Ranks reporting steps now.
  int ranks_running() const { return ranks_running_.load(); }

  // Streams WatchJob (no history) on each job until Stop().
  void Watch(const std::vector<std::string>& job_ids);

  // RPCs due while the window is open are measured (RpcStats).
  void OpenWindow() { measuring_ = true; }
  void CloseWindow() { measuring_ = false; }

  // Nothing new is sent after this; watches are cancelled. Returns true once
  // every RPC and timer in flight has completed, false if some are still
  // out after `timeout` (call again, e.g. after the controller is gone).
  bool Stop(std::chrono::milliseconds timeout);
  // Operations (RPCs, timers) in flight now.
  int64_t in_flight() const { return in_flight_.load(); }

  // Shuts the queues down and joins their threads; then the merged stats.
  // After Stop() returned true (else gRPC may still hold tags: the process
  // should exit instead).
  FleetStats Finish();

 private:
  // The nested classes (control_plane_fleet.cc) run on the queue threads.
  struct Queue;
  class SimWorker;
  class SimRank;
  class Watcher;

  // Starts the next worker's first registration, if any is left.
  void RegisterNext();
  // A worker's first registration succeeded: counts it, and the next starts.
  void Registered();

  const FleetOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<loom::v1::WorkerService::Stub>> worker_stubs_;
  std::vector<std::unique_ptr<loom::v1::JobService::Stub>> job_stubs_;
  std::vector<std::unique_ptr<Queue>> queues_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  std::vector<std::unique_ptr<Watcher>> watchers_;
  std::atomic<int> next_to_register_{0};
  std::atomic<int> registered_{0};
  std::atomic<int64_t> register_errors_{0};
  std::atomic<int> ranks_running_{0};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> measuring_{false};
  std::atomic<bool> stopping_{false};
  bool started_ = false;
  bool finished_ = false;
};

}  // namespace loom::bench

#endif  // LOOM_BENCH_CONTROL_PLANE_FLEET_H_
