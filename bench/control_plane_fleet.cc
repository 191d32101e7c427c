#include "bench/control_plane_fleet.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <optional>
#include <queue>
#include <random>
#include <thread>
#include <utility>

#include <grpcpp/alarm.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"

namespace loom::bench {

using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kCodeNames[] = {
    "OK",       "CANCELLED",        "UNKNOWN",     "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS",  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
    "UNAVAILABLE", "DATA_LOSS",     "UNAUTHENTICATED"};

// A completion-queue tag: runs `on_done(ok)` on the queue's thread when the
// operation it was handed to completes (`ok` as CompletionQueue::Next says).
class Tag {
 public:
  explicit Tag(std::function<void(bool)> on_done) : on_done_(std::move(on_done)) {}
  void Done(bool ok) { on_done_(ok); }

 private:
  std::function<void(bool)> on_done_;
};

// The system-clock time of steady-clock time `t`, for grpc::Alarm.
std::chrono::system_clock::time_point WallTimeOf(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

double MillisSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One training step of the bench's tiny GPT (global batch 8 x 32 tokens),
// with the fields worker/rank_main.cc sets. The loss and gradient norm only
// fall, so the controller's spike detector never fires.
void FillStep(int64_t step, int rank, int64_t total_steps, loom::v1::StepMetrics* m) {
  constexpr double kTokensPerStep = 8 * 32;
  constexpr double kStepSeconds = 0.1;
  constexpr double kPeakFlops = 50e9;
  const double tokens_per_second = kTokensPerStep / kStepSeconds;
  const double model_flops = 6 * 120e3 * tokens_per_second;  // 6 x params x tokens/s
  m->set_step(step);
  m->set_loss(2.0 + 3.5 * std::exp(-static_cast<double>(step) / 2000.0));
  m->set_lr(3e-3);
  m->set_grad_norm(0.5 + 1.0 / (1.0 + 0.01 * static_cast<double>(step)));
  m->set_step_time_seconds(kStepSeconds);
  m->set_tokens_per_second(tokens_per_second);
  m->set_tokens_seen(static_cast<int64_t>(kTokensPerStep) * step);
  m->set_rank(rank);
  m->set_data_batch(step - 1);
  m->set_model_flops_per_second(model_flops);
  m->set_peak_flops_per_second(kPeakFlops);
  m->set_mfu(model_flops / kPeakFlops);
  m->set_power_watts(15.0);
  m->set_energy_joules(15.0 * kStepSeconds * static_cast<double>(step));
  m->set_power_source("model");
  m->set_parameter_bytes(480000);
  m->set_gradient_bytes(480000);
  m->set_optimizer_state_bytes(960000);
  m->set_rss_bytes(200 << 20);
  m->set_peak_rss_bytes(210 << 20);
  m->set_memory_limit_bytes(16e9);
  m->set_total_steps(total_steps);
  m->set_data_wait_seconds(0.001);
  m->set_compute_seconds(0.085);
  m->set_forward_seconds(0.03);
  m->set_backward_seconds(0.055);
  m->set_optimizer_seconds(0.01);
  m->set_loss_scale(1.0);
  m->set_precision("fp32");
  m->set_time_unix_ms(UnixMillisNow());
}

}  // namespace

void RpcStats::Merge(const RpcStats& other) {
  latency_ms.insert(latency_ms.end(), other.latency_ms.begin(), other.latency_ms.end());
  due_s.insert(due_s.end(), other.due_s.begin(), other.due_s.end());
  round_trip_ms.insert(round_trip_ms.end(), other.round_trip_ms.begin(),
                       other.round_trip_ms.end());
  for (const auto& [code, n] : other.codes) codes[code] += n;
  sent += other.sent;
}

void FleetStats::Merge(const FleetStats& other) {
  heartbeat.Merge(other.heartbeat);
  step.Merge(other.step);
  steps_sent += other.steps_sent;
  steps_dropped += other.steps_dropped;
  started_late += other.started_late;
  watch_events += other.watch_events;
  watch_delay_ms.insert(watch_delay_ms.end(), other.watch_delay_ms.begin(),
                        other.watch_delay_ms.end());
  register_errors += other.register_errors;
  reregistrations += other.reregistrations;
  starts += other.starts;
  stops += other.stops;
  ranks_ended += other.ranks_ended;
  watches_ended_early += other.watches_ended_early;
  for (const auto& [key, message] : other.first_errors) first_errors.insert({key, message});
}

// A completion queue, the one thread that drains it, what the workers,
// ranks and watchers on it record, and its share of the cap on RPCs in
// flight. Only that thread touches anything here but `cq` (Finish reads
// `stats` after the join).
struct Fleet::Queue {
  explicit Queue(Fleet* owner) : fleet(owner), tick_tag([this](bool) { OnTick(); }) {}

