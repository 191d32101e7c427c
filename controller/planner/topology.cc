#include "controller/planner/topology.h"

#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::planner {

absl::StatusOr<DeviceSpec> LocalCpuDevice(const LocalCpuMeasurement& measured) {
  if (!(measured.peak_flops_fp32 > 0 && std::isfinite(measured.peak_flops_fp32))) {
    return absl::InvalidArgumentError("cpu: measured peak_flops_fp32 must be > 0");
  }
  if (measured.memory_bytes <= 0) {
    return absl::InvalidArgumentError("cpu: memory_bytes must be > 0");
  }
  if (!(measured.memory_bandwidth_bytes_per_second > 0)) {
    return absl::InvalidArgumentError("cpu: memory_bandwidth_bytes_per_second must be > 0");
  }
  DeviceSpec cpu;
  cpu.name = "cpu";
  cpu.memory_bytes = measured.memory_bytes;
  cpu.peak_flops_fp32 = measured.peak_flops_fp32;
  cpu.peak_flops_tf32 = measured.peak_flops_fp32;
  cpu.peak_flops_bf16 = measured.peak_flops_fp32;
  cpu.peak_flops_fp16 = measured.peak_flops_fp32;
  cpu.hbm_bandwidth_bytes_per_second = measured.memory_bandwidth_bytes_per_second;
  cpu.intra_node_bandwidth_bytes_per_second = measured.memory_bandwidth_bytes_per_second;
  cpu.power_watts = measured.power_watts;
  cpu.efficiency = GemmEfficiency{1.0, 0, 0};
  if (!(measured.layer_fixed_seconds >= 0) || !(measured.layer_seconds_per_activation >= 0)) {
    return absl::InvalidArgumentError("cpu: measured per-layer costs must be >= 0");
  }
  cpu.layer_fixed_seconds = measured.layer_fixed_seconds;
  cpu.layer_seconds_per_activation = measured.layer_seconds_per_activation;
  cpu.host_memory_is_device_memory = true;
  cpu.collectives_share_compute_cores = true;
  if (!(measured.ranks_per_core >= 1) || !std::isfinite(measured.ranks_per_core)) {
    return absl::InvalidArgumentError("cpu: ranks_per_core must be >= 1");
  }
  cpu.ranks_per_core = measured.ranks_per_core;
  if (measured.shared_host_cores < 1) {
    return absl::InvalidArgumentError("cpu: shared_host_cores must be >= 1");
  }
  cpu.shared_host_cores = measured.shared_host_cores;
  if (!(measured.collective_idle_fraction >= 0 && measured.collective_idle_fraction <= 1)) {
    return absl::InvalidArgumentError("cpu: collective_idle_fraction must be in [0, 1]");
  }
  cpu.collective_idle_fraction = measured.collective_idle_fraction;
  return cpu;
}

int ClusterTopology::racks() const {
  if (nodes_per_rack <= 0) return 1;
  return (nodes + nodes_per_rack - 1) / nodes_per_rack;
}

absl::Status ValidateTopology(const ClusterTopology& topology) {
  auto invalid = [](absl::string_view field, absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
  };
  auto positive = [](double x) { return std::isfinite(x) && x > 0; };
  auto non_negative = [](double x) { return std::isfinite(x) && x >= 0; };
  if (topology.nodes < 1) return invalid("nodes", "must be >= 1");
  if (topology.devices_per_node < 1) return invalid("devices_per_node", "must be >= 1");
  if (topology.device.memory_bytes <= 0) return invalid("device", "memory must be > 0");
  if (!positive(topology.device.hbm_bandwidth_bytes_per_second)) {
    return invalid("device", "HBM bandwidth must be > 0");
  }
  const GemmEfficiency& eff = topology.device.efficiency;
  if (!(positive(eff.max_fraction) && eff.max_fraction <= 1)) {
    return invalid("device_overrides.efficiency.max", "must be in (0, 1]");
  }
  if (!non_negative(eff.half_width)) {
    return invalid("device_overrides.efficiency.half_width", "must be >= 0");
  }
  if (!non_negative(eff.half_tokens)) {
    return invalid("device_overrides.efficiency.half_tokens", "must be >= 0");
  }
  if (topology.devices_per_node > 1 &&
      !positive(topology.intra_node_bandwidth_bytes_per_second)) {
    return invalid("intra_node.bandwidth_gb_per_s", "must be > 0");
  }
  if (topology.nodes > 1 && !positive(topology.inter_node_bandwidth_bytes_per_second)) {
    return invalid("inter_node.bandwidth_gbit_per_s", "required when nodes > 1");
  }
  if (!non_negative(topology.inter_node_bandwidth_bytes_per_second)) {
    return invalid("inter_node.bandwidth_gbit_per_s", "must be >= 0");
  }
  if (!non_negative(topology.intra_node_latency_seconds)) {
    return invalid("intra_node.latency_us", "must be >= 0");
  }
  if (!non_negative(topology.inter_node_latency_seconds)) {
    return invalid("inter_node.latency_us", "must be >= 0");
  }
  if (topology.nodes_per_rack < 0) return invalid("racks.nodes_per_rack", "must be >= 1");
  if (topology.nodes_per_rack > 0 && topology.nodes % topology.nodes_per_rack != 0) {
    return invalid("racks.nodes_per_rack",
                   absl::StrCat(topology.nodes_per_rack, " does not divide nodes ",
                                topology.nodes));
  }
  if (!non_negative(topology.inter_rack_bandwidth_bytes_per_second)) {
    return invalid("racks.inter_rack_bandwidth_gbit_per_s", "must be >= 0");
  }
  if (!non_negative(topology.device_power_watts)) {
    return invalid("power.device_watts", "must be >= 0");
  }
  if (!non_negative(topology.host_power_watts)) {
    return invalid("power.host_watts", "must be >= 0");
  }
  if (!non_negative(topology.price_per_device_hour_usd)) {
    return invalid("price_per_device_hour_usd", "must be >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterTopology> MakeTopology(
    absl::string_view device_name, int nodes, int devices_per_node,
    double inter_node_bandwidth_bytes_per_second) {
  absl::StatusOr<DeviceSpec> device = LookupDevice(device_name);
  if (!device.ok()) return device.status();
  ClusterTopology topology;
  topology.name = absl::StrCat(nodes, "x", devices_per_node, " ", device->name);
  topology.nodes = nodes;
  topology.devices_per_node = devices_per_node;
  topology.device = *device;
  topology.intra_node_bandwidth_bytes_per_second =
      device->intra_node_bandwidth_bytes_per_second;
  topology.inter_node_bandwidth_bytes_per_second = inter_node_bandwidth_bytes_per_second;
  absl::Status valid = ValidateTopology(topology);
  if (!valid.ok()) return valid;
  return topology;
}

}  // namespace loom::planner
