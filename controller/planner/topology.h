// The hardware the planner plans for: a device catalog and the cluster
// topology (nodes x devices, links, optional racks, power and price).
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
#include "controller/planner/model.h"

namespace loom::planner {

// Fraction of peak a GEMM achieves as a function of its size. A Loom
// heuristic, not a paper formula: cuBLAS GEMMs saturate at ~75-85% of dense
// peak on A100/H100 once every dimension is in the thousands, and lose
// throughput roughly hyperbolically as a dimension shrinks (tiles go
// unfilled, launch and memory time stop being hidden). We model
//   eta(d, n) = max_fraction x d / (d + half_width) x n / (n + half_tokens)
// where d is the per-device hidden width (d_model / tp: tensor parallelism
// shrinks the GEMMs' inner dimension) and n the tokens in one micro-batch
// (micro_batch x seq_len). At d = half_width the first factor is 1/2.
// Calibrate per device by timing GEMMs. The defaults (A100, V100) put the
// four Megatron-LM layouts of Narayanan et al. 2021, Table 1 (full
// recompute, micro-batch 1) at 46/51/52/53% of peak in hardware FLOPs,
// against the 43/47/52/52% measured there.
struct GemmEfficiency {
  double max_fraction = 0.75;
  double half_width = 192;     // columns
  double half_tokens = 128;   // tokens
  double At(double hidden_per_device, double tokens) const;
};

struct DeviceSpec {
  std::string name;
  int64_t memory_bytes = 0;
  // Dense peak FLOP/s per matmul precision (no sparsity); 0 = unsupported.
  double peak_flops_fp32 = 0;
  double peak_flops_tf32 = 0;
  double peak_flops_bf16 = 0;
  double peak_flops_fp16 = 0;
  double peak_flops_fp8 = 0;
  double hbm_bandwidth_bytes_per_second = 0;
  // Device-to-device bandwidth inside a node (NVLink/NVSwitch or PCIe), per
  // device per direction, used when the topology does not override it.
  double intra_node_bandwidth_bytes_per_second = 0;
  double power_watts = 0;  // board power (TDP) used for energy estimates
  GemmEfficiency efficiency;

  // Peak for `precision`, or 0 when the device lacks it.
  double PeakFlops(Precision precision) const;
};

// Catalog of known devices: V100 (SXM2 32 GB), A100-40GB, A100-80GB,
// H100-SXM, H200 (SXM). Names match case-insensitively, ignoring '-', '_'
// and spaces; short aliases such as "a100-80" and "h100" are accepted, and
// so are the names as people write them, with vendor, SXM form factor and
// memory type words ("H100-80GB", "H100 SXM5 80GB", "A100-SXM4-80GB",
// "NVIDIA A100 80GB"). A PCIe part is not its SXM sibling and stays unknown.
// Returns NOT_FOUND listing the known names otherwise. "cpu" is not in the
// catalog: it has no fixed peak, see LocalCpuDevice().
absl::StatusOr<DeviceSpec> LookupDevice(absl::string_view name);
std::vector<std::string> CatalogDeviceNames();

// The catalog device an NVIDIA product name is, as NVML and nvidia-smi
// report it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla
// V100-SXM2-32GB"): by model family (H200; H100 in any form factor gets the
// SXM figures; A100 with 80GB in the name is the 80 GB one, else 40 GB;
// V100), case-insensitively. NOT_FOUND for anything else.
absl::StatusOr<DeviceSpec> LookupDeviceByProductName(absl::string_view product);

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
