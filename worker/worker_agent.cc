#include "worker/worker_agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/grpc_util.h"
#include "google/protobuf/util/json_util.h"

namespace loom::worker {
namespace {

// "HH:MM:SS.mmm " (UTC), so that a worker's log lines order against the
// controller's and the ranks'.
std::string LogTime() {
  return absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::UTCTimeZone());
}

}  // namespace

// The running kernel's boot id: the same for every process on one machine
// (containers included), different across machines and reboots; empty when
// unreadable.
std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

WorkerAgent::WorkerAgent(WorkerOptions options,
                         std::shared_ptr<loom::v1::WorkerService::StubInterface> stub,
                         std::shared_ptr<metrics::Registry> registry)
    : WorkerAgent(std::move(options), std::make_shared<ControllerLink>(std::move(stub)),
                  std::move(registry)) {}

template <typename Call>
grpc::Status WorkerAgent::CallController(absl::Duration timeout, Call call,
                                         ControllerLink::Target* used) {
  *used = link_->Current();
  auto ctx = NewContext(timeout);
  grpc::Status s = call(used->stub, ctx.get());
  link_->After(*used, s, *ctx);
  return s;
}

namespace {
// An answer of a controller whose leader epoch is older than the newest seen.
grpc::Status StaleEpoch(int64_t epoch) {
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("answer of controller epoch ", epoch, " refused: a newer leader has spoken"));
}
}  // namespace

