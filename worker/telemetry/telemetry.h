// Per-rank training telemetry: model FLOPs and MFU, memory, power
// and energy. Plain C++ with no LibTorch or gRPC; the GEMM calibration that
// gives a CPU's peak lives in gemm_calibration.cc (LibTorch), and NVML is
// loaded at run time by nvml.h.
#ifndef LOOM_WORKER_TELEMETRY_TELEMETRY_H_
#define LOOM_WORKER_TELEMETRY_TELEMETRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/model_shape.h"

namespace loom::telemetry {

// The model's shape: the one description the planner and the engine share
// (common/model_shape.h).
using ::loom::ModelShape;

// Parameters that take part in matrix multiplies per token: the blocks'
// weight matrices (GPT-2: 12·L·d², QKV 3d², projection d², MLP 8d²; fewer
// K/V columns with grouped-query attention, 3·d·f for a gated MLP) plus the
// LM head V·d. Embedding lookups, norms and biases are not matmuls.
int64_t MatmulParameters(const ModelShape& m);

// Model FLOPs per token, forward + backward, no recompute:
// 6·N_matmul (Kaplan et al. 2020, C ≈ 6N per token) plus attention's
// 12·L·s·d (QKᵀ and AV, 2·2·s·d per layer forward, ×3 with backward),
// as PaLM's MFU definition (Chowdhery et al. 2022, Appendix B):
// common/model_shape.h's ModelFlopsPerToken.
using ::loom::ModelFlopsPerToken;

// Training state bytes of one replica (fp32 AdamW): parameters 4 B,
// gradients 4 B, two moments 8 B per parameter.
struct StateBytes {
  uint64_t parameters = 0, gradients = 0, optimizer = 0;
};
StateBytes Fp32AdamWStateBytes(int64_t parameters);

// This process's resident set and its peak (VmRSS / VmHWM), in bytes; 0 if
// /proc is unavailable.
struct Rss {
  uint64_t current = 0, peak = 0;
};
Rss ReadRss();

// Memory available to this process's host or container, in bytes: the
// smallest of MemTotal (/proc/meminfo) and the cgroup limit (v2
// memory.max, or v1 memory.limit_in_bytes) found under `sysfs_cgroup`
// (default /sys/fs/cgroup); "max" or an absurdly large v1 value means no
// cgroup limit. 0 if nothing can be read.
uint64_t ReadMemoryLimitBytes(const std::string& proc_meminfo = "/proc/meminfo",
                              const std::string& sysfs_cgroup = "/sys/fs/cgroup");

// How long ago this process started (the fork that made it, /proc/self/stat's
// start time, against /proc/uptime): a rank's start-up, counted from its
// worker's fork, including loading its libraries. Clock-tick resolution
// (10 ms); -1 if /proc cannot say.
double SecondsSinceProcessStart();

class Nvml;

// Where a PowerMeter reads from. Every field has a working default; tests
// point them at fakes.
struct PowerMeterOptions {
  // Cores this rank keeps busy, and cores on the host (values < 1 count as 1).
  int threads = 1;
  int cores = 1;
  // NVML index of the GPU this rank trains on; -1 for a CPU rank (NVML is
  // then not even loaded).
  int gpu_index = -1;
  // Given to Nvml::Open: "" means $LOOM_NVML_LIBRARY, else libnvidia-ml.so.1.
  std::string nvml_library;
  // Intel RAPL package-0 energy counter, microjoules.
  std::string rapl_energy_uj = "/sys/class/powercap/intel-rapl:0/energy_uj";
  // CPU seconds used so far by all threads of this process, for the model's
  // utilisation. Empty: clock_gettime(CLOCK_PROCESS_CPUTIME_ID).
  std::function<double()> process_cpu_seconds;
};

// Power and energy of one rank, from the best source it can read, in this
// order (source() names the one in use):
//
//  "nvml"   GPU rank (gpu_index >= 0) and NVML answers for that GPU. Energy
//           is the delta of the board's total-energy counter
//           (nvmlDeviceGetTotalEnergyConsumption, Volta and newer) between
//           Account calls; watts = that energy / seconds. On an older board
//           that has a power sensor but no counter, energy is
//           nvmlDeviceGetPowerUsage · seconds and fallback_reason() says so.
//           The GPU board only: the host's CPU, DRAM, NICs and fans are left
//           out, not estimated.
//  "rapl"   /sys/class/powercap/intel-rapl:0/energy_uj readable (it is
//           root-only on Linux >= 5.10 unless an administrator opens it).
//           The package is shared by every process on it: the rank's share
//           is the package energy delta · threads/cores. Package 0 only; DRAM
//           and other sockets are not counted.
//  "model"  neither. The rank's `threads` cores are modelled as
//               P = idle + u·(TDP − idle)                      [W]
//           idle = threads · kModelIdleWattsPerCore            [W]
//           TDP  = threads · kModelTdpWattsPerCore             [W]
//           u    = Δ process CPU seconds / (seconds · threads), clamped to [0, 1]
//           (u = 1: every core busy for the whole interval, P = TDP; a rank
//           blocked on data or all-reduce has u < 1). Energy = P · seconds.
//           A modelled figure, not a measurement: the label says so.
//
// Not thread-safe: one thread calls Account (the rank's step callback).
class PowerMeter {
 public:
  // Round per-core figures, not measured: between a server core at TDP
  // (about 4-8 W: e.g. 280 W / 64 cores, 205 W / 28 cores) and a desktop
  // core (10-20 W); idle about a fifth of TDP.
  static constexpr double kModelIdleWattsPerCore = 2.0;
  static constexpr double kModelTdpWattsPerCore = 10.0;

