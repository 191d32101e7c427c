#include "worker/cpu_probe.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "worker/blas_info.h"

namespace loom::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Fortran BLAS sgemm; gfortran passes the two CHARACTER lengths last.
using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*,
                         const float*, const float*, const int*, const float*, const int*,
                         const float*, float*, const int*, size_t, size_t);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();

}  // namespace

CpuProbe ProbeCpu(double budget_seconds) {
  CpuProbe probe;
  auto start = Clock::now();

  // Copy bandwidth: 32 MiB (beyond the caches), read + write per copy.
  {
    constexpr size_t kBytes = 32u << 20;
    std::vector<char> a(kBytes, 1), b(kBytes, 0);
    std::memcpy(b.data(), a.data(), kBytes);  // fault the pages in
    double best = 0;
    for (int i = 0; i < 3; ++i) {
      auto t0 = Clock::now();
      std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), kBytes);
      double s = Since(t0);
      if (s > 0) best = std::max(best, 2.0 * kBytes / s);
    }
    probe.memory_bandwidth_bytes_per_second = best;
  }

  BlasInfo info = DetectBlas();
  void* handle = dlopen("libblas.so.3", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    probe.gemm_source = "not measured: libblas.so.3 not found";
    probe.seconds = Since(start);
    return probe;
  }
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "sgemm_"));
  if (sgemm == nullptr) {
    probe.gemm_source = "not measured: libblas.so.3 has no sgemm_";
    dlclose(handle);
    probe.seconds = Since(start);
    return probe;
  }
  // One thread, as a rank with threads_per_rank 1 runs; restored after.
  // OpenBLAS's OpenMP build sizes its parallel regions by the calling
  // thread's OpenMP thread count, which openblas_set_num_threads alone does
  // not lower (measured: 263 GFLOP/s "per thread" with 2 cores, 139 with
  // OMP_NUM_THREADS=1), so the OpenMP runtime BLAS brought in is told too.
  auto set_threads = reinterpret_cast<SetThreadsFn>(dlsym(handle, "openblas_set_num_threads"));
  auto get_threads = reinterpret_cast<GetThreadsFn>(dlsym(handle, "openblas_get_num_threads"));
  auto omp_set_threads = reinterpret_cast<SetThreadsFn>(dlsym(handle, "omp_set_num_threads"));
  auto omp_get_threads = reinterpret_cast<GetThreadsFn>(dlsym(handle, "omp_get_max_threads"));
  int old_threads = get_threads != nullptr ? get_threads() : 0;
  const int old_omp_threads = omp_get_threads != nullptr ? omp_get_threads() : 0;
  if (set_threads != nullptr) set_threads(1);
  if (omp_set_threads != nullptr) omp_set_threads(1);
  probe.gemm_threads = omp_get_threads != nullptr ? omp_get_threads()
                       : get_threads != nullptr   ? get_threads()
                                                  : 0;

  // n = 384: ~113 MFLOP per call, a few ms with an optimised BLAS and
  // ~0.1 s with the reference one, so the budget holds either way.
  const int n = 384;
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f;
    b[i] = static_cast<float>((i * 104729) % 1000) / 1000.0f;
  }
  const float alpha = 1, beta = 0;
  auto call = [&] {
    sgemm("N", "N", &n, &n, &n, &alpha, a.data(), &n, b.data(), &n, &beta, c.data(), &n, 1, 1);
  };
  call();  // warm-up
  double best = 0;
  int runs = 0;
  for (; runs < 8 && (runs < 2 || Since(start) < budget_seconds); ++runs) {
    auto t0 = Clock::now();
    call();
    double s = Since(t0);
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  if (omp_set_threads != nullptr && old_omp_threads > 0) omp_set_threads(old_omp_threads);
  if (set_threads != nullptr && old_threads > 0) set_threads(old_threads);
  // Not dlclose()d: the BLAS has started its (OpenMP) threads and keeps
  // per-thread buffers; unloading the code they belong to is not safe, and
  // the process (which links the same libblas.so.3 through LibTorch) keeps
  // it loaded anyway.
  probe.gemm_flops_per_second_per_thread = best;
  probe.gemm_source = absl::StrCat(
      "sgemm ", n, "^3 best of ", runs, ", ",
      probe.gemm_threads > 0 ? absl::StrCat(probe.gemm_threads, " thread(s)")
                             : std::string("BLAS default threads"),
      ", ", info.vendor);
  probe.seconds = Since(start);
  return probe;
}

absl::StatusOr<BlockProbe> ProbeBlocks(const std::string& rank_binary) {
  const std::string command = absl::StrCat("OMP_NUM_THREADS=1 '", rank_binary, "' --probe");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string out;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  const int status = pclose(pipe);
  BlockProbe probe;
  probe.line = std::string(absl::StripAsciiWhitespace(out));
  bool have_fixed = false, have_activation = false;
  for (absl::string_view field : absl::StrSplit(probe.line, ' ', absl::SkipEmpty())) {
    const std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
    double value = 0;
    if (!absl::SimpleAtod(kv.second, &value) || !(value >= 0) || !std::isfinite(value)) continue;
    if (kv.first == "block_fixed_seconds") {
      probe.fixed_seconds = value;
      have_fixed = true;
    } else if (kv.first == "block_seconds_per_activation") {
      probe.seconds_per_activation = value;
      have_activation = true;
    } else if (kv.first == "allreduce_latency_seconds") {
      probe.allreduce_latency_seconds = value;
    } else if (kv.first == "allreduce_bytes_per_second") {
      probe.allreduce_bytes_per_second = value;
    } else if (kv.first == "tensor_collective_extra_seconds") {
      probe.tensor_collective_extra_seconds = value;
    } else if (kv.first == "tensor_collective_idle_fraction" && value <= 1) {
      probe.tensor_collective_idle_fraction = value;
    } else if (kv.first == "concurrent_slowdown" && value >= 1) {
      probe.concurrent_slowdown = value;
    }
  }
  if (status != 0 || !have_fixed || !have_activation) {
    return absl::InternalError(absl::StrCat(command, " exited with status ", status,
                                            " and printed \"", probe.line, "\""));
  }
  return probe;
}

std::string HostProbeLock::DefaultPath() {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  return (dir / "loom-probe.lock").string();
}

HostProbeLock::HostProbeLock(const std::string& path, double wait_seconds) {
  // 0666 (less the umask): workers of other users on the host share it.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    note_ = absl::StrCat("probing without the host's probe lock: open ", path, ": ",
                         std::strerror(errno));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      held_ = true;
      break;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      note_ = absl::StrCat("probing without the host's probe lock: flock ", path, ": ",
                           std::strerror(errno));
      break;
    }
    waited_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited_seconds_ >= wait_seconds) {
      note_ = absl::StrCat("probing without the host's probe lock: another worker held ", path,
                           " for ", wait_seconds, " s, so the figures may be low");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

HostProbeLock::~HostProbeLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace loom::worker