WorkerAgent::WorkerAgent(WorkerOptions options, std::shared_ptr<ControllerLink> link,
                         std::shared_ptr<metrics::Registry> registry)
    : options_(std::move(options)),
      link_(std::move(link)),
      registry_(std::move(registry)),
      step_time_(metrics::BuildGauge()
                     .Name("loom_worker_step_time_seconds")
                     .Help("Wall time of the last optimizer step, per rank.")
                     .Register(*registry_)),
      tokens_per_second_(metrics::BuildGauge()
                             .Name("loom_worker_tokens_per_second")
                             .Help("Training throughput of the job (all ranks), last step.")
                             .Register(*registry_)),
      loss_(metrics::BuildGauge()
                .Name("loom_worker_loss")
                .Help("Training loss of the last step (mean over the global batch).")
                .Register(*registry_)),
      val_loss_(metrics::BuildGauge()
                    .Name("loom_worker_validation_loss")
                    .Help("Validation loss of the last evaluation.")
                    .Register(*registry_)),
      lr_(metrics::BuildGauge()
              .Name("loom_worker_learning_rate")
              .Help("Learning rate used by the last step.")
              .Register(*registry_)),
      step_(metrics::BuildGauge()
                .Name("loom_worker_step")
                .Help("Last optimizer step completed.")
                .Register(*registry_)),
      tokens_total_(metrics::BuildCounter()
                        .Name("loom_worker_tokens_total")
                        .Help("Tokens trained on by the job (all ranks), as seen by this worker.")
                        .Register(*registry_)),
      mfu_(metrics::BuildGauge()
               .Name("loom_worker_mfu_ratio")
               .Help("Model FLOPs utilisation of the job: model FLOP/s over calibrated peak.")
               .Register(*registry_)),
      model_flops_(metrics::BuildGauge()
                       .Name("loom_worker_model_flops_per_second")
                       .Help("Model FLOP/s of the job (6N per token plus attention).")
                       .Register(*registry_)),
      peak_flops_(metrics::BuildGauge()
                      .Name("loom_worker_peak_flops_per_second")
                      .Help("Peak FLOP/s of the job's ranks, from a GEMM calibration at start.")
                      .Register(*registry_)),
      memory_(metrics::BuildGauge()
                  .Name("loom_worker_memory_bytes")
                  .Help("Memory of a rank by kind: parameters, gradients, optimizer, rss, "
                        "peak_rss, limit; GPU ranks also device_allocated, device_reserved, "
                        "device_peak (LibTorch's caching allocator).")
                  .Register(*registry_)),
      power_(metrics::BuildGauge()
                 .Name("loom_worker_power_watts")
                 .Help("Power drawn by a rank; source says rapl, nvml or model.")
                 .Register(*registry_)),
      energy_(metrics::BuildCounter()
                  .Name("loom_worker_energy_joules_total")
                  .Help("Energy used by a rank since it started; source says rapl, nvml or model.")
                  .Register(*registry_)),
      phase_(metrics::BuildGauge()
                 .Name("loom_worker_step_phase_seconds")
                 .Help("Where the last step's time went, per rank, by phase: data_wait, "
                       "host_to_device, forward (with the fused loss's gradients), backward, "
                       "comm (exposed all-reduce), optimizer, checkpoint_stall.")
                 .Register(*registry_)),
      phase_total_(metrics::BuildCounter()
                       .Name("loom_worker_step_phase_seconds_total")
                       .Help("Step time per rank by phase, summed over the reported steps; "
                             "rate() over step time gives the split.")
                       .Register(*registry_)),
      nonfinite_skipped_(metrics::BuildCounter()
                             .Name("loom_worker_nonfinite_steps_skipped_total")
                             .Help("Optimizer steps skipped because a gradient was inf or NaN.")
                             .Register(*registry_)),
      loss_scale_(metrics::BuildGauge()
                      .Name("loom_worker_loss_scale")
                      .Help("fp16 dynamic loss scale of a rank (1 when not scaling); the "
                            "precision label says fp32, bf16 or fp16.")
                      .Register(*registry_)),
      checkpoint_failures_(metrics::BuildCounter()
                               .Name("loom_worker_checkpoint_failures_total")
                               .Help("Checkpoint saves of a job that failed on this worker's "
                                     "ranks (the series exists, at 0, from the job's first "
                                     "step on).")
                               .Register(*registry_)),
      batches_skipped_(metrics::BuildGauge()
                           .Name("loom_worker_batches_skipped")
                           .Help("Data batches the job's current branch has skipped so far "
                                 "(skip ranges from the spec and from rollbacks).")
                           .Register(*registry_)),
      total_steps_(metrics::BuildGauge()
                       .Name("loom_worker_total_steps")
                       .Help("Optimizer steps the job trains in all (schedule.total_steps); "
                             "with loom_worker_step and the step time it gives the ETA.")
                       .Register(*registry_)),
      co2_(metrics::BuildCounter()
               .Name("loom_worker_co2_grams_total")
               .Help("CO2-equivalent of a rank's energy since it started: energy (kWh) times "
                     "the node's grid intensity (loom_worker_grid_intensity_grams_per_kwh).")
               .Register(*registry_)),
      grid_intensity_(metrics::BuildGauge()
                          .Name("loom_worker_grid_intensity_grams_per_kwh")
                          .Help("Carbon intensity this worker assumes for its electricity "
                                "(--grid_intensity_g_per_kwh), g CO2-eq per kWh.")
                          .Register(*registry_)
                          .Add({})),
      rank_exits_(metrics::BuildCounter()
                      .Name("loom_worker_rank_exits_total")
                      .Help("Rank processes that ended, by outcome.")
                      .Register(*registry_)),
      ranks_running_(metrics::BuildGauge()
                         .Name("loom_worker_ranks_running")
                         .Help("Rank processes running on this worker.")
                         .Register(*registry_)
                         .Add({})),
      heartbeats_failed_(metrics::BuildCounter()
                             .Name("loom_worker_heartbeat_failures_total")
                             .Help("Heartbeats that did not reach the controller.")
                             .Register(*registry_)
                             .Add({})),
      lease_kills_(metrics::BuildCounter()
                       .Name("loom_worker_lease_kills_total")
                       .Help("Ranks this worker killed because its lease with the controller "
                             "ran out.")
                       .Register(*registry_)
                       .Add({})),
      lease_last_chance_renewals_(
          metrics::BuildCounter()
              .Name("loom_worker_lease_last_chance_renewals_total")
              .Help("Leases that ran out (this host or worker paused past the grace) and were "
                    "renewed by a last heartbeat the controller answered, so no rank was killed.")
              .Register(*registry_)
              .Add({})) {
  grid_intensity_.Set(options_.grid_intensity_g_per_kwh);
  RankSupervisorOptions sup;
  sup.rank_binary = options_.rank_binary;
  sup.work_dir = options_.work_dir;
  sup.stop_grace = options_.stop_grace;
  sup.warm_ranks = options_.warm_ranks;
  sup.warm_after = options_.warm_after;
  sup.on_event = [this](const std::string& job, int rank, int64_t generation,
                        const loom::v1::RankEvent& e) { OnEvent(job, rank, generation, e); };
  sup.on_exit = [this](const RankExit& exit) { OnExit(exit); };
  CheckpointUploader::Options up = options_.upload;
  up.uploader = absl::StrCat("worker on node ", options_.node);
  uploader_ = std::make_unique<CheckpointUploader>(
      up, [this](const std::string& job, int64_t generation, const loom::v1::CheckpointInfo& c) {
        loom::v1::RankEvent e;
        *e.mutable_checkpoint() = c;
        Queue(job, generation, e);
      });
  log_shipper_ = std::make_unique<LogShipper>(
      [this](loom::v1::AppendRankLogsRequest* req, loom::v1::AppendRankLogsResponse* resp) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          req->set_worker_id(worker_id_);
        }
        ControllerLink::Target used;
        return CallController(
            options_.rpc_timeout,
            [&](ControllerLink::Stub* stub, grpc::ClientContext* ctx) {
              return stub->AppendRankLogs(ctx, *req, resp);
            },
            &used);
      });
  sup.on_start = [this](const std::string& job, int rank, int64_t generation,
                        const std::string& log_path, int64_t log_begin) {
    log_shipper_->Started(job, rank, generation, log_path, log_begin);
  };
  supervisor_ = std::make_unique<RankSupervisor>(std::move(sup));
  sender_ = std::thread([this] { SenderLoop(); });
  log_sender_ = std::thread([this] { LogLoop(); });
}