  Fleet* const fleet;
  grpc::CompletionQueue cq;
  std::thread thread;
  FleetStats stats;
  std::mt19937_64 rng;
  int free_slots = 0;                         // of this queue's share of the cap
  std::deque<std::function<void()>> waiting;  // sends waiting for a slot, oldest first

  // Runs `tag` (Done(true), on this queue's thread) at `when`, or up to
  // kTimerGrain later. Only this queue's thread may call it. The caller
  // has counted it in Fleet::in_flight_, as
  // for an alarm of its own. One grpc::Alarm per queue serves all of its
  // workers' and ranks' timers: with one alarm each (11,000 a second),
  // gRPC's timer lists took ~12% of this process's CPU, which shares the
  // machine with the controller under test.
  void At(Clock::time_point when, Tag* tag) {
    timers.push({when, next_timer++, tag});
    if (in_tick) return;  // OnTick arms once its timers have run
    if (!tick_armed) {
      Arm();
    } else if (when + kTimerGrain < tick_at && !tick_cancelled) {
      tick_cancelled = true;
      tick.Cancel();  // delivers the tick now (ok = false): it re-arms earlier
    }
  }

  // Runs `send` now, taking a slot, if one is free; else when one is
  // released. `send` must end in ReleaseSlot() (when its RPC completes, or
  // at once if it sends nothing).
  void WhenSlotFree(std::function<void()> send) {
    if (free_slots > 0) {
      --free_slots;
      send();
      return;
    }
    waiting.push_back(std::move(send));
  }
  // The slot goes to the oldest waiting send, if any.
  void ReleaseSlot() {
    if (waiting.empty()) {
      ++free_slots;
      return;
    }
    std::function<void()> next = std::move(waiting.front());
    waiting.pop_front();
    next();
  }

  // Counts a completed RPC of `kind`, and its latency from `due` (when it
  // was due to go, before any wait for a slot) and from `sent` (when it was
  // started) when `measured`.
  void Record(RpcStats& kind, const char* method, bool measured, Clock::time_point due,
              Clock::time_point sent, const grpc::Status& status) {
    if (!status.ok()) {
      const int code = status.error_code();
      stats.first_errors.insert(
          {absl::StrCat(method, " ", code >= 0 && code <= 16 ? kCodeNames[code] : "?"),
           status.error_message()});
    }
    if (!measured) return;
    kind.latency_ms.push_back(MillisSince(due));
    kind.round_trip_ms.push_back(MillisSince(sent));
    kind.due_s.push_back(std::chrono::duration<double>(due.time_since_epoch()).count());
    kind.codes[status.error_code()]++;
  }
  double Uniform(double lo, double hi) { return std::uniform_real_distribution<>(lo, hi)(rng); }

 private:
  static constexpr Clock::duration kTimerGrain = std::chrono::milliseconds(1);
  struct Timer {
    Clock::time_point when;
    uint64_t seq;  // equal times run in the order they were set
    Tag* tag;
    bool operator>(const Timer& o) const {
      return when != o.when ? when > o.when : seq > o.seq;
    }
  };

  // Arms the queue's alarm for its earliest timer, at least a grain from
  // now (so that one tick runs the timers of a millisecond together).
  void Arm() {
    if (timers.empty()) return;
    tick_at = std::max(timers.top().when, Clock::now() + kTimerGrain);
    tick_armed = true;
    tick_cancelled = false;
    fleet->in_flight_.fetch_add(1);
    tick.Set(&cq, WallTimeOf(tick_at), &tick_tag);
  }

