// The host's probe results (ProbeCpu and ProbeBlocks, cpu_probe.h), kept in a
// file beside the host probe lock, so that a worker started again on the
// same host reuses them instead of probing:
//   - the probes take about 6 s (the block probe starts LibTorch twice and
//     runs a 2-rank all-reduce), and a host's workers probe one at a time,
//     so a local cluster of 7 workers took 40 s to start, and a worker that
//     came back after a drain or a crash took 10-20 s on a busy host;
//   - a worker started beside ranks that already train measures its
//     neighbours, not the host: 25 instead of 115 GFLOP/s, a block 20x
//     dearer, and the planner then plans on those figures.
// A cached result is used only while it is fresh (`max_age`) and was
// measured under the same key: the rank binary (path, size, modification
// time), OPENBLAS_CORETYPE, the CPU model, the CPUs this process may run on
// and the host name (ProbeCacheKey). Read and written under HostProbeLock;
// a file another user owns is ignored (a planner's inputs are not taken from
// whoever can write to the temp directory).
#ifndef LOOM_WORKER_PROBE_CACHE_H_
#define LOOM_WORKER_PROBE_CACHE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/cpu_probe.h"

namespace loom::worker {

struct HostProbes {
  CpuProbe cpu;
  BlockProbe blocks;
  absl::Time measured;  // when the probes ran
  int pid = 0;          // the worker that ran them
};

// <temp dir>/loom-probe.cache, beside HostProbeLock::DefaultPath().
std::string DefaultProbeCachePath();

// What a cached result must have been measured under to be reused by a
// worker of `rank_binary` (one line, no newline).
std::string ProbeCacheKey(const std::string& rank_binary);

// The cached result at `path` if it was measured under `key` at most
// `max_age` before `now`; nullopt if there is none, it is stale or for
// another key, it cannot be parsed, or another user owns the file.
std::optional<HostProbes> ReadProbeCache(const std::string& path, const std::string& key,
                                         absl::Duration max_age, absl::Time now);

// Replaces the file at `path` (atomically, mode 0600) with `probes` under
// `key`.
absl::Status WriteProbeCache(const std::string& path, const std::string& key,
                             const HostProbes& probes);

}  // namespace loom::worker

#endif  // LOOM_WORKER_PROBE_CACHE_H_