WorkerAgent::~WorkerAgent() {
  Stop();
  // The sender may call into the supervisor (stop on request): end it first.
  if (sender_.joinable()) sender_.join();
  if (log_sender_.joinable()) log_sender_.join();
  supervisor_.reset();  // kills ranks; their exits enqueue and are dropped
  // The ranks' last words, once (best effort: the controller may be away).
  bool registered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    registered = !worker_id_.empty();
  }
  if (registered) (void)log_shipper_->ShipOnce();
}

void WorkerAgent::LogLoop() {
  int failures_in_a_row = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoMilliseconds(kLogShipInterval),
                   [&] { return stop_.load(); });
      if (stop_.load()) return;
      if (worker_id_.empty()) continue;
    }
    const grpc::Status s = log_shipper_->ShipOnce();
    if (s.ok()) {
      failures_in_a_row = 0;
    } else if (failures_in_a_row++ % 40 == 0) {  // the first, then one in 40 (~10 s)
      std::cerr << LogTime() << "loom-worker: shipping rank logs failed (" << failures_in_a_row
                << " in a row; kept and sent again): " << s.error_message() << std::endl;
    }
  }
}

void WorkerAgent::Stop() {
  stop_ = true;
  cv_.notify_all();
}

std::unique_ptr<grpc::ClientContext> WorkerAgent::NewContext() {
  return NewContext(options_.rpc_timeout);
}

std::unique_ptr<grpc::ClientContext> WorkerAgent::NewContext(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  AttachToken(ctx.get(), options_.token);
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  return ctx;
}