  // Runs every timer due by now (every one, once stopping: their handlers
  // send nothing then), then arms for the next.
  void OnTick() {
    tick_armed = false;
    in_tick = true;
    const bool stopping = fleet->stopping_.load();
    while (!timers.empty() && (stopping || timers.top().when <= Clock::now())) {
      Tag* tag = timers.top().tag;
      timers.pop();
      tag->Done(true);  // may set timers (At)
      fleet->in_flight_.fetch_sub(1);
    }
    in_tick = false;
    Arm();
  }

  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers;
  uint64_t next_timer = 0;
  grpc::Alarm tick;
  Tag tick_tag;
  bool tick_armed = false;      // the alarm is set and not yet delivered
  bool tick_cancelled = false;  // and Cancel() was called on it
  bool in_tick = false;         // OnTick is running timers
  Clock::time_point tick_at;
};

// ------------------------------------------------------------------ SimRank

// A rank the controller started on a simulated worker: finishes a step every
// step period from its start and reports them. Lives as long as the fleet
// (an ended rank may be started again); touched only by its worker's queue
// thread.
class Fleet::SimRank {
 public:
  // Steps one report carries at most; older ones are dropped (the real
  // worker's queue is bounded too, kMaxOutgoing in worker_agent.h).
  static constexpr int64_t kMaxStepsPerReport = 100;

  SimRank(Fleet* fleet, Queue* queue, loom::v1::WorkerService::Stub* stub,
          const std::string* worker_id, std::string job_id, int rank, int64_t total_steps)
      : fleet_(fleet),
        queue_(queue),
        stub_(stub),
        worker_id_(worker_id),
        job_id_(std::move(job_id)),
        rank_(rank),
        total_steps_(total_steps),
        alarm_tag_([this](bool) { OnAlarm(); }),
        report_tag_([this](bool) { OnReport(); }) {}

  // Runs attempt `generation` from step 1, unless it runs that attempt
  // already (a start sent again).
  void Start(int64_t generation) {
    if (active_ && generation == generation_) return;
    generation_ = generation;
    reported_ = 0;
    started_ = Clock::now();
    if (!active_) {
      active_ = true;
      fleet_->ranks_running_.fetch_add(1);
    }
    // Busy: the alarm or report in flight carries on with the new attempt.
    if (!busy_) SendOrWait();
  }

  // Stops training and reporting (a report in flight completes). The
  // worker stops listing it as running.
  void End() {
    if (!active_) return;
    active_ = false;
    fleet_->ranks_running_.fetch_sub(1);
  }

  bool active() const { return active_; }
  const std::string& job_id() const { return job_id_; }
  int rank() const { return rank_; }
  int64_t generation() const { return generation_; }

 private:
  // Steps of the current attempt finished by `t`.
  int64_t StepsDoneAt(Clock::time_point t) const {
    return (t - started_) / fleet_->options_.step_period;
  }

  // Reports the steps finished and not yet reported, or waits for the next.
  // `timer_due`: when the timer that calls it was set for (a step's end),
  // from which a report it sends is due; else it is due now.
  void SendOrWait(std::optional<Clock::time_point> timer_due = std::nullopt) {
    if (!active_ || fleet_->stopping_.load()) return;
    busy_ = true;
    if (StepsDoneAt(Clock::now()) > reported_) {
      due_ = timer_due.value_or(Clock::now());
      measured_ = fleet_->measuring_.load();
      queue_->WhenSlotFree([this] { Send(); });
      return;
    }
    timer_due_ = started_ + fleet_->options_.step_period * (reported_ + 1);
    fleet_->in_flight_.fetch_add(1);
    queue_->At(timer_due_, &alarm_tag_);
  }

  void OnAlarm() {
    busy_ = false;
    SendOrWait(timer_due_);
  }

  // Holds a slot: sends every step finished by now (more may have finished
  // while it waited for the slot).
  void Send() {
    if (!active_ || fleet_->stopping_.load()) {
      busy_ = false;
      queue_->ReleaseSlot();
      return;
    }
    if (Clock::now() - due_ > std::chrono::milliseconds(1) && measured_) {
      queue_->stats.started_late++;
    }
    const int64_t done = StepsDoneAt(Clock::now());
    const int64_t first = std::max(reported_ + 1, done - kMaxStepsPerReport + 1);
    queue_->stats.steps_dropped += first - (reported_ + 1);
    request_.Clear();
    request_.set_worker_id(*worker_id_);
    request_.set_job_id(job_id_);
    request_.set_generation(generation_);
    for (int64_t step = first; step <= done; ++step) {
      FillStep(step, rank_, total_steps_, request_.add_events()->mutable_step());
    }
    reported_ = done;
    context_ = std::make_unique<grpc::ClientContext>();
    AttachToken(context_.get(), fleet_->options_.token);
    context_->set_deadline(std::chrono::system_clock::now() + fleet_->options_.rpc_deadline);
    if (measured_) {
      queue_->stats.step.sent++;
      queue_->stats.steps_sent += done - first + 1;
    }
    fleet_->in_flight_.fetch_add(1);
    call_ = stub_->PrepareAsyncReportStepMetrics(context_.get(), request_, &queue_->cq);
    sent_ = Clock::now();
    call_->StartCall();
    call_->Finish(&response_, &status_, &report_tag_);
  }

