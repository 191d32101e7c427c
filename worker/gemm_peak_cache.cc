#include "worker/gemm_peak_cache.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "worker/probe_cache.h"

namespace loom::worker {
namespace {

constexpr char kMagic[] = "loom-gemm-peak-cache 1";
constexpr size_t kMaxEntries = 64;

// One entry per line: threads, FLOP/s, measured (unix ms), pid, key.
struct Entry {
  int threads = 0;
  GemmPeak peak;
  std::string key;
};

std::vector<Entry> ReadEntries(const std::string& path) {
  std::vector<Entry> out;
  absl::StatusOr<std::string> text = ReadOwnedFile(path, 1 << 20);
  if (!text.ok()) return out;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    if (first) {
      if (line != kMagic) return {};
      first = false;
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 4));
    Entry e;
    int64_t ms = 0;
    if (f.size() != 5 || !absl::SimpleAtoi(f[0], &e.threads) ||
        !absl::SimpleAtod(f[1], &e.peak.flops_per_second) || !absl::SimpleAtoi(f[2], &ms) ||
        !absl::SimpleAtoi(f[3], &e.peak.pid) || e.threads <= 0 || e.peak.flops_per_second <= 0) {
      continue;
    }
    e.peak.measured = absl::FromUnixMillis(ms);
    e.key = f[4];
    out.push_back(std::move(e));
  }
  return out;
}

bool Fresh(const GemmPeak& p, absl::Duration max_age, absl::Time now) {
  return now - p.measured <= max_age && p.measured <= now + absl::Minutes(1);
}

std::string OneLine(const std::string& s) {
  return absl::StrReplaceAll(s, {{"\n", " "}, {"\r", " "}});
}

}  // namespace

std::string DefaultGemmPeakCachePath() {
  return std::filesystem::path(DefaultProbeCachePath())
      .replace_filename("loom-gemm-peak.cache")
      .string();
}

absl::Duration GemmPeakMaxAge() {
  const char* v = getenv("LOOM_PROBE_MAX_AGE_SECONDS");
  double seconds = 0;
  if (v != nullptr && absl::SimpleAtod(v, &seconds) && seconds >= 0) {
    return absl::Seconds(seconds);
  }
  return absl::Minutes(10);
}

std::optional<GemmPeak> ReadGemmPeak(const std::string& path, const std::string& key, int threads,
                                     absl::Duration max_age, absl::Time now) {
  if (max_age <= absl::ZeroDuration()) return std::nullopt;
  const std::string want = OneLine(key);
  for (const Entry& e : ReadEntries(path)) {
    if (e.threads == threads && e.key == want && Fresh(e.peak, max_age, now)) return e.peak;
  }
  return std::nullopt;
}

absl::Status WriteGemmPeak(const std::string& path, const std::string& key, int threads,
                           const GemmPeak& peak, absl::Duration max_age) {
  const std::string want = OneLine(key);
  std::vector<Entry> keep;
  for (Entry& e : ReadEntries(path)) {
    if ((e.threads == threads && e.key == want) || !Fresh(e.peak, max_age, peak.measured)) continue;
    keep.push_back(std::move(e));
  }
  while (keep.size() >= kMaxEntries) keep.erase(keep.begin());
  keep.push_back({threads, peak, want});
  std::string text = absl::StrCat(kMagic, "\n");
  for (const Entry& e : keep) {
    absl::StrAppend(&text, e.threads, " ", absl::StrCat(e.peak.flops_per_second), " ",
                    absl::ToUnixMillis(e.peak.measured), " ", e.peak.pid, " ", e.key, "\n");
  }
  if (absl::Status s = WritePrivateFile(path, text); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("GEMM peak cache: cannot write ", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

double GemmPeakFor(int threads, const std::function<double()>& measure, std::string* log) {
  const std::string cache = DefaultGemmPeakCachePath();
  const std::string key = ProbeCacheKey("/proc/self/exe");
  const absl::Duration max_age = GemmPeakMaxAge();
  const absl::Time now = absl::Now();
  if (std::optional<GemmPeak> cached = ReadGemmPeak(cache, key, threads, max_age, now)) {
    *log = absl::StrFormat(
        "GEMM peak %.2f GFLOP/s with %d thread(s), calibrated on this host %.0f s ago by pid %d "
        "(%s)",
        cached->flops_per_second / 1e9, threads, absl::ToDoubleSeconds(now - cached->measured),
        cached->pid, cache);
    return cached->flops_per_second;
  }
  const double peak = measure();
  *log = absl::StrFormat("GEMM calibration %.2f GFLOP/s with %d thread(s)", peak / 1e9, threads);
  if (max_age > absl::ZeroDuration() && peak > 0) {
    WriteGemmPeak(cache, key, threads, {peak, now, getpid()}, max_age)
        .IgnoreError();  // the next rank calibrates again
  }
  return peak;
}

}  // namespace loom::worker
