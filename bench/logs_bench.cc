// `loomctl logs JOB --grep TEXT` on a big job: LOGS_LINES log lines
// (default 10,000,000) across ranks and attempts, appended through the
// controller's LogStore in 16 KiB appends (a worker's shipper catching up),
// on the embedded SQLite store and on PostgreSQL side by side. Each search
// is timed through the index (the median of five) and against the same
// search done by reading every byte of the job's logs back from the store
// and scanning them (what a store without an index must do). The last line
// is the slower store's median for a rare string:
//   logs: <ms> ratio=<full scan / indexed>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/logs/log_store.h"
#include "controller/store/postgres_test_server.h"
#include "controller/store/store.h"

namespace loom {
namespace {

using controller::LogKey;
using controller::LogStore;
using controller::Store;

constexpr int kRanks = 16;
constexpr int kAttempts = 2;
constexpr size_t kAppendBytes = 16 << 10;
const char kRare[] = "NCCL WARN watchdog timeout";  // planted kRarePlanted times
constexpr int kRarePlanted = 12;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// One rank's log of one attempt: training lines, with the rare line at the
// given line numbers.
std::string MakeLog(int rank, int attempt, int64_t lines, const std::vector<int64_t>& rare_at) {
  std::string out;
  out.reserve(static_cast<size_t>(lines) * 72);
  size_t next_rare = 0;
  std::mt19937_64 rng(static_cast<uint64_t>(rank * 131 + attempt));
  for (int64_t i = 0; i < lines; ++i) {
    if (next_rare < rare_at.size() && rare_at[next_rare] == i) {
      absl::StrAppend(&out, "[rank ", rank, "] step ", i, " ", kRare, " after 600000 ms\n");
      ++next_rare;
      continue;
    }
    absl::StrAppend(&out, "[rank ", rank, "] step ", i, " loss ",
                    absl::StrFormat("%.4f", 2.0 + static_cast<double>(rng() % 10000) / 10000),
                    " lr 3.0e-04 tok/s ", 10000 + rng() % 5000, " grad_norm ",
                    absl::StrFormat("%.3f", static_cast<double>(rng() % 2000) / 1000), "\n");
  }
  return out;
}

struct Result {
  std::string store;
  double ingest_s = 0;
  int64_t bytes = 0;
  double rare_ms = 0, unique_ms = 0, common_ms = 0, scan_ms = 0;
  size_t rare_found = 0, unique_found = 0, common_found = 0, scan_found = 0;
};

double MedianMs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2] * 1000;
}