  // The model's power in watts of `threads` cores at utilisation `u` (0..1):
  // threads · (kModelIdleWattsPerCore + u · (kModelTdpWattsPerCore −
  // kModelIdleWattsPerCore)).
  static double ModelWatts(int threads, double u);

  // `threads`: cores this rank keeps busy; `cores`: cores on the host;
  // `gpu_index`: NVML index of the rank's GPU, -1 for a CPU rank.
  PowerMeter(int threads, int cores, int gpu_index = -1);
  explicit PowerMeter(PowerMeterOptions options);
  ~PowerMeter();
  PowerMeter(const PowerMeter&) = delete;
  PowerMeter& operator=(const PowerMeter&) = delete;

  // Accounts `seconds` of wall time since the previous Account call (or
  // construction); returns the rank's average watts over them and adds
  // their energy. seconds <= 0 accounts nothing and returns 0. A counter
  // that went backwards (wrap, driver reload) or a failed reading counts
  // 0 J for that interval.
  double Account(double seconds);
  // Joules accounted since construction.
  double energy_joules() const { return energy_joules_; }
  // "nvml", "rapl" or "model": the value of the metrics' `source` label.
  const std::string& source() const { return source_; }
  // Why a better source than source() is not in use, for logs; "" when the
  // best one for this rank is. E.g. "nvml: nvmlDeviceGetTotalEnergyConsumption:
  // Not Supported on device 0 (pre-Volta GPU); rapl: ... not readable".
  const std::string& fallback_reason() const { return fallback_reason_; }

 private:
  PowerMeterOptions options_;
  int threads_, cores_;
  std::string source_;
  std::string fallback_reason_;
  double energy_joules_ = 0;
  // nvml: the library, and whether the energy counter works (else power).
  std::unique_ptr<Nvml> nvml_;
  bool nvml_counter_ = false;
  uint64_t last_nvml_mj_ = 0;
  int64_t last_rapl_uj_ = -1;
  double last_cpu_seconds_ = 0;
};

}  // namespace loom::telemetry

#endif  // LOOM_WORKER_TELEMETRY_TELEMETRY_H_