absl::Status WorkerAgent::Register() {
  loom::v1::RegisterWorkerRequest req;
  req.set_node(options_.node);
  req.set_address(options_.address);
  req.set_zone(options_.zone);
  req.set_rack(options_.rack);
  req.set_slots(options_.slots);
  req.set_cpus(static_cast<int>(std::thread::hardware_concurrency()));
  req.set_gpus(options_.gpus);
  struct sysinfo si;
  if (options_.memory_bytes > 0) {
    req.set_memory_bytes(options_.memory_bytes);
  } else if (sysinfo(&si) == 0) {
    req.set_memory_bytes(static_cast<uint64_t>(si.totalram) * si.mem_unit);
  }
  if (sysinfo(&si) == 0) req.set_host_memory_bytes(static_cast<uint64_t>(si.totalram) * si.mem_unit);
  req.set_host_id(options_.host_id.empty() ? BootId() : options_.host_id);
  req.set_metrics_address(options_.metrics_address);
  req.set_gemm_flops_per_second_per_thread(options_.gemm_flops_per_second_per_thread);
  req.set_memory_bandwidth_bytes_per_second(options_.memory_bandwidth_bytes_per_second);
  req.set_gemm_source(options_.gemm_source);
  req.set_block_fixed_seconds(options_.block_fixed_seconds);
  req.set_block_seconds_per_activation(options_.block_seconds_per_activation);
  req.set_allreduce_latency_seconds(options_.allreduce_latency_seconds);
  req.set_tensor_collective_extra_seconds(options_.tensor_collective_extra_seconds);
  req.set_tensor_collective_idle_fraction(options_.tensor_collective_idle_fraction);
  req.set_concurrent_slowdown(options_.concurrent_slowdown);
  req.set_allreduce_bytes_per_second(options_.allreduce_bytes_per_second);
  // Ranks still running from before (the controller restarted, or forgot
  // this worker): it re-adopts those of current attempts.
  for (const auto& running_rank : supervisor_->Running()) {
    auto* r = req.add_running();
    r->set_job_id(running_rank.job_id);
    r->set_rank(running_rank.rank);
    r->set_generation(running_rank.generation);
  }
  loom::v1::RegisterWorkerResponse resp;
  const absl::Time sent = absl::Now();
  ControllerLink::Target used;
  grpc::Status g = CallController(
      options_.rpc_timeout,
      [&](ControllerLink::Stub* stub, grpc::ClientContext* ctx) {
        return stub->RegisterWorker(ctx, req, &resp);
      },
      &used);
  if (g.ok() && !link_->Accept(used, resp.controller_epoch())) {
    g = StaleEpoch(resp.controller_epoch());
  }
  absl::Status s = FromGrpcStatus(g);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  worker_id_ = resp.worker_id();
  if (resp.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ = absl::Milliseconds(resp.heartbeat_interval_ms());
  }
  if (resp.lease_grace_ms() > 0) lease_grace_ = absl::Milliseconds(resp.lease_grace_ms());
  lease_renewed_ = sent;
  std::cerr << LogTime() << "loom-worker: registered as " << worker_id_ << " (" << req.running_size()
            << " rank(s) still running, lease " << absl::FormatDuration(lease_grace_) << ")"
            << std::endl;
  cv_.notify_all();  // reports waiting for a registration go out now
  return absl::OkStatus();
}

absl::Status WorkerAgent::HeartbeatOnce(absl::Duration timeout) {
  loom::v1::HeartbeatRequest req;
  {
    std::lock_guard<std::mutex> lock(mu_);
    req.set_worker_id(worker_id_);
  }
  auto running = supervisor_->Running();
  ranks_running_.Set(static_cast<double>(running.size()));
  for (const auto& running_rank : running) {
    auto* r = req.add_running();
    r->set_job_id(running_rank.job_id);
    r->set_rank(running_rank.rank);
    r->set_generation(running_rank.generation);
  }
  req.set_rendezvous_port(PickFreePort());
  if (options_.notice) {
    if (std::optional<loom::v1::NodeNotice> n = options_.notice()) *req.mutable_notice() = *n;
  }
  loom::v1::HeartbeatResponse resp;
  const absl::Time sent = absl::Now();
  ControllerLink::Target used;
  grpc::Status g = CallController(
      timeout,
      [&](ControllerLink::Stub* stub, grpc::ClientContext* ctx) {
        return stub->Heartbeat(ctx, req, &resp);
      },
      &used);
  // An older leader's commands are not run, and its answer renews nothing.
  if (g.ok() && !link_->Accept(used, resp.controller_epoch())) {
    g = StaleEpoch(resp.controller_epoch());
  }
  absl::Status s = FromGrpcStatus(g);
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease_renewed_ = sent;
  }
  for (const auto& cmd : resp.commands()) HandleCommand(cmd);
  return absl::OkStatus();
}

