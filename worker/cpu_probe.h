// What a worker tells the controller about its CPU at registration, for the
// parallelism planner: one thread's fp32 GEMM rate and copy
// bandwidth. Measured in the daemon (which does not link LibTorch) by calling
// sgemm_ of whatever libblas.so.3 resolves to -- the same library LibTorch's
// CPU matmuls call on Debian -- with the BLAS limited to one thread.
// Takes well under a second (time-boxed); thread-compatible, not thread-safe
// (it changes the BLAS's thread count while it runs).
#ifndef LOOM_WORKER_CPU_PROBE_H_
#define LOOM_WORKER_CPU_PROBE_H_

#include <string>

#include "absl/status/statusor.h"

namespace loom::worker {

struct CpuProbe {
  double gemm_flops_per_second_per_thread = 0;  // 0 = not measured
  double memory_bandwidth_bytes_per_second = 0; // one thread's memcpy rate
  std::string gemm_source;  // e.g. "sgemm 384^3, 1 thread, openblas"; or why not measured
  // Threads the BLAS ran the measured GEMM on, as its OpenMP runtime (or
  // OpenBLAS) reported them during the measurement; 0 = unknown.
  int gemm_threads = 0;
  double seconds = 0;       // how long the probe took
};

// Best of a few n x n x n sgemms (2 n^3 FLOPs each) after one warm-up,
// stopping after about `budget_seconds`.
CpuProbe ProbeCpu(double budget_seconds = 0.5);

// What a transformer block costs a one-thread rank beyond its FLOPs, as
// `<rank_binary> --probe` measures it (worker/engine/block_probe.h): run
// once at start-up, with OMP_NUM_THREADS=1 as a threads_per_rank-1 rank.
struct BlockProbe {
  double fixed_seconds = 0;           // per block, forward + backward, one micro-batch
  double seconds_per_activation = 0;  // per element of [tokens, d_model]
  // A 2-rank loopback Gloo all-reduce: latency per ring step and bandwidth;
  // 0 = not measured.
  double allreduce_latency_seconds = 0;
  double allreduce_bytes_per_second = 0;
  // Per tensor-parallel collective, beyond its ring time (block_probe.h);
  // 0 = not measured.
  double tensor_collective_extra_seconds = 0;
  // Of those collectives' time, the fraction off the CPU (block_probe.h);
  // 0 = not measured.
  double tensor_collective_idle_fraction = 0;
  // One thread's slowdown while every core computes (block_probe.h); 0 =
  // not measured.
  double concurrent_slowdown = 0;
  std::string line;                   // what the probe printed
};
// INTERNAL when the binary cannot run or prints something else.
absl::StatusOr<BlockProbe> ProbeBlocks(const std::string& rank_binary);

// The probes above measure what one rank gets from a core, so they must not
// overlap another worker's probes on the same host (a local cluster starts
// its workers at once: two 2-core workers probing together measured 2x the
// per-element block cost and 5x the all-reduce latency). Holding this, a
// worker is the only one of its host probing: flock(2) on `path` (by
// default <temp dir>/loom-probe.lock, shared by the host's workers unless
// they run in separate containers, where each has its own cores anyway).
// Waits up to `wait_seconds`, then gives up and says so in `note` (the
// probe runs anyway: a rough figure beats none); the same if the file
// cannot be opened.
class HostProbeLock {
 public:
  static std::string DefaultPath();
  HostProbeLock(const std::string& path, double wait_seconds);
  ~HostProbeLock();
  HostProbeLock(const HostProbeLock&) = delete;
  HostProbeLock& operator=(const HostProbeLock&) = delete;

  bool held() const { return held_; }
  double waited_seconds() const { return waited_seconds_; }
  const std::string& note() const { return note_; }

 private:
  int fd_ = -1;
  bool held_ = false;
  double waited_seconds_ = 0;
  std::string note_;
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_CPU_PROBE_H_
