// TopologyForSpec (job_planning.h): the live cluster as the planner sees
// it for a job's gang.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/admission/job_planning.h"
#include "controller/admission/scheduler.h"
#include "controller/planner/report.h"

namespace loom::controller {
namespace {

double Gb(double bytes) { return bytes / 1e9; }

}  // namespace

absl::StatusOr<LiveTopology> TopologyForSpec(const loom::v1::JobSpec& spec,
                                             const std::vector<loom::v1::WorkerInfo>& workers) {
  const auto& res = spec.resources();
  int n_workers = std::max(1, res.workers());
  int n_ranks = std::max(n_workers, res.ranks());
  int threads = std::max(1, res.threads_per_rank());

  double gemm = std::numeric_limits<double>::infinity();
  double bandwidth = std::numeric_limits<double>::infinity();
  double memory = std::numeric_limits<double>::infinity();
  int alive = 0;
  bool measured = true;
  double layer_fixed = 0, layer_per_activation = 0;  // 0: no worker measured them
  double collective_latency = 0;                     // 0: no worker measured it
  double collective_bandwidth = std::numeric_limits<double>::infinity();
  double collective_extra = 0;    // per tensor-parallel collective, beyond its ring time
  double collective_idle = 0;     // the fraction of a collective's time off the CPU
  double slowest_collective = 0;  // the chosen worker's cost of a reference collective
  double link_latency = 0;        // the largest any worker measured
  double link_bandwidth = std::numeric_limits<double>::infinity();  // the smallest
  // Workers that report one host id share that machine's cores and memory
  // (several local workers, pods of one Kubernetes node). This job puts
  // about ceil(ranks / workers) ranks on each of its workers, so it puts
  // that many per co-hosted worker on a host, at most the host's slots.
  struct Host {
    int workers = 0;
    int slots = 0;
    int cpus = 0;
    uint64_t memory_bytes = 0;
    int slowdown_readings = 0;
    double slowdown_sum = 0;  // of its workers' concurrent_slowdown readings
  };
  std::map<std::string, Host> hosts;
  // Sums of the tensor-parallel collective figures each host's workers
  // measured (bandwidth as seconds per byte).
  struct CollectiveFigures {
    int workers = 0;
    double latency = 0, seconds_per_byte = 0, extra = 0, idle = 0;
  };
  std::map<std::string, CollectiveFigures> collectives;
  // A worker without a host id has its machine to itself.
  auto host_key = [&workers](const loom::v1::WorkerInfo& w) {
    return w.host_id().empty() ? absl::StrCat("worker ", &w - workers.data())
                               : absl::StrCat("host ", w.host_id());
  };
  for (const auto& w : workers) {
    if (!w.alive()) continue;
    Host& h = hosts[host_key(w)];
    h.workers += 1;
    h.slots += std::max(1, w.slots());
    h.cpus = std::max(h.cpus, w.cpus());
    h.memory_bytes = std::max<uint64_t>(h.memory_bytes, w.host_memory_bytes());
    if (w.concurrent_slowdown() >= 1) {
      h.slowdown_readings += 1;
      h.slowdown_sum += w.concurrent_slowdown();
    }
  }
  const int ranks_per_worker = (n_ranks + n_workers - 1) / n_workers;
  int most_sharing = 1;       // ranks per core on the most loaded host (for the description)
  double ranks_per_core = 1;  // the same, exactly (DeviceSpec::ranks_per_core)
  int shared_host_cores = 1;  // that host's cores, in rank threads (DeviceSpec::shared_host_cores)
  for (const auto& w : workers) {
    if (!w.alive()) continue;
    ++alive;
    int slots = std::max(1, w.slots());
    const Host& host = hosts[host_key(w)];
    const int host_ranks =
        std::max(1, std::min(host.slots, ranks_per_worker * std::min(host.workers, n_workers)));
    // A rank gets threads_per_rank threads, but no more than a slot's share
    // of the host's cores (any slot may be busy); when this job alone puts
    // more ranks than cores on the host, they time-share them: the rates
    // stay a core's own, and the cost model counts the sharing
    // (DeviceSpec::ranks_per_core).
    int rank_threads = threads;
    double core_share = 1.0;
    if (host.cpus > 0) {
      rank_threads = std::min(threads, std::max(1, host.cpus / host.slots));
      core_share = std::min(1.0, static_cast<double>(host.cpus) / (host_ranks * rank_threads));
      most_sharing = std::max(most_sharing, (host_ranks + host.cpus - 1) / host.cpus);
      if (1.0 / core_share > ranks_per_core) {
        ranks_per_core = 1.0 / core_share;
        shared_host_cores = std::max(1, host.cpus / rank_threads);
      }
    }
    // The figures below are one thread's alone on an idle host. Ranks
    // computing on several of its cores at once run slower (shared caches
    // and memory bandwidth): by the host's measured slowdown with every
    // core busy (its workers' readings averaged), in proportion to the
    // other cores this job keeps busy. (Measured on 2 cores: two ranks'
    // compute took 5-13% longer than one rank's alone.)
    double slower = 1.0;
    if (host.slowdown_readings > 0 && host.cpus > rank_threads) {
      const int cores = host.cpus / rank_threads;
      const int busy = std::min(host_ranks, cores);
      slower = 1.0 + (host.slowdown_sum / host.slowdown_readings - 1.0) * (busy - 1) / (cores - 1);
    }
    double per_thread = w.gemm_flops_per_second_per_thread();
    if (!(per_thread > 0)) {
      per_thread = kEstimatedGemmFlopsPerThread;
      measured = false;
    }
    gemm = std::min(gemm, per_thread * rank_threads / slower);
    // Per-layer costs beyond the FLOPs, measured on one thread alone: the
    // slowest worker's.
    if (w.block_fixed_seconds() > 0 || w.block_seconds_per_activation() > 0) {
      layer_fixed = std::max(layer_fixed, w.block_fixed_seconds() * slower);
      layer_per_activation =
          std::max(layer_per_activation, w.block_seconds_per_activation() * slower);
    }
    if (w.allreduce_latency_seconds() > 0 && w.allreduce_bytes_per_second() > 0) {
      // As the link between workers of one host, for data-parallel and
      // pipeline traffic: the slowest latency and bandwidth measured.
      link_latency = std::max(link_latency, w.allreduce_latency_seconds());
      link_bandwidth = std::min(link_bandwidth, w.allreduce_bytes_per_second());
      CollectiveFigures& c = collectives[host_key(w)];
      c.workers += 1;
      c.latency += w.allreduce_latency_seconds();
      c.seconds_per_byte += 1.0 / w.allreduce_bytes_per_second();
      c.extra += w.tensor_collective_extra_seconds();
      c.idle += w.tensor_collective_idle_fraction();
    }
    double bw = w.memory_bandwidth_bytes_per_second();
    if (!(bw > 0)) {
      bw = kEstimatedMemoryBandwidthBytesPerSecond;
      measured = false;
    }
    bandwidth = std::min(bandwidth, bw);
    double mem = static_cast<double>(w.memory_bytes()) / slots;
    if (w.memory_bytes() == 0) {
      mem = kEstimatedMemoryPerSlotBytes;
      measured = false;
    }
    // What each worker lends is capped by the host's RAM over all its
    // slots (a shortfall of memory fails a rank, so any slot counts).
    if (host.memory_bytes > 0) {
      mem = std::min(mem, static_cast<double>(host.memory_bytes) / host.slots);
    }
    memory = std::min(memory, mem);
  }
  // Collectives between ranks of one worker, as measured between two: the
  // slowest host's figures, as one set (by its cost of a collective of the
  // probe's reference activation, 128 KiB). Mixing the largest latency of
  // one worker with the lowest bandwidth and largest extra of others added
  // up to more than any worker measured (2.5 ms a collective from workers
  // that measured 1.4 and 1.6). Workers of one host measured one machine,
  // so their figures are averaged: the largest of two readings of it, each
  // off by 10-40% from run to run (worker/engine/block_probe.h), had made
  // the tensor-parallel layouts' collectives ~20% too slow
  // (bench/plan_accuracy_bench.cc).
  for (const auto& [key, c] : collectives) {
    constexpr double kReferenceBytes = 4.0 * 256 * 128;
    const double n = c.workers;
    const double cost = (2 * c.latency + kReferenceBytes * c.seconds_per_byte + c.extra) / n;
    if (cost > slowest_collective) {
      slowest_collective = cost;
      collective_latency = c.latency / n;
      collective_bandwidth = n / c.seconds_per_byte;
      collective_extra = c.extra / n;
      collective_idle = c.idle / n;
    }
  }
  if (alive == 0) {
    measured = false;
    gemm = kEstimatedGemmFlopsPerThread * threads;
    bandwidth = kEstimatedMemoryBandwidthBytesPerSecond;
    memory = kEstimatedMemoryPerSlotBytes;
  }
  planner::LocalCpuMeasurement m;
  m.peak_flops_fp32 = gemm;
  m.memory_bytes = static_cast<int64_t>(memory);
  m.memory_bandwidth_bytes_per_second = bandwidth;
  m.layer_fixed_seconds = layer_fixed;
  m.layer_seconds_per_activation = layer_per_activation;
  m.ranks_per_core = ranks_per_core;
  m.shared_host_cores = shared_host_cores;
  m.collective_idle_fraction = std::clamp(collective_idle, 0.0, 1.0);
  auto device = planner::LocalCpuDevice(m);
  if (!device.ok()) return device.status();

  LiveTopology live;
  planner::ClusterTopology& t = live.topology;
  // The scheduler (scheduler.h) gives every worker the same number of whole
  // tensor groups when the ranks split evenly; when they do not, the
  // planner's homogeneous model cannot express it, so every rank counts as
  // its own node (all traffic over the network).
  if (n_ranks % n_workers == 0) {
    t.nodes = n_workers;
    t.devices_per_node = n_ranks / n_workers;
  } else {
    t.nodes = n_ranks;
    t.devices_per_node = 1;
  }
  // Racks: those of the workers the scheduler would choose for the gang on
  // an idle cluster (in rack order, whole replicas per rack first), when
  // their labels split them evenly.
  std::string racks;
  if (t.nodes == n_workers) {
    std::vector<loom::v1::WorkerInfo> able;
    for (const auto& w : workers) {
      if (w.alive() && w.slots() >= t.devices_per_node) able.push_back(w);
    }
    std::stable_sort(able.begin(), able.end(), InRackOrder);
    const auto& par = spec.parallelism();
    const int replica_ranks =
        par.auto_() ? 1 : std::max(1, par.tensor()) * std::max(1, par.pipeline());
    const int per_replica =
        std::max(1, (replica_ranks + t.devices_per_node - 1) / t.devices_per_node);
    std::vector<loom::v1::WorkerInfo> gang;
    for (int i : ChooseInRackOrder(able, n_workers, per_replica)) gang.push_back(able[i]);
    if (static_cast<int>(gang.size()) == n_workers) t.nodes_per_rack = NodesPerRack(gang);
    if (t.nodes_per_rack > 0 && t.nodes_per_rack < t.nodes) {
      racks = absl::StrFormat(", %d racks of %d worker(s)", t.nodes / t.nodes_per_rack,
                              t.nodes_per_rack);
    }
  }
  t.device = *device;
  t.intra_node_bandwidth_bytes_per_second = device->intra_node_bandwidth_bytes_per_second;
  // Ranks of one worker talk through Gloo on loopback, far slower than a
  // memory copy: the workers' measured all-reduce, where they measured it.
  if (collective_latency > 0 && std::isfinite(collective_bandwidth)) {
    t.intra_node_latency_seconds = collective_latency;
    t.intra_node_bandwidth_bytes_per_second = collective_bandwidth;
    t.intra_node_collective_extra_seconds = collective_extra;
  }
  // No worker measures its network (worker/cpu_probe.h times GEMM and
  // memory copies only), so the network is the documented assumption, and
  // the description says so; except that workers which all share one host
  // talk over its loopback, which is what their all-reduce probe measured.
  t.inter_node_bandwidth_bytes_per_second =
      kEstimatedNodeNetworkBytesPerSecond / t.devices_per_node;
  const bool one_host =
      alive > 0 && hosts.size() == 1 && absl::StartsWith(hosts.begin()->first, "host ");
  std::string network = absl::StrFormat("network assumed %.0f Gb/s per worker, not measured",
                                        kEstimatedNodeNetworkBytesPerSecond * 8 / 1e9);
  if (one_host && link_latency > 0 && std::isfinite(link_bandwidth)) {
    t.inter_node_latency_seconds = link_latency;
    t.inter_node_bandwidth_bytes_per_second = link_bandwidth;
    network = absl::StrFormat("workers on one host, their network its loopback (%.2f GB/s)",
                              link_bandwidth / 1e9);
  }
  live.measured = measured;
  t.name = absl::StrFormat("%d x %d cpu", t.nodes, t.devices_per_node);
  live.description = absl::StrFormat(
      "%s%s, %.1f GFLOP/s and %.1f GB per slot, %s (%s)", t.name, racks, gemm / 1e9, Gb(memory),
      network,
      alive == 0 ? "no live workers: estimated figures"
                 : absl::StrCat(alive, " live worker(s), ",
                                measured ? "measured GEMM" : "partly estimated figures",
                                most_sharing > 1 ? absl::StrCat(", up to ", most_sharing,
                                                                " ranks per core on a shared host")
                                                 : "",
                                layer_fixed > 0 || layer_per_activation > 0
                                    ? absl::StrFormat(", blocks %.2f ms + %.0f ns per "
                                                      "activation element beyond FLOPs",
                                                      layer_fixed * 1e3, layer_per_activation * 1e9)
                                    : ""));
  absl::Status valid = planner::ValidateTopology(t);
  if (!valid.ok()) return valid;
  return live;
}

}  // namespace loom::controller
