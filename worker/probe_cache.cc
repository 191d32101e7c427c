#include "worker/probe_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/cpu_list.h"
#include "common/file_util.h"

namespace loom::worker {
namespace {

constexpr char kMagic[] = "loom-probe-cache 1";

// One line: newlines in free text (a probe's own line) become spaces.
std::string OneLine(const std::string& s) {
  return absl::StrReplaceAll(s, {{"\n", " "}, {"\r", " "}});
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown";
}

bool ParseDouble(const std::map<std::string, std::string>& f, const char* name, double* out) {
  auto it = f.find(name);
  return it != f.end() && absl::SimpleAtod(it->second, out);
}

}  // namespace

std::string DefaultProbeCachePath() {
  return std::filesystem::path(HostProbeLock::DefaultPath())
      .replace_filename("loom-probe.cache")
      .string();
}

std::string ProbeCacheKey(const std::string& rank_binary) {
  struct stat st {};
  std::string binary = absl::StrCat(rank_binary, " (missing)");
  if (stat(rank_binary.c_str(), &st) == 0) {
    binary = absl::StrCat(rank_binary, " size ", st.st_size, " mtime ", st.st_mtim.tv_sec, ".",
                          st.st_mtim.tv_nsec);
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  const char* core = getenv("OPENBLAS_CORETYPE");
  return OneLine(absl::StrCat("rank binary ", binary, "; OPENBLAS_CORETYPE ",
                              core == nullptr ? "unset" : core, "; cpu ", CpuModel(), "; cpus ",
                              FormatCpuList(AllowedCpus()), "; host ", host));
}

std::optional<HostProbes> ReadProbeCache(const std::string& path, const std::string& key,
                                         absl::Duration max_age, absl::Time now) {
  if (max_age <= absl::ZeroDuration()) return std::nullopt;
  absl::StatusOr<std::string> text = ReadOwnedFile(path, 1 << 20);
  if (!text.ok()) return std::nullopt;
  std::map<std::string, std::string> f;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    if (first) {
      if (line != kMagic) return std::nullopt;
      first = false;
      continue;
    }
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    f[kv.first] = kv.second;
  }
  if (first || f["key"] != key) return std::nullopt;
  HostProbes p;
  int64_t measured_ms = 0;
  if (!absl::SimpleAtoi(f["measured_unix_ms"], &measured_ms) ||
      !absl::SimpleAtoi(f["pid"], &p.pid) ||
      !absl::SimpleAtoi(f["gemm_threads"], &p.cpu.gemm_threads)) {
    return std::nullopt;
  }
  p.measured = absl::FromUnixMillis(measured_ms);
  if (now - p.measured > max_age || p.measured > now + absl::Minutes(1)) return std::nullopt;
  const bool parsed =
      ParseDouble(f, "gemm_flops_per_second_per_thread", &p.cpu.gemm_flops_per_second_per_thread) &&
      ParseDouble(f, "memory_bandwidth_bytes_per_second",
                  &p.cpu.memory_bandwidth_bytes_per_second) &&
      ParseDouble(f, "cpu_seconds", &p.cpu.seconds) &&
      ParseDouble(f, "block_fixed_seconds", &p.blocks.fixed_seconds) &&
      ParseDouble(f, "block_seconds_per_activation", &p.blocks.seconds_per_activation) &&
      ParseDouble(f, "allreduce_latency_seconds", &p.blocks.allreduce_latency_seconds) &&
      ParseDouble(f, "allreduce_bytes_per_second", &p.blocks.allreduce_bytes_per_second) &&
      ParseDouble(f, "tensor_collective_extra_seconds",
                  &p.blocks.tensor_collective_extra_seconds) &&
      ParseDouble(f, "tensor_collective_idle_fraction",
                  &p.blocks.tensor_collective_idle_fraction) &&
      ParseDouble(f, "concurrent_slowdown", &p.blocks.concurrent_slowdown);
  if (!parsed || p.cpu.gemm_flops_per_second_per_thread <= 0 || p.blocks.fixed_seconds <= 0) {
    return std::nullopt;
  }
  p.cpu.gemm_source = f["gemm_source"];
  p.blocks.line = f["block_line"];
  return p;
}

absl::Status WriteProbeCache(const std::string& path, const std::string& key,
                             const HostProbes& probes) {
  std::ostringstream out;
  out.precision(17);
  out << kMagic << "\n"
      << "key " << OneLine(key) << "\n"
      << "measured_unix_ms " << absl::ToUnixMillis(probes.measured) << "\n"
      << "pid " << probes.pid << "\n"
      << "gemm_flops_per_second_per_thread " << probes.cpu.gemm_flops_per_second_per_thread << "\n"
      << "memory_bandwidth_bytes_per_second " << probes.cpu.memory_bandwidth_bytes_per_second
      << "\n"
      << "gemm_source " << OneLine(probes.cpu.gemm_source) << "\n"
      << "gemm_threads " << probes.cpu.gemm_threads << "\n"
      << "cpu_seconds " << probes.cpu.seconds << "\n"
      << "block_fixed_seconds " << probes.blocks.fixed_seconds << "\n"
      << "block_seconds_per_activation " << probes.blocks.seconds_per_activation << "\n"
      << "allreduce_latency_seconds " << probes.blocks.allreduce_latency_seconds << "\n"
      << "allreduce_bytes_per_second " << probes.blocks.allreduce_bytes_per_second << "\n"
      << "tensor_collective_extra_seconds " << probes.blocks.tensor_collective_extra_seconds << "\n"
      << "tensor_collective_idle_fraction " << probes.blocks.tensor_collective_idle_fraction << "\n"
      << "concurrent_slowdown " << probes.blocks.concurrent_slowdown << "\n"
      << "block_line " << OneLine(probes.blocks.line) << "\n";
  if (absl::Status s = WritePrivateFile(path, out.str()); !s.ok()) {
    return absl::InternalError(absl::StrCat("probe cache: cannot write ", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace loom::worker
