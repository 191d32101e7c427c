#include "controller/workers/worker_registry.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::controller {

WorkerRegistry::WorkerRegistry(const Clock* clock, WorkerRegistryOptions options)
    : clock_(clock), options_(std::move(options)) {
  std::random_device rd;
  nonce_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

absl::Status WorkerRegistry::ValidateRegistration(const loom::v1::RegisterWorkerRequest& req) {
  if (req.node().empty()) return absl::InvalidArgumentError("node: must not be empty");
  if (req.address().empty()) return absl::InvalidArgumentError("address: must not be empty");
  if (req.slots() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots: must be >= 1, got ", req.slots()));
  }
  if (req.gpus() < 0 || req.gpus() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpus: must be in [0, 1024], got ", req.gpus()));
  }
  // Measured figures the planner divides and multiplies by: finite, >= 0
  // (0 = not measured).
  const std::pair<const char*, double> measured[] = {
      {"gemm_flops_per_second_per_thread", req.gemm_flops_per_second_per_thread()},
      {"memory_bandwidth_bytes_per_second", req.memory_bandwidth_bytes_per_second()},
      {"block_fixed_seconds", req.block_fixed_seconds()},
      {"block_seconds_per_activation", req.block_seconds_per_activation()},
      {"allreduce_latency_seconds", req.allreduce_latency_seconds()},
      {"allreduce_bytes_per_second", req.allreduce_bytes_per_second()},
      {"tensor_collective_extra_seconds", req.tensor_collective_extra_seconds()},
      {"tensor_collective_idle_fraction", req.tensor_collective_idle_fraction()},
      {"concurrent_slowdown", req.concurrent_slowdown()},
  };
  for (const auto& [field, value] : measured) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be a finite number >= 0, got ", value));
    }
  }
  if (req.tensor_collective_idle_fraction() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_collective_idle_fraction: a fraction, at most 1, got ",
                     req.tensor_collective_idle_fraction()));
  }
  if (req.concurrent_slowdown() != 0 && req.concurrent_slowdown() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("concurrent_slowdown: at least 1 (or 0: not measured), got ",
                     req.concurrent_slowdown()));
  }
  if (req.host_id().size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_id: at most 256 characters, got ", req.host_id().size()));
  }
  return absl::OkStatus();
}

std::optional<WorkerRegistry::DepartedWorker> WorkerRegistry::RemoveNode(
    const std::string& node) {
  auto previous = worker_by_node_.find(node);
  if (previous == worker_by_node_.end()) return std::nullopt;
  auto it = workers_.find(previous->second);
  worker_by_node_.erase(previous);
  if (it == workers_.end()) return std::nullopt;
  Worker& old = it->second;
  DepartedWorker gone;
  gone.info = old.info;
  gone.last_heartbeat = old.last_heartbeat;
  gone.silent = clock_->Now() - old.last_heartbeat;
  if (old.info.alive()) {
    gone.ranks = std::move(old.ranks);
    alive_ -= 1;
    lease_order_.erase(old.lease_entry);
  }
  by_id_.erase(it->first);
  workers_.erase(it);
  return gone;
}

WorkerRegistry::Worker& WorkerRegistry::Add(const loom::v1::RegisterWorkerRequest& req) {
  const absl::Time now = clock_->Now();
  CreditPause(now);  // a registration is activity too (see RecordHeartbeat)
  std::string id = absl::StrFormat(
      "%s-%06x", req.node(), (nonce_ + static_cast<uint64_t>(absl::ToUnixNanos(now))) & 0xffffff);
  Worker& w = workers_[id];
  by_id_[id] = &w;
  w.info.set_id(id);
  w.info.set_node(req.node());
  w.info.set_address(req.address());
  w.info.set_slots(req.slots());
  w.info.set_cpus(req.cpus());
  w.info.set_gpus(req.gpus());
  w.info.set_memory_bytes(req.memory_bytes());
  w.info.set_metrics_address(req.metrics_address());
  w.info.set_gemm_flops_per_second_per_thread(req.gemm_flops_per_second_per_thread());
  w.info.set_memory_bandwidth_bytes_per_second(req.memory_bandwidth_bytes_per_second());
  w.info.set_gemm_source(req.gemm_source());
  w.info.set_zone(req.zone());
  w.info.set_rack(req.rack());
  w.info.set_host_id(req.host_id());
  w.info.set_host_memory_bytes(req.host_memory_bytes());
  w.info.set_block_fixed_seconds(req.block_fixed_seconds());
  w.info.set_block_seconds_per_activation(req.block_seconds_per_activation());
  w.info.set_allreduce_latency_seconds(req.allreduce_latency_seconds());
  w.info.set_allreduce_bytes_per_second(req.allreduce_bytes_per_second());
  w.info.set_tensor_collective_extra_seconds(req.tensor_collective_extra_seconds());
  w.info.set_tensor_collective_idle_fraction(req.tensor_collective_idle_fraction());
  w.info.set_concurrent_slowdown(req.concurrent_slowdown());
  if (w.info.alive()) {  // (an id drawn twice)
    lease_order_.erase(w.lease_entry);
    alive_ -= 1;
  }
  w.info.set_alive(true);
  alive_ += 1;
  w.lease_entry = lease_order_.insert(lease_order_.end(), &w);
  worker_by_node_[req.node()] = id;
  w.last_heartbeat = now;
  w.lease_from = now;
  return w;
}

