// The hardware the planner plans for: the cluster topology (nodes x
// devices, links, optional racks, power and price) over devices of the
// catalog (common/device_catalog.h, which the worker shares) or the local
// CPU as measured.
//
// Units: bytes, bytes/second, FLOP/s, seconds, watts, US dollars. Memory
// sizes are decimal (1 GB = 1e9 bytes) and quote the vendor's marketed size,
// so an "80 GB" A100 is 80e9 bytes here (its 80 GiB HBM leaves the ~7% gap
// as headroom). Link bandwidths are per device and per direction.
//
// Everything here is a pure function or plain data; thread-safe.
#ifndef LOOM_CONTROLLER_PLANNER_TOPOLOGY_H_
#define LOOM_CONTROLLER_PLANNER_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device_catalog.h"
#include "controller/planner/model.h"

namespace loom::planner {

// The device catalog's types and look-ups, as the planner has always
// spelled them.
using ::loom::CatalogDeviceNames;
using ::loom::DeviceSpec;
using ::loom::GemmEfficiency;
using ::loom::LookupDevice;
using ::loom::LookupDeviceByProductName;

// The local CPU as one "device", from figures measured at run time (the
// worker times a matmul; this library does no measuring). Its bf16/fp16
// peaks equal the fp32 one (no faster low-precision units are assumed), its
// GEMM efficiency is 1 at every size (the measurement already is the
// achieved rate), and intra-node bandwidth is the memory bandwidth.
struct LocalCpuMeasurement {
  double peak_flops_fp32 = 0;            // measured, > 0
  int64_t memory_bytes = 0;              // usable RAM, > 0
  double memory_bandwidth_bytes_per_second = 0;  // measured, > 0
  double power_watts = 0;                // package power; 0 = unknown
  // DeviceSpec::layer_fixed_seconds / layer_seconds_per_activation, as
  // measured; 0 = not measured.
  double layer_fixed_seconds = 0;
  double layer_seconds_per_activation = 0;
  double ranks_per_core = 1;  // DeviceSpec::ranks_per_core, >= 1
  int shared_host_cores = 1;  // DeviceSpec::shared_host_cores, >= 1
  double collective_idle_fraction = 0;  // DeviceSpec::collective_idle_fraction, in [0, 1]
};
absl::StatusOr<DeviceSpec> LocalCpuDevice(const LocalCpuMeasurement& measured);

// A homogeneous cluster. Nodes are numbered 0..nodes-1; when racks are
// given, rack r holds nodes [r x nodes_per_rack, (r+1) x nodes_per_rack).
struct ClusterTopology {
  std::string name;
  int nodes = 0;
  int devices_per_node = 0;
  DeviceSpec device;
  double intra_node_bandwidth_bytes_per_second = 0;  // per device, per direction
  double intra_node_latency_seconds = 3e-6;          // per hop
  // Added to every tensor-parallel collective inside a node, beyond its
  // ring time: what CPU workers measured a 2-rank tensor-parallel block to
  // cost beyond its parts (ranks waiting on each other where they share
  // cores; worker/engine/block_probe.h). 0 for accelerators.
  double intra_node_collective_extra_seconds = 0;
  double inter_node_bandwidth_bytes_per_second = 0;  // per device (its NIC share)
  double inter_node_latency_seconds = 10e-6;
  int nodes_per_rack = 0;  // 0 = no rack structure
  // Per-device bandwidth for traffic between racks (an oversubscribed spine);
  // 0 = same as inter-node.
  double inter_rack_bandwidth_bytes_per_second = 0;
  double device_power_watts = 0;  // 0 = device.power_watts
  double host_power_watts = 0;    // per node, on top of its devices
  double price_per_device_hour_usd = 0;  // 0 = no cost estimate

  int total_devices() const { return nodes * devices_per_node; }
  int racks() const;  // 1 when nodes_per_rack is 0
  double effective_device_power_watts() const {
    return device_power_watts > 0 ? device_power_watts : device.power_watts;
  }
  double effective_inter_rack_bandwidth() const {
    return inter_rack_bandwidth_bytes_per_second > 0
               ? inter_rack_bandwidth_bytes_per_second
               : inter_node_bandwidth_bytes_per_second;
  }
};

// Checks a topology. INVALID_ARGUMENT whose message starts with the field
// path as written in the YAML format (topology_yaml.h), e.g.
// "inter_node.bandwidth_gbit_per_s: required when nodes > 1".
absl::Status ValidateTopology(const ClusterTopology& topology);

// A topology of `nodes` x `devices_per_node` catalog devices, intra-node
// bandwidth from the catalog and the given per-device network bandwidth.
absl::StatusOr<ClusterTopology> MakeTopology(
    absl::string_view device_name, int nodes, int devices_per_node,
    double inter_node_bandwidth_bytes_per_second);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_TOPOLOGY_H_