// Ingests the job's logs into `logs`, then times the searches.
bool Run(Store* store, int64_t lines, Result* r) {
  auto opened = LogStore::Open(store, {int64_t{4} << 30});
  if (!opened.ok()) {
    std::cerr << "logs bench: " << opened.status() << std::endl;
    return false;
  }
  LogStore& logs = **opened;
  const std::string job = "big-1";
  const int64_t per_log = lines / (kRanks * kAttempts);
  const auto start = std::chrono::steady_clock::now();
  int planted = 0;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    for (int rank = 0; rank < kRanks; ++rank) {
      std::vector<int64_t> rare_at;
      if (planted < kRarePlanted && (rank * 7 + attempt) % 3 == 0) {
        rare_at.push_back(per_log / 2 + rank);
        ++planted;
      }
      std::string log = MakeLog(rank, attempt, per_log, rare_at);
      if (rank == 5 && attempt == 1) log += "[rank 5] checkpoint 7f3a9c written to s3 bucket-zeta\n";
      for (size_t at = 0; at < log.size(); at += kAppendBytes) {
        auto end = logs.Append({job, rank, attempt}, static_cast<int64_t>(at),
                               absl::string_view(log).substr(at, kAppendBytes),
                               at + kAppendBytes >= log.size());
        if (!end.ok()) {
          std::cerr << "logs bench: append: " << end.status() << std::endl;
          return false;
        }
      }
      r->bytes += static_cast<int64_t>(log.size());
    }
  }
  r->ingest_s = Seconds(start);
  auto timed = [&](const std::string& needle, int max_lines, double* ms, size_t* found) {
    std::vector<double> runs;
    for (int i = 0; i < 5; ++i) {
      const auto t = std::chrono::steady_clock::now();
      auto got = logs.Search(job, needle, max_lines);
      runs.push_back(Seconds(t));
      if (!got.ok()) {
        std::cerr << "logs bench: search: " << got.status() << std::endl;
        return false;
      }
      *found = got->lines.size();
    }
    *ms = MedianMs(runs);
    return true;
  };
  if (!timed(kRare, 1000, &r->rare_ms, &r->rare_found)) return false;
  if (!timed("7f3a9c written", 1000, &r->unique_ms, &r->unique_found)) return false;
  if (!timed("grad_norm 1.5", 1000, &r->common_ms, &r->common_found)) return false;
  // The same rare search without the index: every byte of every log read
  // back and scanned.
  const auto t = std::chrono::steady_clock::now();
  auto listed = logs.List(job);
  if (!listed.ok()) return false;
  size_t found = 0;
  for (const controller::LogInfo& info : *listed) {
    for (int64_t at = info.first_kept; at < info.end;) {
      auto slice = logs.Read(info.key, at, 4 << 20);
      if (!slice.ok() || slice->data.empty()) break;
      for (size_t p = slice->data.find(kRare); p != std::string::npos;
           p = slice->data.find(kRare, p + 1)) {
        ++found;
      }
      at = slice->offset + static_cast<int64_t>(slice->data.size());
    }
  }
  r->scan_ms = Seconds(t) * 1000;
  r->scan_found = found;
  return true;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  const char* env = getenv("LOGS_LINES");
  const int64_t lines = env != nullptr ? std::atoll(env) : 10'000'000;
  std::vector<loom::Result> results;
  {
    char tmpl[] = "/tmp/loom_logs_bench_XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    auto store = loom::controller::Store::Open(dir);
    if (!store.ok()) {
      std::cerr << "logs bench: " << store.status() << std::endl;
      return 1;
    }
    loom::Result r;
    r.store = "sqlite";
    const bool ok = loom::Run(store->get(), lines, &r);
    store->reset();
    std::filesystem::remove_all(dir);
    if (!ok) return 1;
    results.push_back(r);
  }
  {
    auto server = loom::controller::store::PostgresTestServer::Start();
    if (!server.ok()) {
      std::cerr << "logs bench: " << server.status() << std::endl;
      return 1;
    }
    if (!(*server)->CreateDatabase("logs").ok()) return 1;
    loom::controller::store::PostgresOptions options;
    options.url = (*server)->SocketUrl("logs");
    auto store = loom::controller::Store::OpenPostgres(options);
    if (!store.ok()) {
      std::cerr << "logs bench: " << store.status() << std::endl;
      return 1;
    }
    loom::Result r;
    r.store = "postgres";
    if (!loom::Run(store->get(), lines, &r)) return 1;
    results.push_back(r);
  }
  double worst = 0, ratio = 0;
  bool all_found = true;
  for (const loom::Result& r : results) {
    std::cout << absl::StrFormat(
                     "%-8s  %d lines, %.0f MB ingested in %.1f s (%.1f MB/s); --grep medians: "
                     "rare %.1f ms (%d lines), unique %.1f ms (%d), common %.1f ms (%d, capped "
                     "at 1000); rare by full scan %.0f ms (%d)",
                     r.store, lines, r.bytes / 1e6, r.ingest_s, r.bytes / 1e6 / r.ingest_s,
                     r.rare_ms, r.rare_found, r.unique_ms, r.unique_found, r.common_ms,
                     r.common_found, r.scan_ms, r.scan_found)
              << std::endl;
    all_found = all_found && r.rare_found == r.scan_found && r.unique_found == 1;
    if (r.rare_ms >= worst) {
      worst = r.rare_ms;
      ratio = r.scan_ms / r.rare_ms;
    }
  }
  if (!all_found) {
    std::cout << "logs: FAILED: the index and the full scan disagree" << std::endl;
    return 1;
  }
  std::cout << absl::StrFormat("logs: %.1f ms ratio=%.1f", worst, ratio) << std::endl;
  return worst < 500 ? 0 : 1;
}