  void OnReport() {
    busy_ = false;
    queue_->ReleaseSlot();
    queue_->Record(queue_->stats.step, "ReportStepMetrics", measured_, due_, sent_, status_);
    // Stopped, or fenced as a stale attempt: the worker stops the rank.
    if ((status_.ok() && response_.stop()) ||
        status_.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      queue_->stats.ranks_ended++;
      End();
      return;
    }
    // (A failed report's steps are not sent again: the bench counts
    // failures, it does not need every step delivered.)
    SendOrWait();
  }

  Fleet* const fleet_;
  Queue* const queue_;
  loom::v1::WorkerService::Stub* const stub_;
  const std::string* const worker_id_;  // the worker's current id (it may re-register)
  const std::string job_id_;
  const int rank_;
  const int64_t total_steps_;
  bool active_ = false;
  bool busy_ = false;  // an alarm, a report, or a wait for a slot
  int64_t generation_ = 0;
  Clock::time_point started_;  // of the current attempt; step k is done at + k periods
  int64_t reported_ = 0;       // last step sent
  Tag alarm_tag_;  // its timer (Queue::At)
  Clock::time_point timer_due_;  // what that timer was set for
  Tag report_tag_;
  std::unique_ptr<grpc::ClientContext> context_;
  loom::v1::ReportStepMetricsRequest request_;
  loom::v1::ReportStepMetricsResponse response_;
  grpc::Status status_;
  bool measured_ = false;   // due in the window
  Clock::time_point due_;   // when the report in flight was due
  Clock::time_point sent_;  // when it was started
  std::unique_ptr<grpc::ClientAsyncResponseReader<loom::v1::ReportStepMetricsResponse>> call_;
};

// ---------------------------------------------------------------- SimWorker

// One simulated worker daemon. At most one of its own operations (a
// registration, a heartbeat, the timer before either, or a wait for a
// slot) is in flight at a time; its ranks have their own.
class Fleet::SimWorker {
 public:
  SimWorker(Fleet* fleet, Queue* queue, loom::v1::WorkerService::Stub* stub, int index)
      : fleet_(fleet),
        queue_(queue),
        stub_(stub),
        index_(index),
        alarm_tag_([this](bool) { OnAlarm(); }),
        register_tag_([this](bool) { OnRegistered(); }),
        heartbeat_tag_([this](bool) { OnHeartbeat(); }) {}

  // Registers for the first time; from any thread, before anything of this
  // worker is in flight (the timer fires on its queue's thread).
  // Called from any thread: a grpc::Alarm of its own (thread-safe, unlike
  // the queue's timers) hands the registration to its queue's thread.
  void BeginRegistration() {
    waiting_for_ = Waiting::kRegistration;
    timer_due_ = Clock::now();
    fleet_->in_flight_.fetch_add(1);
    hand_over_.Set(&queue_->cq, WallTimeOf(timer_due_), &alarm_tag_);
  }

 private:
  enum class Waiting { kRegistration, kHeartbeat };

  void Register() {
    queue_->WhenSlotFree([this] { SendRegistration(); });
  }