absl::StatusOr<WorkerRegistry::HeartbeatRecord> WorkerRegistry::RecordHeartbeat(
    const std::string& worker_id, int rendezvous_port) {
  Worker* w = FindAlive(worker_id);
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker \"", worker_id,
                                            "\" is not registered (or was declared dead); "
                                            "register again"));
  }
  const absl::Time now = clock_->Now();
  // A heartbeat taken after a pause but before the next check: the workers
  // heard before the pause get its credit now, as the check would have.
  CreditPause(now);
  w->last_heartbeat = now;
  w->lease_from = w->last_heartbeat;
  lease_order_.splice(lease_order_.end(), lease_order_, w->lease_entry);
  HeartbeatRecord record;
  record.worker = w;
  // A worker whose fresh rendezvous port was used gives the next one here.
  const bool had_none = w->rendezvous_port == 0;
  if (rendezvous_port > 0 && rendezvous_port < 65536) w->rendezvous_port = rendezvous_port;
  record.rendezvous_port_came = had_none && w->rendezvous_port > 0;
  return record;
}

void WorkerRegistry::CreditPause(absl::Time now) {
  if (last_activity_ != absl::InfinitePast() &&
      now - last_activity_ > options_.pause_threshold) {
    // Nothing ran here for the gap: the workers heard before it get its
    // excess back. Adding the same credit to a prefix of the lease order
    // and capping at now keeps the order only up to ties, so it is sorted
    // again (stable; rare).
    const absl::Duration credit = (now - last_activity_) - options_.pause_threshold;
    for (Worker* w : lease_order_) {
      if (w->lease_from <= last_activity_) w->lease_from = std::min(now, w->lease_from + credit);
    }
    lease_order_.sort([](const Worker* a, const Worker* b) { return a->lease_from < b->lease_from; });
    paused_ += credit;
  }
  last_activity_ = std::max(last_activity_, now);
}

std::vector<WorkerRegistry::DepartedWorker> WorkerRegistry::ExpireLeases() {
  const absl::Time now = clock_->Now();
  CreditPause(now);
  std::vector<DepartedWorker> dead;
  while (!lease_order_.empty()) {
    Worker& w = *lease_order_.front();
    if (now - w.lease_from <= options_.worker_timeout) break;  // and so is everyone after it
    const absl::Duration silent = now - w.last_heartbeat;
    lease_order_.pop_front();
    DepartedWorker gone;
    gone.info = w.info;
    gone.last_heartbeat = w.last_heartbeat;
    gone.silent = silent;
    gone.paused = w.lease_from - w.last_heartbeat;
    gone.ranks = std::move(w.ranks);
    w.ranks.clear();
    w.info.set_alive(false);
    alive_ -= 1;
    w.pending_commands.clear();
    dead.push_back(std::move(gone));
  }
  std::sort(dead.begin(), dead.end(), [](const DepartedWorker& a, const DepartedWorker& b) {
    return a.info.id() < b.info.id();
  });
  return dead;
}

