#include "worker/telemetry/telemetry.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace loom::telemetry {
namespace {

constexpr const char* kRaplEnergy = "/sys/class/powercap/intel-rapl:0/energy_uj";

int64_t ReadRaplMicrojoules() {
  std::ifstream in(kRaplEnergy);
  int64_t v = -1;
  if (in >> v) return v;
  return -1;
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

int64_t MatmulParameters(const GptShape& m) {
  return 12 * m.n_layer * m.d_model * m.d_model + m.vocab_size * m.d_model;
}

double ModelFlopsPerToken(const GptShape& m) {
  return 6.0 * static_cast<double>(MatmulParameters(m)) +
         12.0 * static_cast<double>(m.n_layer) * m.seq_len * m.d_model;
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

PowerMeter::PowerMeter(int threads, int cores)
    : threads_(threads < 1 ? 1 : threads), cores_(cores < 1 ? 1 : cores) {
  last_rapl_uj_ = ReadRaplMicrojoules();
  source_ = last_rapl_uj_ >= 0 ? "rapl" : "model";
}

double PowerMeter::Account(double seconds) {
  if (seconds <= 0) return 0;
  double joules;
  if (last_rapl_uj_ >= 0) {
    int64_t now = ReadRaplMicrojoules();
    // The counter wraps; a negative delta means it did: skip that interval.
    double package = now >= last_rapl_uj_ ? (now - last_rapl_uj_) / 1e6 : 0;
    last_rapl_uj_ = now;
    joules = package * threads_ / cores_;
  } else {
    joules = threads_ * kModelBusyWattsPerCore * seconds;
  }
  energy_joules_ += joules;
  return joules / seconds;
}

}  // namespace loom::telemetry
