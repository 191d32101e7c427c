// The ClusterTopology YAML format. Every field, with units in the name:
//
//   name: dgx-a100-256                # free text, for reports
//   device: A100-80GB                 # catalog name (topology.h) or "cpu"
//   nodes: 32
//   devices_per_node: 8
//   device_overrides:                 # optional; replaces catalog figures
//     memory_gb: 80
//     hbm_bandwidth_gb_per_s: 2039
//     power_watts: 400
//     peak_tflops: {fp32: 19.5, tf32: 156, bf16: 312, fp16: 312, fp8: 0}
//     efficiency: {max: 0.8, half_width: 96, half_tokens: 128}
//   intra_node:                       # optional; default: catalog NVLink
//     bandwidth_gb_per_s: 300         # per device, per direction (GB = 1e9 B)
//     latency_us: 3
//   inter_node:                       # required when nodes > 1
//     bandwidth_gbit_per_s: 200       # per device (its NIC share), Gb/s
//     latency_us: 10
//   racks:                            # optional
//     nodes_per_rack: 4
//     inter_rack_bandwidth_gbit_per_s: 100  # per device; default inter_node
//   power:                            # optional
//     device_watts: 400               # default: catalog TDP
//     host_watts: 200                 # per node, beyond its devices
//   price_per_device_hour_usd: 3.0    # optional
//
// "cpu" means the local CPU measured at run time: its peak, memory and
// memory bandwidth come from the LocalCpuMeasurement the caller passes (the
// worker measures them), or from device_overrides when none is passed.
//
// Errors are INVALID_ARGUMENT and start with the field path, e.g.
//   inter_node.bandwidth_gbit_per_s: expected a number, got "fast"
//   racks.nodes_per_rak: unknown field (did you mean "nodes_per_rack"?)
// Problems with the document as a whole start with "topology: ".
// Thread-safe; no state between calls.
#ifndef LOOM_CONTROLLER_PLANNER_TOPOLOGY_YAML_H_
#define LOOM_CONTROLLER_PLANNER_TOPOLOGY_YAML_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "controller/planner/topology.h"

namespace loom::planner {

// Parses and validates (ValidateTopology) one YAML document. `local_cpu`
// may be null; it is used only when device is "cpu".
absl::StatusOr<ClusterTopology> ParseTopologyYaml(
    absl::string_view text, const LocalCpuMeasurement* local_cpu = nullptr);

// Reads `path` and parses it. NOT_FOUND / PERMISSION_DENIED from the read;
// parse errors as above (the message does not name the file).
absl::StatusOr<ClusterTopology> LoadTopologyFile(
    const std::string& path, const LocalCpuMeasurement* local_cpu = nullptr);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_TOPOLOGY_YAML_H_
