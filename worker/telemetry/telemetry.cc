#include "worker/telemetry/telemetry.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/telemetry/nvml.h"

namespace loom::telemetry {
namespace {

int64_t ReadRaplMicrojoules(const std::string& path) {
  std::ifstream in(path);
  int64_t v = -1;
  if (in >> v) return v;
  return -1;
}

double ProcessCpuSeconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

uint64_t StatusKb(const std::string& text, const std::string& key) {
  auto pos = text.find(key + ":");
  if (pos == std::string::npos) return 0;
  std::istringstream ss(text.substr(pos + key.size() + 1));
  uint64_t kb = 0;
  ss >> kb;
  return kb * 1024;
}

}  // namespace

int64_t MatmulParameters(const ModelShape& m) {
  return m.n_layer * ::loom::CountParameters(m).per_layer_matmul + m.vocab_size * m.d_model;
}

StateBytes Fp32AdamWStateBytes(int64_t parameters) {
  StateBytes b;
  b.parameters = 4 * static_cast<uint64_t>(parameters);
  b.gradients = 4 * static_cast<uint64_t>(parameters);
  b.optimizer = 8 * static_cast<uint64_t>(parameters);
  return b;
}

Rss ReadRss() {
  std::ifstream in("/proc/self/status");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  Rss r;
  r.current = StatusKb(text, "VmRSS");
  r.peak = StatusKb(text, "VmHWM");
  return r;
}

double SecondsSinceProcessStart() {
  std::string stat;
  {
    std::ifstream in("/proc/self/stat");
    std::getline(in, stat);
  }
  std::string uptime;
  {
    std::ifstream in("/proc/uptime");
    std::getline(in, uptime);
  }
  // The command name (field 2) may hold spaces: count fields after its ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  // Fields 3 (state) to 22 (starttime, in clock ticks since boot).
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return -1;
  }
  double started_ticks = 0, up = 0;
  try {
    started_ticks = std::stod(field);
    up = std::stod(uptime);
  } catch (const std::exception&) {
    return -1;
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  if (ticks <= 0) return -1;
  return std::max(0.0, up - started_ticks / static_cast<double>(ticks));
}

uint64_t ReadMemoryLimitBytes(const std::string& proc_meminfo,
                              const std::string& sysfs_cgroup) {
  uint64_t limit = 0;
  {
    std::ifstream in(proc_meminfo);
    std::stringstream ss;
    ss << in.rdbuf();
    limit = StatusKb(ss.str(), "MemTotal");
  }
  for (const char* file : {"/memory.max", "/memory/memory.limit_in_bytes"}) {
    std::ifstream in(sysfs_cgroup + file);
    std::string value;
    if (!(in >> value) || value == "max") continue;
    char* end = nullptr;
    const unsigned long long bytes = std::strtoull(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != '\0') continue;
    // cgroup v1 reports "no limit" as a page-rounded LLONG_MAX.
    if (bytes == 0 || bytes >= (uint64_t{1} << 62)) continue;
    if (limit == 0 || bytes < limit) limit = bytes;
  }
  return limit;
}

double PowerMeter::ModelWatts(int threads, double u) {
  u = std::clamp(u, 0.0, 1.0);
  const double idle = threads * kModelIdleWattsPerCore;
  const double tdp = threads * kModelTdpWattsPerCore;
  return idle + u * (tdp - idle);
}

PowerMeter::PowerMeter(int threads, int cores, int gpu_index)
    : PowerMeter([&] {
        PowerMeterOptions o;
        o.threads = threads;
        o.cores = cores;
        o.gpu_index = gpu_index;
        return o;
      }()) {}

PowerMeter::PowerMeter(PowerMeterOptions options)
    : options_(std::move(options)),
      threads_(std::max(1, options_.threads)),
      cores_(std::max(1, options_.cores)) {
  if (!options_.process_cpu_seconds) options_.process_cpu_seconds = ProcessCpuSeconds;
  std::string why_not_nvml;
  if (options_.gpu_index >= 0) {
    absl::StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Open(options_.nvml_library);
    if (!nvml.ok()) {
      why_not_nvml = std::string(nvml.status().message());
    } else {
      absl::StatusOr<uint64_t> mj = (*nvml)->TotalEnergyMillijoules(options_.gpu_index);
      if (mj.ok()) {
        nvml_counter_ = true;
        last_nvml_mj_ = *mj;
        nvml_ = std::move(*nvml);
      } else if ((*nvml)->PowerMilliwatts(options_.gpu_index).ok()) {
        // No counter, but a power sensor: integrate it, still an NVML reading.
        fallback_reason_ = absl::StrCat("nvml: ", mj.status().message(),
                                        "; integrating nvmlDeviceGetPowerUsage instead");
        nvml_ = std::move(*nvml);
      } else {
        why_not_nvml = std::string(mj.status().message());
      }
    }
    if (nvml_ != nullptr) {
      source_ = "nvml";
      return;
    }
  }
  last_rapl_uj_ = ReadRaplMicrojoules(options_.rapl_energy_uj);
  if (last_rapl_uj_ >= 0) {
    source_ = "rapl";
    if (!why_not_nvml.empty()) fallback_reason_ = absl::StrCat("nvml: ", why_not_nvml);
    return;
  }
  source_ = "model";
  last_cpu_seconds_ = options_.process_cpu_seconds();
  fallback_reason_ = absl::StrCat(
      why_not_nvml.empty() ? "" : absl::StrCat("nvml: ", why_not_nvml, "; "), "rapl: ",
      options_.rapl_energy_uj, " not readable (absent, or root-only since Linux 5.10)");
}

PowerMeter::~PowerMeter() = default;

double PowerMeter::Account(double seconds) {
  if (seconds <= 0) return 0;
  double joules = 0;
  if (nvml_ != nullptr && nvml_counter_) {
    absl::StatusOr<uint64_t> mj = nvml_->TotalEnergyMillijoules(options_.gpu_index);
    if (mj.ok()) {
      // The counter restarts when the driver reloads: skip that interval.
      if (*mj >= last_nvml_mj_) joules = static_cast<double>(*mj - last_nvml_mj_) / 1e3;
      last_nvml_mj_ = *mj;
    }
  } else if (nvml_ != nullptr) {
    absl::StatusOr<uint32_t> mw = nvml_->PowerMilliwatts(options_.gpu_index);
    if (mw.ok()) joules = static_cast<double>(*mw) / 1e3 * seconds;
  } else if (last_rapl_uj_ >= 0) {
    const int64_t now = ReadRaplMicrojoules(options_.rapl_energy_uj);
    // The counter wraps; a negative delta means it did: skip that interval.
    const double package = now >= last_rapl_uj_ ? (now - last_rapl_uj_) / 1e6 : 0;
    if (now >= 0) last_rapl_uj_ = now;
    joules = package * threads_ / cores_;
  } else {
    const double cpu = options_.process_cpu_seconds();
    const double u = (cpu - last_cpu_seconds_) / (seconds * threads_);
    last_cpu_seconds_ = cpu;
    joules = ModelWatts(threads_, u) * seconds;
  }
  energy_joules_ += joules;
  return joules / seconds;
}

}  // namespace loom::telemetry