  // Holds a slot.
  void SendRegistration() {
    if (fleet_->stopping_.load()) {
      queue_->ReleaseSlot();
      return;
    }
    loom::v1::RegisterWorkerRequest& req = register_request_;
    req.Clear();
    req.set_node(absl::StrCat("sim-", index_));
    req.set_address("127.0.0.1");
    req.set_slots(fleet_->options_.slots_per_worker);
    req.set_cpus(4 * fleet_->options_.slots_per_worker);
    req.set_gpus(0);
    req.set_memory_bytes(uint64_t{16} << 30);
    req.set_host_memory_bytes(uint64_t{16} << 30);
    // A machine of its own: workers sharing a host id share its memory.
    req.set_host_id(absl::StrCat("sim-host-", index_));
    req.set_metrics_address(absl::StrCat("127.0.0.1:", 30000 + index_ % 30000));
    req.set_zone("sim-zone");
    req.set_rack(absl::StrCat("sim-rack-", index_ / 40));
    req.set_gemm_flops_per_second_per_thread(50e9);
    req.set_memory_bandwidth_bytes_per_second(10e9);
    req.set_gemm_source("simulated");
    req.set_block_fixed_seconds(2e-4);
    req.set_block_seconds_per_activation(1e-9);
    req.set_allreduce_latency_seconds(2e-5);
    req.set_allreduce_bytes_per_second(5e9);
    AddRunning(req.mutable_running());
    NewContext();
    fleet_->in_flight_.fetch_add(1);
    register_call_ = stub_->PrepareAsyncRegisterWorker(context_.get(), req, &queue_->cq);
    register_call_->StartCall();
    register_call_->Finish(&register_response_, &status_, &register_tag_);
  }

  void NewContext() {
    context_ = std::make_unique<grpc::ClientContext>();
    AttachToken(context_.get(), fleet_->options_.token);
    context_->set_deadline(std::chrono::system_clock::now() + fleet_->options_.rpc_deadline);
  }

  // The ranks it runs, as worker_agent.cc lists them.
  void AddRunning(google::protobuf::RepeatedPtrField<loom::v1::RunningRank>* running) const {
    for (const auto& r : ranks_) {
      if (!r->active()) continue;
      loom::v1::RunningRank* out = running->Add();
      out->set_job_id(r->job_id());
      out->set_rank(r->rank());
      out->set_generation(r->generation());
    }
  }

  void At(Clock::time_point when, Waiting what) {
    waiting_for_ = what;
    timer_due_ = when;
    fleet_->in_flight_.fetch_add(1);
    queue_->At(when, &alarm_tag_);
  }

  void OnAlarm() {
    if (fleet_->stopping_.load()) return;
    if (waiting_for_ == Waiting::kRegistration) {
      Register();
    } else {
      // Due when it was set for: a late timer counts in the latency.
      due_ = timer_due_;
      measured_ = fleet_->measuring_.load();
      queue_->WhenSlotFree([this] { SendHeartbeat(); });
    }
  }

  void OnRegistered() {
    queue_->ReleaseSlot();
    queue_->Record(queue_->stats.heartbeat, "RegisterWorker", false, Clock::now(), Clock::now(),
                   status_);
    if (!status_.ok()) {
      queue_->stats.register_errors++;
      fleet_->register_errors_.fetch_add(1);
      if (!fleet_->stopping_.load()) At(Clock::now() + std::chrono::seconds(1), Waiting::kRegistration);
      return;
    }
    id_ = register_response_.worker_id();
    Clock::time_point first = Clock::now();
    if (!registered_) {
      registered_ = true;
      // A random phase, so heartbeats spread over the period.
      first += std::chrono::duration_cast<Clock::duration>(fleet_->options_.heartbeat_period *
                                                           queue_->Uniform(0, 1));
      fleet_->Registered();
    }
    if (!fleet_->stopping_.load()) At(first, Waiting::kHeartbeat);
  }

  // Holds a slot.
  void SendHeartbeat() {
    if (fleet_->stopping_.load()) {
      queue_->ReleaseSlot();
      return;
    }
    if (Clock::now() - due_ > std::chrono::milliseconds(1) && measured_) {
      queue_->stats.started_late++;
    }
    heartbeat_request_.Clear();
    heartbeat_request_.set_worker_id(id_);
    AddRunning(heartbeat_request_.mutable_running());
    // worker_agent.cc sends a port free for rank 0's rendezvous each time.
    heartbeat_request_.set_rendezvous_port(20000 + index_ % 40000);
    NewContext();
    if (measured_) queue_->stats.heartbeat.sent++;
    fleet_->in_flight_.fetch_add(1);
    heartbeat_call_ = stub_->PrepareAsyncHeartbeat(context_.get(), heartbeat_request_, &queue_->cq);
    sent_ = Clock::now();
    heartbeat_call_->StartCall();
    heartbeat_call_->Finish(&heartbeat_response_, &status_, &heartbeat_tag_);
  }