void WorkerAgent::HandleCommand(const loom::v1::WorkerCommand& cmd) {
  if (cmd.has_start()) {
    loom::v1::StartRank start = cmd.start();
    start.set_local_addr(options_.address);
    if (std::optional<CheckpointUploader::RemoteTier> tier =
            CheckpointUploader::RemoteTier::Of(start);
        tier.has_value() && start.rank() == 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        remote_tiers_[start.job_id()] = {start.generation(), *tier};
      }
      // What an earlier attempt committed and no one uploaded (a worker
      // restart or a move cut it short): the uploader skips what is gone.
      for (const loom::v1::CheckpointInfo& c : start.pending_uploads()) {
        uploader_->Enqueue(start.job_id(), start.generation(), c, *tier);
      }
    }
    start.clear_pending_uploads();  // not the rank's business
    std::string json;
    google::protobuf::util::JsonPrintOptions opts;
    opts.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(start, &json, opts);
    absl::Status s = supervisor_->Start(start.job_id(), start.rank(), start.generation(), json);
    if (!s.ok() && !absl::IsAlreadyExists(s)) {
      RankExit exit;
      exit.job_id = start.job_id();
      exit.rank = start.rank();
      exit.generation = start.generation();
      exit.exit_code = 127;
      exit.reason = absl::StrCat("worker could not start the rank: ", s.message());
      OnExit(exit);
    } else if (s.ok()) {
      std::cerr << LogTime() << "loom-worker: started rank " << start.rank() << "/"
                << start.world_size() << " of " << start.job_id() << " (attempt "
                << start.generation() << ")" << std::endl;
    }
  } else if (cmd.has_stop()) {
    std::cerr << LogTime() << "loom-worker: "
              << (cmd.stop().checkpoint_first() ? "asking the ranks of " : "stopping ranks of ")
              << cmd.stop().job_id()
              << (cmd.stop().checkpoint_first() ? " to save and stop: " : ": ")
              << cmd.stop().reason() << std::endl;
    if (cmd.stop().checkpoint_first()) {
      supervisor_->SaveAndStop(cmd.stop().job_id(), cmd.stop().generation());
    } else {
      supervisor_->Stop(cmd.stop().job_id(), cmd.stop().generation());
    }
  }
}