WorkerRegistry::Worker* WorkerRegistry::Find(const std::string& id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

const WorkerRegistry::Worker* WorkerRegistry::Find(const std::string& id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

WorkerRegistry::Worker* WorkerRegistry::FindAlive(const std::string& id) {
  Worker* w = Find(id);
  return w != nullptr && w->info.alive() ? w : nullptr;
}

std::vector<WorkerOffer> WorkerRegistry::Offers(bool with_free_gpus) const {
  std::vector<WorkerOffer> offers;
  for (const auto& [id, w] : workers_) {
    if (!w.info.alive() || IsCordoned(w.info.node())) continue;
    WorkerOffer offer;
    offer.info = w.info;
    offer.free_slots = w.info.slots() - static_cast<int>(w.ranks.size());
    if (with_free_gpus) {
      // GPUs no live rank holds.
      std::vector<bool> held(std::max(0, w.info.gpus()), false);
      for (const RankSlot& r : w.ranks) {
        if (r.gpu >= 0 && r.gpu < static_cast<int>(held.size())) held[r.gpu] = true;
      }
      for (int g = 0; g < static_cast<int>(held.size()); ++g) {
        if (!held[g]) offer.free_gpus.push_back(g);
      }
    }
    offers.push_back(std::move(offer));
  }
  return offers;
}

std::vector<loom::v1::WorkerInfo> WorkerRegistry::Infos() const {
  std::vector<loom::v1::WorkerInfo> infos;
  for (const auto& [id, w] : workers_) infos.push_back(w.info);
  return infos;
}

std::vector<loom::v1::WorkerInfo> WorkerRegistry::List() const {
  std::vector<loom::v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_) {
    loom::v1::WorkerInfo info = w.info;
    info.set_slots_used(static_cast<int>(w.ranks.size()));
    info.set_last_heartbeat_unix_ms(absl::ToUnixMillis(w.last_heartbeat));
    if (auto c = cordons_.find(w.info.node()); c != cordons_.end() && IsCordoned(w.info.node())) {
      info.set_cordoned(true);
      info.set_cordoned_until_unix_ms(
          c->second.until == absl::InfiniteFuture() ? 0 : absl::ToUnixMillis(c->second.until));
      info.set_cordon_reason(c->second.reason);
    }
    out.push_back(std::move(info));
  }
  return out;
}

void WorkerRegistry::HoldSlot(Worker& w, RankSlot slot) { w.ranks.push_back(std::move(slot)); }

void WorkerRegistry::RankExited(Worker& w, const std::string& job_id, int rank) {
  w.unacked.erase({job_id, rank});
  ReleaseSlotsIf(w, [&](const RankSlot& s) { return s.job_id == job_id && s.rank == rank; });
}

bool WorkerRegistry::ReleaseSlotsIf(Worker& w,
                                    const std::function<bool(const RankSlot&)>& gone) {
  const size_t before = w.ranks.size();
  w.ranks.erase(std::remove_if(w.ranks.begin(), w.ranks.end(), gone), w.ranks.end());
  return w.ranks.size() != before;
}

void WorkerRegistry::ReleaseJobSlots(const std::string& job_id) {
  for (auto& [id, w] : workers_) {
    ReleaseSlotsIf(w, [&](const RankSlot& s) { return s.job_id == job_id; });
  }
}

WorkerRegistry::CordonEntry WorkerRegistry::Cordon(const std::string& node, absl::Time until,
                                                   std::string reason) {
  auto it = cordons_.find(node);
  if (it == cordons_.end() || clock_->Now() >= it->second.until || until >= it->second.until) {
    cordons_[node] = CordonEntry{until, std::move(reason)};
  }
  return cordons_[node];
}

bool WorkerRegistry::Uncordon(const std::string& node) {
  const bool was = IsCordoned(node);
  cordons_.erase(node);
  return was;
}

int64_t WorkerRegistry::CordonEndToUnixMillis(absl::Time until) {
  return until == absl::InfiniteFuture() ? std::numeric_limits<int64_t>::max()
                                         : absl::ToUnixMillis(until);
}

absl::Time WorkerRegistry::CordonEndFromUnixMillis(int64_t unix_ms) {
  return unix_ms == std::numeric_limits<int64_t>::max() ? absl::InfiniteFuture()
                                                        : absl::FromUnixMillis(unix_ms);
}

std::optional<absl::Time> WorkerRegistry::CordonedUntil(const std::string& node) const {
  auto it = cordons_.find(node);
  if (it == cordons_.end() || clock_->Now() >= it->second.until) return std::nullopt;
  return it->second.until;
}

}  // namespace loom::controller