  void OnHeartbeat() {
    queue_->ReleaseSlot();
    queue_->Record(queue_->stats.heartbeat, "Heartbeat", measured_, due_, sent_, status_);
    if (fleet_->stopping_.load()) return;
    if (status_.error_code() == grpc::StatusCode::NOT_FOUND) {
      // Declared dead or forgotten: register again, with the running ranks.
      queue_->stats.reregistrations++;
      Register();
      return;
    }
    if (status_.ok()) {
      for (const auto& command : heartbeat_response_.commands()) Apply(command);
    }
    // A period after the answer, as WorkerAgent::Run waits: a slow
    // controller gets fewer heartbeats.
    const double jitter = fleet_->options_.heartbeat_jitter;
    At(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                          fleet_->options_.heartbeat_period *
                          queue_->Uniform(1 - jitter, 1 + jitter)),
       Waiting::kHeartbeat);
  }

  void Apply(const loom::v1::WorkerCommand& command) {
    if (command.has_start()) {
      queue_->stats.starts++;
      const loom::v1::StartRank& start = command.start();
      SimRank* rank = nullptr;
      for (const auto& r : ranks_) {
        if (r->job_id() == start.job_id() && r->rank() == start.rank()) rank = r.get();
      }
      if (rank == nullptr) {
        ranks_.push_back(std::make_unique<SimRank>(fleet_, queue_, stub_, &id_, start.job_id(),
                                                   start.rank(),
                                                   start.spec().schedule().total_steps()));
        rank = ranks_.back().get();
      }
      rank->Start(start.generation());
    } else if (command.has_stop()) {
      queue_->stats.stops++;
      const loom::v1::StopRank& stop = command.stop();
      for (const auto& r : ranks_) {
        if (r->job_id() == stop.job_id() &&
            (stop.generation() == 0 || r->generation() <= stop.generation())) {
          r->End();
        }
      }
    }
  }

  Fleet* const fleet_;
  Queue* const queue_;
  loom::v1::WorkerService::Stub* const stub_;
  const int index_;
  std::string id_;  // from the last registration
  bool registered_ = false;
  Waiting waiting_for_ = Waiting::kHeartbeat;
  Clock::time_point timer_due_;  // what the pending timer was set for
  grpc::Alarm hand_over_;        // BeginRegistration's, once
  Tag alarm_tag_;
  Tag register_tag_;
  Tag heartbeat_tag_;
  std::unique_ptr<grpc::ClientContext> context_;
  grpc::Status status_;
  loom::v1::RegisterWorkerRequest register_request_;
  loom::v1::RegisterWorkerResponse register_response_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<loom::v1::RegisterWorkerResponse>>
      register_call_;
  loom::v1::HeartbeatRequest heartbeat_request_;
  loom::v1::HeartbeatResponse heartbeat_response_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<loom::v1::HeartbeatResponse>> heartbeat_call_;
  Clock::time_point due_;   // when the heartbeat in flight was due
  Clock::time_point sent_;  // when it was started
  bool measured_ = false;  // due in the window
  std::vector<std::unique_ptr<SimRank>> ranks_;  // every rank ever started here
};

// ------------------------------------------------------------------ Watcher

// A WatchJob stream; reads until the stream ends or Cancel().
class Fleet::Watcher {
 public:
  Watcher(Fleet* fleet, Queue* queue, loom::v1::JobService::Stub* stub, std::string job_id)
      : fleet_(fleet), queue_(queue), stub_(stub), job_id_(std::move(job_id)),
        tag_([this](bool ok) { OnEvent(ok); }) {}

  void Start() {
    AttachToken(&context_, fleet_->options_.watch_token);
    request_.set_job_id(job_id_);
    request_.set_include_history(false);
    state_ = State::kStarting;
    fleet_->in_flight_.fetch_add(1);
    stream_ = stub_->PrepareAsyncWatchJob(&context_, request_, &queue_->cq);
    stream_->StartCall(&tag_);
  }

  // Thread-safe.
  void Cancel() { context_.TryCancel(); }

 private:
  enum class State { kStarting, kReading, kFinishing };

  void OnEvent(bool ok) {
    switch (state_) {
      case State::kStarting:
      case State::kReading:
        if (state_ == State::kReading && ok && event_.has_step() && fleet_->measuring_.load()) {
          queue_->stats.watch_events++;
          queue_->stats.watch_delay_ms.push_back(
              static_cast<double>(UnixMillisNow() - event_.step().time_unix_ms()));
        }
        fleet_->in_flight_.fetch_add(1);
        if (ok) {
          state_ = State::kReading;
          stream_->Read(&event_, &tag_);
        } else {
          state_ = State::kFinishing;
          stream_->Finish(&status_, &tag_);
        }
        return;
      case State::kFinishing:
        if (!fleet_->stopping_.load()) {
          queue_->stats.watches_ended_early++;
          queue_->Record(queue_->stats.step, "WatchJob", false, Clock::now(), Clock::now(),
                         status_.ok() ? grpc::Status(grpc::StatusCode::UNKNOWN,
                                                     "the stream ended before the bench did")
                                      : status_);
        }
        return;
    }
  }

