// The accelerators Loom knows: datasheet peaks per matmul precision,
// memory, bandwidths, power, and how GEMM efficiency grows with size. The
// controller's planner plans for them; a GPU rank takes its MFU peak from
// them (by the product name NVML reports). Shared facts, so they live here
// and neither the worker nor the controller depends on the other.
//
// Units: bytes, bytes/second, FLOP/s, watts. Memory sizes are decimal
// (1 GB = 1e9 bytes) and quote the vendor's marketed size. Link bandwidths
// are per device and per direction.
//
// Pure functions and plain data; thread-safe.
#ifndef LOOM_COMMON_DEVICE_CATALOG_H_
#define LOOM_COMMON_DEVICE_CATALOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// The precision of a matrix product (the catalog's peaks are per precision).
enum class MatmulPrecision { kFp32, kTf32, kBf16, kFp16, kFp8 };

absl::string_view PrecisionName(MatmulPrecision precision);  // "fp32", "bf16", ...

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
  // What one transformer layer's forward + backward on one micro-batch
  // costs beyond its FLOPs at the GEMM rate: fixed seconds (dispatch,
  // autograd, launches) and seconds per element of its [tokens, d_model]
  // activation (normalisation, activation functions, softmax, residuals).
  // Measured for CPU ranks (worker/engine/block_probe.h); 0 for the
  // catalog's GPUs, where GemmEfficiency stands for all of it.
  double layer_fixed_seconds = 0;
  double layer_seconds_per_activation = 0;
  // The rank's host buffers live in the same memory as its model (a CPU
  // "device"): the planner counts them against memory_bytes.
  bool host_memory_is_device_memory = false;
  // Collectives run on the cores the rank computes on (Gloo's threads on a
  // CPU rank), so overlapping them with backward hides nothing: on this
  // project's 2-core machine bench/overlap_bench.cc measured exposed
  // communication fall from 123 to 54 ms with overlap and the step not get
  // faster (ratio 0.98). The planner then credits no overlap.
  bool collectives_share_compute_cores = false;
  // Rank threads per core on the rank's host, >= 1: above 1 the ranks
  // time-share the cores (CPU ranks of several workers on one machine), and
  // a step takes at least this many ranks' compute and optimizer work per
  // core. The other rates above are those of a core to itself.
  double ranks_per_core = 1;
  // On that host, the cores its ranks share, in rank-thread units (the
  // ranks are ranks_per_core x this many); and the fraction of a
  // collective's time a rank spends off the CPU, waiting on its peers (so
  // that ranks time-sharing the cores run each other meanwhile; measured,
  // worker/engine/block_probe.h; 0 = all of it holds a core).
  int shared_host_cores = 1;
  double collective_idle_fraction = 0;
  GemmEfficiency efficiency;

  // Peak for `precision`, or 0 when the device lacks it.
  double PeakFlops(MatmulPrecision precision) const;
};

// Catalog of known devices: V100 (SXM2 32 GB), A100-40GB, A100-80GB,
// H100-SXM, H200 (SXM), and the PCIe and NVL boards, whose peaks, power or
// links differ from the SXM parts': A100-PCIe-40GB, A100-PCIe-80GB,
// H100-PCIe, H100-NVL, H200-NVL. Names match case-insensitively, ignoring
// '-', '_' and spaces; short aliases such as "a100-80" and "h100" (the SXM
// part) are accepted, and so are the names as people write them, with
// vendor, SXM form factor and memory type words ("H100-80GB", "H100 SXM5
// 80GB", "A100-SXM4-80GB", "NVIDIA A100 80GB", "H100 PCIe").
// Returns NOT_FOUND listing the known names otherwise. "cpu" is not in the
// catalog: it has no fixed peak, see LocalCpuDevice().
absl::StatusOr<DeviceSpec> LookupDevice(absl::string_view name);
std::vector<std::string> CatalogDeviceNames();

// The catalog device an NVIDIA product name is, as NVML and nvidia-smi
// report it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla
// V100-SXM2-32GB", "NVIDIA H100 PCIe", "NVIDIA H200 NVL"),
// case-insensitively: a name with "PCIe" or "NVL" is that board's entry
// (H100-PCIe, H100-NVL, H200-NVL, A100-PCIe-*), never the SXM part's, and
// NOT_FOUND naming it when the catalog has no such board (a V100 PCIe);
// otherwise by model family (H200; H100; A100 with 80GB in the name is the
// 80 GB one, else 40 GB; V100). Grace Hopper ("GH200") and anything else:
// NOT_FOUND with the name.
absl::StatusOr<DeviceSpec> LookupDeviceByProductName(absl::string_view product);

}  // namespace loom

#endif  // LOOM_COMMON_DEVICE_CATALOG_H_
