// A CPU rank's calibrated GEMM peak (telemetry/gemm_calibration.h), kept
// per host in a file beside the worker's probe cache (probe_cache.h), so
// that a rank started again on the same host (a restart, a re-plan, a
// preemption's resume) reuses it:
//   - the calibration is about 0.8 s of every CPU rank's start, on the
//     critical path of every recovery;
//   - a rank that calibrates beside ranks that already train measures its
//     neighbours' load, a lower peak, and then overstates its MFU.
// An entry is used only while it is fresh (`max_age`) and was measured
// under the same key (the probe cache's: the rank binary, OPENBLAS_CORETYPE,
// the CPU model, the CPUs the process may run on, the host) with the same
// thread count. A file another user owns is ignored; writes replace the file
// atomically (mode 0600). Concurrent writers may lose each other's entry,
// which costs the next rank a calibration, nothing else.
#ifndef LOOM_WORKER_GEMM_PEAK_CACHE_H_
#define LOOM_WORKER_GEMM_PEAK_CACHE_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace loom::worker {

struct GemmPeak {
  double flops_per_second = 0;
  absl::Time measured;  // when the calibration ran
  int pid = 0;          // the rank that ran it
};

// <temp dir>/loom-gemm-peak.cache, beside DefaultProbeCachePath().
std::string DefaultGemmPeakCachePath();

// How long an entry stays fresh: LOOM_PROBE_MAX_AGE_SECONDS (the worker
// sets it from its --probe_max_age), else 10 minutes; 0 turns the cache off.
absl::Duration GemmPeakMaxAge();

// The entry at `path` for (`key`, `threads`) if it is at most `max_age` old
// at `now`; nullopt if there is none, it is stale, the file does not parse
// or another user owns it.
std::optional<GemmPeak> ReadGemmPeak(const std::string& path, const std::string& key, int threads,
                                     absl::Duration max_age, absl::Time now);

// Records `peak` for (`key`, `threads`) at `path`, keeping the other fresh
// entries (at most 64).
absl::Status WriteGemmPeak(const std::string& path, const std::string& key, int threads,
                           const GemmPeak& peak, absl::Duration max_age);

// A CPU rank's peak with `threads` threads: a fresh entry of this host's
// cache (DefaultGemmPeakCachePath, keyed by ProbeCacheKey of this process's
// binary, GemmPeakMaxAge), else `measure()`'s figure, then recorded for the
// next rank. `*log` says which, for the rank's log.
double GemmPeakFor(int threads, const std::function<double()>& measure, std::string* log);

}  // namespace loom::worker

#endif  // LOOM_WORKER_GEMM_PEAK_CACHE_H_