  Fleet* const fleet_;
  Queue* const queue_;
  loom::v1::JobService::Stub* const stub_;
  const std::string job_id_;
  State state_ = State::kStarting;
  Tag tag_;
  grpc::ClientContext context_;
  loom::v1::WatchJobRequest request_;
  loom::v1::JobEvent event_;
  grpc::Status status_;
  std::unique_ptr<grpc::ClientAsyncReader<loom::v1::JobEvent>> stream_;
};

// -------------------------------------------------------------------- Fleet

Fleet::Fleet(FleetOptions options) : options_(std::move(options)) {
  for (int i = 0; i < std::max(1, options_.channels); ++i) {
    grpc::ChannelArguments args;
    // Distinct arguments and no shared subchannel pool: a connection each.
    args.SetInt("loom.bench.connection", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels_.push_back(
        grpc::CreateCustomChannel(options_.address, grpc::InsecureChannelCredentials(), args));
    worker_stubs_.push_back(loom::v1::WorkerService::NewStub(channels_.back()));
    job_stubs_.push_back(loom::v1::JobService::NewStub(channels_.back()));
  }
  const int queues = std::max(1, options_.queues);
  for (int i = 0; i < queues; ++i) {
    queues_.push_back(std::make_unique<Queue>(this));
    queues_.back()->rng.seed(options_.seed * 1000003 + static_cast<uint64_t>(i));
    queues_.back()->free_slots = std::max(1, options_.max_rpcs_in_flight / queues);
  }
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(std::make_unique<SimWorker>(
        this, queues_[i % queues_.size()].get(), worker_stubs_[i % worker_stubs_.size()].get(),
        i));
  }
}

Fleet::~Fleet() {
  if (started_ && !finished_) {
    Stop(std::chrono::seconds(10));
    Finish();
  }
}

void Fleet::Start() {
  if (started_) return;
  started_ = true;
  for (auto& q : queues_) {
    Queue* queue = q.get();
    queue->thread = std::thread([this, queue] {
      void* tag = nullptr;
      bool ok = false;
      while (queue->cq.Next(&tag, &ok)) {
        static_cast<Tag*>(tag)->Done(ok);
        // After the handler, which may have started the next operation: the
        // count reaches 0 only when nothing follows.
        in_flight_.fetch_sub(1);
      }
    });
  }
  for (int i = 0; i < options_.registrations_in_flight; ++i) RegisterNext();
}

void Fleet::RegisterNext() {
  if (stopping_.load()) return;
  const int i = next_to_register_.fetch_add(1);
  if (i < static_cast<int>(workers_.size())) workers_[i]->BeginRegistration();
}

void Fleet::Registered() {
  registered_.fetch_add(1);
  RegisterNext();
}

void Fleet::Watch(const std::vector<std::string>& job_ids) {
  for (const std::string& id : job_ids) {
    const size_t i = watchers_.size();
    watchers_.push_back(std::make_unique<Watcher>(this, queues_[i % queues_.size()].get(),
                                                  job_stubs_[i % job_stubs_.size()].get(), id));
    watchers_.back()->Start();
  }
}

bool Fleet::Stop(std::chrono::milliseconds timeout) {
  stopping_ = true;
  measuring_ = false;
  for (auto& w : watchers_) w->Cancel();
  const auto deadline = Clock::now() + timeout;
  while (in_flight_.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return in_flight_.load() == 0;
}

FleetStats Fleet::Finish() {
  FleetStats all;
  if (finished_) return all;
  finished_ = true;
  stopping_ = true;
  for (auto& w : watchers_) w->Cancel();
  // Every RPC has a deadline and every timer fires within a period, so the
  // queues drain in bounded time.
  for (auto& q : queues_) q->cq.Shutdown();
  for (auto& q : queues_) {
    if (q->thread.joinable()) q->thread.join();
    all.Merge(q->stats);
  }
  return all;
}

}  // namespace loom::bench
