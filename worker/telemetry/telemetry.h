// Per-rank training telemetry (issue 6): model FLOPs and MFU, memory, power
// and energy. Plain C++ with no LibTorch or gRPC; the GEMM calibration that
// gives a CPU's peak lives in gemm_calibration.cc (LibTorch).
#ifndef LOOM_WORKER_TELEMETRY_TELEMETRY_H_
#define LOOM_WORKER_TELEMETRY_TELEMETRY_H_

#include <cstdint>
#include <string>

namespace loom::telemetry {

struct GptShape {
  int64_t n_layer = 0, d_model = 0, seq_len = 0, vocab_size = 0;
};

// Parameters that take part in matrix multiplies per token: 12·L·d² for the
// blocks (QKV 3d², projection d², MLP 8d²) plus the tied LM head V·d.
// Embedding lookups, LayerNorms and biases are not matmuls.
int64_t MatmulParameters(const GptShape& m);

// Model FLOPs per token, forward + backward, no recompute:
// 6·N_matmul (Kaplan et al. 2020, C ≈ 6N per token) plus attention's
// 12·L·s·d (QKᵀ and AV, 2·2·s·d per layer forward, ×3 with backward),
// as PaLM's MFU definition (Chowdhery et al. 2022, Appendix B).
double ModelFlopsPerToken(const GptShape& m);

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

// Power of this rank. Reads Intel RAPL package energy when
// /sys/class/powercap/intel-rapl:0/energy_uj exists (the package is shared
// by every process on it: the rank's share is its fraction of busy cores);
// otherwise a documented model: idle + busy_fraction·(TDP − idle) per core,
// with kModelIdleWattsPerCore and kModelBusyWattsPerCore.
class PowerMeter {
 public:
  static constexpr double kModelIdleWattsPerCore = 2.0;
  static constexpr double kModelBusyWattsPerCore = 10.0;

  // `threads`: cores this rank keeps busy; `cores`: cores on the host.
  PowerMeter(int threads, int cores);
  // Accounts `seconds` of training; returns the rank's average watts over
  // them and adds the energy.
  double Account(double seconds);
  double energy_joules() const { return energy_joules_; }
  const std::string& source() const { return source_; }

 private:
  int threads_, cores_;
  std::string source_;
  double energy_joules_ = 0;
  int64_t last_rapl_uj_ = -1;
};

}  // namespace loom::telemetry

#endif  // LOOM_WORKER_TELEMETRY_TELEMETRY_H_