void WorkerAgent::OnEvent(const std::string& job_id, int rank, int64_t generation,
                          const loom::v1::RankEvent& e) {
  if (e.has_step()) {
    const auto& m = e.step();
    metrics::Labels labels = {{"job_id", job_id}, {"rank", std::to_string(rank)}};
    step_time_.Add(labels).Set(m.step_time_seconds());
    tokens_per_second_.Add(labels).Set(m.tokens_per_second());
    loss_.Add(labels).Set(m.loss());
    lr_.Add(labels).Set(m.lr());
    step_.Add(labels).Set(static_cast<double>(m.step()));
    if (m.has_val_loss()) val_loss_.Add(labels).Set(m.val_loss());
    auto& tokens = tokens_total_.Add(labels);
    double delta = static_cast<double>(m.tokens_seen()) - tokens.Value();
    if (delta > 0) tokens.Increment(delta);
    if (m.peak_flops_per_second() > 0) {
      mfu_.Add(labels).Set(m.mfu());
      model_flops_.Add(labels).Set(m.model_flops_per_second());
      peak_flops_.Add(labels).Set(m.peak_flops_per_second());
    }
    auto kind = [&](const char* k) {
      metrics::Labels l = labels;
      l["kind"] = k;
      return l;
    };
    memory_.Add(kind("parameters")).Set(static_cast<double>(m.parameter_bytes()));
    memory_.Add(kind("gradients")).Set(static_cast<double>(m.gradient_bytes()));
    memory_.Add(kind("optimizer")).Set(static_cast<double>(m.optimizer_state_bytes()));
    memory_.Add(kind("rss")).Set(static_cast<double>(m.rss_bytes()));
    memory_.Add(kind("peak_rss")).Set(static_cast<double>(m.peak_rss_bytes()));
    if (m.memory_limit_bytes() > 0) memory_.Add(kind("limit")).Set(m.memory_limit_bytes());
    // GPU ranks: the caching allocator's view of the rank's device.
    if (m.device_memory_reserved_bytes() > 0) {
      memory_.Add(kind("device_allocated"))
          .Set(static_cast<double>(m.device_memory_allocated_bytes()));
      memory_.Add(kind("device_reserved"))
          .Set(static_cast<double>(m.device_memory_reserved_bytes()));
      memory_.Add(kind("device_peak")).Set(static_cast<double>(m.device_memory_peak_bytes()));
    }
    if (m.step() > 0) {
      const std::pair<const char*, double> phases[] = {
          {"data_wait", m.data_wait_seconds()},
          {"host_to_device", m.host_to_device_seconds()},
          {"forward", m.forward_seconds()},
          {"backward", m.backward_seconds()},
          {"pipeline_wait", m.pipeline_wait_seconds()},
          {"comm", m.comm_seconds()},
          {"optimizer", m.optimizer_seconds()},
          {"checkpoint_stall", m.checkpoint_stall_seconds()}};
      for (const auto& [phase, seconds] : phases) {
        metrics::Labels l = labels;
        l["phase"] = phase;
        phase_.Add(l).Set(seconds);
        if (seconds > 0) phase_total_.Add(l).Increment(seconds);
      }
      checkpoint_failures_.Add({{"job_id", job_id}});
      batches_skipped_.Add(labels).Set(static_cast<double>(m.batches_skipped()));
      if (m.total_steps() > 0) total_steps_.Add(labels).Set(static_cast<double>(m.total_steps()));
      auto& skipped = nonfinite_skipped_.Add(labels);
      const double ds = static_cast<double>(m.nonfinite_steps_skipped()) - skipped.Value();
      if (ds > 0) skipped.Increment(ds);
      if (!m.precision().empty()) {
        metrics::Labels l = labels;
        l["precision"] = m.precision();
        loss_scale_.Add(l).Set(m.loss_scale());
      }
    }
    if (!m.power_source().empty()) {
      metrics::Labels pl = labels;
      pl["source"] = m.power_source();
      power_.Add(pl).Set(m.power_watts());
      auto& joules = energy_.Add(pl);
      double dj = m.energy_joules() - joules.Value();
      auto& grams = co2_.Add(pl);
      if (dj > 0) {
        joules.Increment(dj);
        grams.Increment(dj / 3.6e6 * options_.grid_intensity_g_per_kwh);
      }
    }
  }
  if (e.has_checkpoint() && e.checkpoint().status() == "failed") {
    checkpoint_failures_.Add({{"job_id", job_id}}).Increment();
    std::cerr << LogTime() << "loom-worker: checkpoint of " << job_id << " at step " << e.checkpoint().step()
              << " failed: " << e.checkpoint().error() << std::endl;
  }
  if (e.has_checkpoint() && e.checkpoint().status().empty() && rank == 0) {
    std::optional<CheckpointUploader::RemoteTier> remote;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = remote_tiers_.find(job_id);
      if (it != remote_tiers_.end()) remote = it->second.second;
    }
    if (remote.has_value()) uploader_->Enqueue(job_id, generation, e.checkpoint(), *remote);
  }
  Queue(job_id, generation, e);
}

void WorkerAgent::OnExit(const RankExit& exit) {
  if (exit.rank == 0) {
    // Its committed checkpoints were queued as their reports came.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = remote_tiers_.find(exit.job_id);
    if (it != remote_tiers_.end() && it->second.first == exit.generation) remote_tiers_.erase(it);
  }
  if (exit.log_begin >= 0) log_shipper_->Exited(exit.job_id, exit.rank, exit.generation, exit.log_end);
  std::cerr << LogTime() << "loom-worker: rank " << exit.rank << " of " << exit.job_id << " exited (code "
            << exit.exit_code << ", signal " << exit.signal << ")"
            << (exit.reason.empty() ? "" : ": " + exit.reason) << std::endl;
  rank_exits_.Add({{"outcome", exit.exit_code == 0 && exit.signal == 0 ? "success" : "failure"}})
      .Increment();
  std::lock_guard<std::mutex> lock(mu_);
  ended_series_.push_back(
      {{{"job_id", exit.job_id}, {"rank", std::to_string(exit.rank)}}, absl::Now()});
  Outgoing out;
  out.is_exit = true;
  out.job_id = exit.job_id;
  out.generation = exit.generation;
  out.exit = exit;
  outgoing_.push_back(std::move(out));
  cv_.notify_all();
}

void WorkerAgent::SenderLoop() {
  while (true) {
    std::deque<Outgoing> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(200),
                   [&] { return stop_.load() || !outgoing_.empty(); });
      if (stop_.load()) return;
      if (worker_id_.empty()) continue;
      batch.swap(outgoing_);
      sending_ = !batch.empty();
    }
    // Events of a job go out in one report; an exit is sent after the events
    // that precede it, so the controller sees the last step before the end.
    while (!batch.empty() && !stop_.load()) {
      if (batch.front().is_exit) {
        const RankExit& e = batch.front().exit;
        loom::v1::ReportRankExitRequest req;
        req.set_job_id(e.job_id);
        req.set_rank(e.rank);
        req.set_exit_code(e.exit_code);
        req.set_signal(e.signal);
        req.set_reason(e.reason);
        req.set_generation(e.generation);
        req.set_lease_expired(e.fenced);
        // An exit decides a job's fate: it is delivered unless refused.
        Deliver([&](const std::string& id) {
          req.set_worker_id(id);
          loom::v1::ReportRankExitResponse resp;
          ControllerLink::Target used;
          return CallController(
              options_.rpc_timeout,
              [&](ControllerLink::Stub* stub, grpc::ClientContext* ctx) {
                return stub->ReportRankExit(ctx, req, &resp);
              },
              &used);
        });
        batch.pop_front();
        continue;
      }
      loom::v1::ReportStepMetricsRequest req;
      req.set_job_id(batch.front().job_id);
      req.set_generation(batch.front().generation);
      while (!batch.empty() && !batch.front().is_exit && batch.front().job_id == req.job_id() &&
             batch.front().generation == req.generation()) {
        *req.add_events() = std::move(batch.front().event);
        batch.pop_front();
      }
      loom::v1::ReportStepMetricsResponse resp;
      // Kept and sent again while the controller is away (the controller
      // drops steps it already has), so no step or checkpoint report is lost.
      const grpc::Status s = Deliver([&](const std::string& id) {
        req.set_worker_id(id);
        ControllerLink::Target used;
        grpc::Status g = CallController(
            options_.rpc_timeout,
            [&](ControllerLink::Stub* stub, grpc::ClientContext* ctx) {
              return stub->ReportStepMetrics(ctx, req, &resp);
            },
            &used);
        // An older leader's "stop" is not obeyed; the report goes again.
        if (g.ok() && !link_->Accept(used, resp.controller_epoch())) {
          g = StaleEpoch(resp.controller_epoch());
        }
        return g;
      });
      if ((s.ok() && resp.stop()) || s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        // Stopped by the controller, or fenced: this attempt is stale.
        if (!s.ok()) std::cerr << LogTime() << "loom-worker: " << s.error_message() << std::endl;
        supervisor_->Stop(req.job_id(), req.generation());
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    sending_ = false;
  }
}

void WorkerAgent::RemoveEndedSeries(absl::Time now) {
  std::vector<metrics::Labels> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto keep = ended_series_.begin();
    for (auto& e : ended_series_) {
      if (now - e.second >= kSeriesGracePeriod) {
        due.push_back(e.first);
      } else {
        *keep++ = e;
      }
    }
    ended_series_.erase(keep, ended_series_.end());
  }
  // Every series of the ended rank, whatever else labels it (phase, kind,
  // precision, source): nothing here repeats OnEvent's label lists. The
  // job's own checkpoint-failure count goes with it.
  for (const auto& labels : due) {
    registry_->RemoveMatching(labels);
    checkpoint_failures_.RemoveMatching({{"job_id", labels.at("job_id")}});
  }
}

WorkerAgent::LeaseView WorkerAgent::Lease() {
  std::lock_guard<std::mutex> lock(mu_);
  return {lease_renewed_, lease_grace_};
}

absl::Duration WorkerAgent::HeartbeatTimeout() {
  const auto [renewed, grace] = Lease();
  if (renewed == absl::InfinitePast() || supervisor_->Running().empty()) {
    return options_.rpc_timeout;
  }
  const absl::Duration left = std::max(absl::ZeroDuration(), renewed + grace - absl::Now());
  return std::min(options_.rpc_timeout, left + LastChance(grace));
}

void WorkerAgent::EnforceLease(bool last_chance) {
  const auto [renewed, grace] = Lease();
  if (renewed == absl::InfinitePast()) return;  // never registered: no ranks
  absl::Duration silent = absl::Now() - renewed;
  if (silent <= grace) return;
  std::vector<RankSupervisor::RunningRank> running = supervisor_->Running();
  if (running.empty()) return;
  if (last_chance) {
    const absl::Status s = HeartbeatOnce(LastChance(grace));
    const absl::Time now_renewed = Lease().renewed;
    if (s.ok() && absl::Now() - now_renewed <= grace) {
      std::cerr << LogTime() << "loom-worker: lease renewed by a last heartbeat after "
                << absl::FormatDuration(silent) << " without an answer (grace "
                << absl::FormatDuration(grace)
                << "): the controller still holds this worker, so its ranks keep running"
                << std::endl;
      lease_last_chance_renewals_.Increment();
      return;
    }
    silent = absl::Now() - now_renewed;
    running = supervisor_->Running();
    if (running.empty()) return;
    std::cerr << LogTime() << "loom-worker: the last heartbeat before the lease ran out: " << s
              << std::endl;
  }
  std::cerr << LogTime() << "loom-worker: lease expired (no answer from the controller for "
            << absl::FormatDuration(silent) << ", grace " << absl::FormatDuration(grace)
            << "): killing " << running.size()
            << " rank(s) so that no other attempt races them" << std::endl;
  lease_kills_.Increment(static_cast<double>(running.size()));
  supervisor_->KillAll();
}

void WorkerAgent::Run() {
  bool registered = false;
  auto report = [&](bool now) {
    if (options_.on_registration) options_.on_registration(now);
  };
  while (!stop_.load()) {
    absl::Status s;
    if (!registered) {
      s = Register();
      registered = s.ok();
      if (registered) report(true);
      if (!s.ok()) {
        std::cerr << LogTime() << "loom-worker: register failed: " << s << std::endl;
        if (absl::IsUnauthenticated(s) || absl::IsInvalidArgument(s)) {
          std::cerr << LogTime() << "loom-worker: giving up: this will not fix itself" << std::endl;
          return;
        }
      }
    } else {
      s = HeartbeatOnce(HeartbeatTimeout());
      RemoveEndedSeries(absl::Now());
      if (absl::IsNotFound(s)) {
        // The controller restarted or declared us dead: register again,
        // with the ranks running here; it re-adopts those of current
        // attempts and has the rest stopped. The lease still runs.
        std::cerr << LogTime() << "loom-worker: " << s.message() << "; registering again" << std::endl;
        registered = false;
        report(false);
        EnforceLease(/*last_chance=*/false);  // it has no worker id to renew
        continue;  // at once: the lease runs
      } else if (!s.ok()) {
        heartbeats_failed_.Increment();
        // The first failure of a run of them, then one in 20 (every ~10 s).
        if (failed_heartbeats_in_a_row_++ % 20 == 0) {
          std::cerr << LogTime() << "loom-worker: heartbeat failed ("
                    << failed_heartbeats_in_a_row_ << " in a row): " << s << std::endl;
        }
      } else {
        failed_heartbeats_in_a_row_ = 0;
      }
    }
    EnforceLease(/*last_chance=*/registered);
    absl::Duration wait;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wait = registered ? heartbeat_interval_ : absl::Seconds(1);
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(wait), [&] { return stop_.load(); });
  }
  if (registered) report(false);
}

}  // namespace loom::worker
