// control-plane: the controller under a large cluster's load.
//
// Starts a real loom-controller (fresh data dir and token, 127.0.0.1:0,
// heartbeat period 1 s, worker timeout 30 s so that load alone does not
// declare workers dead) and, in this one process over real gRPC
// (bench/control_plane_fleet.h: asynchronous clients on a few completion
// queues, a handful of shared connections):
//   * WORKERS simulated workers (default 10,000) register and heartbeat at
//     1 Hz with jitter, listing the ranks the controller started on them;
//   * JOBS jobs (default 100) of a tiny GPT, one rank each, are submitted;
//     each rank, once started, finishes a step at 10 Hz and reports its
//     steps with the job's generation (ReportStepMetrics, one report at a
//     time carrying every step since the last, as the real worker does);
//   * WATCHERS WatchJob streams (default 20) follow the first jobs.
// After a warm-up it measures for SECONDS (default 30): the client-side
// latency of every Heartbeat and ReportStepMetrics due in the window (from
// when it was due to its completion, any status), their counts and errors
// by status code, the controller's own per-RPC handling time from its
// /metrics, the controller's CPU (utime + stime from /proc/<pid>/stat over
// the window, as % of one core), RSS and threads, this process's CPU and
// the machine's. Everything stops by itself and the controller is killed
// at the end. Errors are reported, loudly past 1 %; nothing is asserted on
// time.
//
// Guard rails: at most FleetOptions::max_rpcs_in_flight (1024) RPCs are in
// flight at once (a send due beyond it waits, and its wait counts in its
// latency), and the controller is killed past kMaxControllerThreads
// threads: its synchronous gRPC methods (all but Heartbeat) run each RPC
// on a thread of their own, and before the controller bounded them a
// swamped controller took every pid of the machine.
//
// Usage:
//   loom_control_plane_bench BIN_DIR [WORKERS] [SECONDS] [JOBS] [WATCHERS] [WARMUP_SECONDS]
//                            [QUEUES] [CHANNELS]
// QUEUES: completion queues (one thread each) in this process, default
// min(4, cores); CHANNELS: connections to the controller, default 16.
// The data dir goes under $TMPDIR (default /tmp): its file system decides
// what the store's fsyncs cost (one per step report and per registration),
// and is printed.
// Last line: control-plane: <N> workers, p99 <x> ms ratio=<x/50>, x the
// worse of the two p99s; the issue aims at p99 < 50 ms on 2 cores.
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "bench/control_plane_fleet.h"
#include "bench/control_plane_report.h"
#include "bench/controller_process.h"
#include "cli/local_cluster.h"
#include "common/file_util.h"
#include "common/formats/data.h"
#include "common/grpc_util.h"
#include "common/jobspec.h"
#include "controller/service/access.h"
#include "controller/store/postgres_test_server.h"
#include "loom/v1/service.grpc.pb.h"
#include "tests/test_util.h"

namespace {

using Clock = std::chrono::steady_clock;
using loom::bench::ControllerProcess;
using loom::bench::Fleet;
using loom::bench::FleetStats;
using loom::bench::Percentile;
using loom::bench::PrintTailBySecond;
using loom::bench::RpcStats;

constexpr double kTargetP99Ms = 50;  // the target: p99 < 50 ms on 2 cores
constexpr double kLoudErrorFraction = 0.01;
// The controller is killed past this many threads: its gRPC server has a
// thread per RPC in flight and no cap, and a machine's pid_max (32768 here)
// is shared with everything else on it. FleetOptions::max_rpcs_in_flight
// keeps it well below.
constexpr int kMaxControllerThreads = 4096;

int Die(const std::string& msg) {
  std::cerr << "control-plane bench: " << msg << std::endl;
  return 1;
}

std::string CpuList(const cpu_set_t& set) {
  std::vector<std::string> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(std::to_string(cpu));
  }
  return absl::StrJoin(cpus, ",");
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// --------------------------------------------------------------- processes

// The number on a line of /proc/<pid>/status ("VmRSS" and "VmHWM" in KiB,
// "Threads").
double StatusField(int pid, const std::string& key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::atof(line.c_str() + key.size() + 1);
  }
  return 0;
}

// Watches the controller's thread count every 100 ms from a thread of its
// own, and SIGKILLs it past kMaxControllerThreads. Stops when destroyed.
class ThreadWatchdog {
 public:
  explicit ThreadWatchdog(int pid)
      : thread_([this, pid] {
          while (!stop_.load()) {
            const int n = static_cast<int>(StatusField(pid, "Threads"));
            most_ = std::max(most_.load(), n);
            if (n > kMaxControllerThreads && !fired_.exchange(true)) kill(pid, SIGKILL);
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }) {}
  ~ThreadWatchdog() {
    stop_ = true;
    thread_.join();
  }
  int most() const { return most_.load(); }
  bool fired() const { return fired_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> fired_{false};
  std::atomic<int> most_{0};
  std::thread thread_;  // last: starts once the rest is initialised
};

// utime + stime of `pid` ("self" for this process), in seconds.
double CpuSeconds(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(line.substr(paren + 2));
  std::string field;
  // After ")": state is field 3; utime and stime are fields 14 and 15.
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Busy and total jiffies of all CPUs together (/proc/stat).
struct MachineCpu {
  double busy = 0, total = 0;
};
MachineCpu ReadMachineCpu() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  MachineCpu m;
  for (int i = 0; i < 8; ++i) {
    double v = 0;
    in >> v;
    m.total += v;
    if (i != 3 && i != 4) m.busy += v;  // idle and iowait are not busy
  }
  return m;
}

std::string FileSystemOf(const std::string& path) {
  struct statfs fs {};
  if (statfs(path.c_str(), &fs) != 0) return "unknown";
  switch (static_cast<uint64_t>(fs.f_type)) {
    case 0xEF53: return "ext4";
    case 0x01021994: return "tmpfs";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x794C7630: return "overlayfs";
    default: return absl::StrFormat("f_type 0x%x", static_cast<uint64_t>(fs.f_type));
  }
}

// ------------------------------------------------------------ the server's

// The controller's loom_controller_rpc_duration_seconds histogram of one
// method, from its /metrics: count, sum and cumulative bucket counts.
struct ServerHistogram {
  double count = 0, sum = 0;
  std::map<double, double> buckets;  // le -> cumulative count
};

std::map<std::string, ServerHistogram> ScrapeRpcDurations(const std::string& metrics_address) {
  std::map<std::string, ServerHistogram> out;
  const std::string body = loom::testing::HttpGet(metrics_address, "/metrics").body;
  std::istringstream lines(body);
  std::string line;
  const std::string name = "loom_controller_rpc_duration_seconds";
  auto label = [](const std::string& l, const std::string& key) -> std::string {
    const size_t at = l.find(key + "=\"");
    if (at == std::string::npos) return "";
    const size_t begin = at + key.size() + 2;
    return l.substr(begin, l.find('"', begin) - begin);
  };
  while (std::getline(lines, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const std::string method = label(line, "method");
    const double value = std::atof(line.substr(line.rfind(' ') + 1).c_str());
    const std::string suffix = line.substr(name.size(), line.find('{') - name.size());
    ServerHistogram& h = out[method];
    if (suffix == "_count") h.count = value;
    if (suffix == "_sum") h.sum = value;
    if (suffix == "_bucket") {
      const std::string le = label(line, "le");
      h.buckets[le == "+Inf" ? INFINITY : std::atof(le.c_str())] = value;
    }
  }
  return out;
}

// The value of an unlabelled series `name` in the controller's /metrics,
// or -1 when absent.
double ScrapeValue(const std::string& metrics_address, const std::string& name) {
  const std::string body = loom::testing::HttpGet(metrics_address, "/metrics").body;
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::atof(line.substr(name.size() + 1).c_str());
  }
  return -1;
}

// "mean 1.2 ms, p99 <= 6.4 ms" over the window (after - before); the p99
// is the upper bound of the histogram bucket that holds it.
std::string DescribeServerTime(const ServerHistogram& before, const ServerHistogram& after) {
  const double n = after.count - before.count;
  if (n <= 0) return "no samples";
  double p99_bound = INFINITY;
  for (const auto& [le, cumulative] : after.buckets) {
    const auto b = before.buckets.find(le);
    const double in_window = cumulative - (b == before.buckets.end() ? 0 : b->second);
    if (in_window >= 0.99 * n) {
      p99_bound = le;
      break;
    }
  }
  // Calls slower than the largest bound at or under 10 ms: a lock held
  // long, or a stall inside the handler, shows here although too rare for
  // the p99.
  double slow_bound = 0, slow = 0;
  for (const auto& [le, cumulative] : after.buckets) {
    if (le > 0.010) break;
    const auto b = before.buckets.find(le);
    slow_bound = le;
    slow = n - (cumulative - (b == before.buckets.end() ? 0 : b->second));
  }
  return absl::StrFormat("mean %.2f ms, p99 <= %s over %.0f calls; %.0f over %.1f ms",
                         1000 * (after.sum - before.sum) / n,
                         std::isinf(p99_bound) ? "inf" : absl::StrFormat("%.1f ms", 1000 * p99_bound),
                         n, slow, 1000 * slow_bound);
}

// ----------------------------------------------------------------- figures

int64_t Failed(const RpcStats& s) {
  int64_t failed = 0;
  for (const auto& [code, n] : s.codes) failed += code == grpc::StatusCode::OK ? 0 : n;
  return failed;
}

std::string Codes(const RpcStats& s) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  std::vector<std::string> parts;
  for (const auto& [code, n] : s.codes) {
    if (code == grpc::StatusCode::OK) continue;
    const int c = static_cast<int>(code);
    parts.push_back(absl::StrCat(c >= 0 && c <= 16 ? kNames[c] : "?", " ", n));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

// What the PostgreSQL server did besides answering: its WAL (bytes, the
// full-page images, how often its buffers were full, writes and syncs and
// their time, the segments in pg_wal), its checkpoints, the buffers its
// backends had to write themselves, and autovacuum runs. Read with psql
// (the server's statistics views); empty when psql cannot say.
struct PgServerStats {
  std::vector<double> values;  // in the order of kPgStatNames
};
const char* const kPgStatNames[] = {
    "wal_records",       "wal_fpi",          "wal_bytes",       "wal_buffers_full",
    "wal_write",         "wal_sync",         "wal_write_ms",    "wal_sync_ms",
    "wal_segments",      "checkpoints",      "buffers_checkpoint", "buffers_backend",
    "buffers_backend_fsync", "autovacuum_runs"};

PgServerStats ReadPgServerStats(const std::string& url) {
  const std::string query =
      "SELECT w.wal_records, w.wal_fpi, w.wal_bytes, w.wal_buffers_full, w.wal_write, "
      "w.wal_sync, w.wal_write_time, w.wal_sync_time, (SELECT count(*) FROM pg_ls_waldir()), "
      "b.checkpoints_timed + b.checkpoints_req, b.buffers_checkpoint, b.buffers_backend, "
      "b.buffers_backend_fsync, (SELECT COALESCE(SUM(autovacuum_count), 0) FROM "
      "pg_stat_user_tables) FROM pg_stat_wal w, pg_stat_bgwriter b;";
  const auto r = loom::testing::RunCommand(absl::StrCat(
      "psql -X -A -t -F ' ' ", loom::testing::ShellQuote(url), " -c ",
      loom::testing::ShellQuote(query)));
  PgServerStats stats;
  if (r.exit_code != 0) return stats;
  for (absl::string_view field : absl::StrSplit(absl::StripAsciiWhitespace(r.out), ' ')) {
    double v = 0;
    if (!absl::SimpleAtod(field, &v)) return PgServerStats{};
    stats.values.push_back(v);
  }
  if (stats.values.size() != std::size(kPgStatNames)) return PgServerStats{};
  return stats;
}

std::string DescribePgServerStats(const PgServerStats& before, const PgServerStats& after) {
  if (before.values.empty() || after.values.empty()) return "no statistics (psql failed)";
  std::vector<std::string> parts;
  for (size_t i = 0; i < after.values.size(); ++i) {
    const double d = after.values[i] - before.values[i];
    parts.push_back(absl::StrFormat("%s %.0f", kPgStatNames[i], d));
  }
  return absl::StrJoin(parts, ", ");
}

// Prints one RPC kind's line; returns its p99 in ms (0 without samples).
// `carried` is what the RPCs sent in the window delivered (heartbeats, or
// steps), against `target_per_s` of it.
double Report(const std::string& what, RpcStats& s, double window_s, int64_t carried,
              const std::string& unit, double target_per_s) {
  std::sort(s.latency_ms.begin(), s.latency_ms.end());
  const double p50 = Percentile(s.latency_ms, 0.50), p99 = Percentile(s.latency_ms, 0.99);
  const double max = s.latency_ms.empty() ? 0 : s.latency_ms.back();
  std::sort(s.round_trip_ms.begin(), s.round_trip_ms.end());
  std::cout << absl::StrFormat(
      "%-12s %7d RPCs in the window (%.0f/s) carrying %.0f %s/s (target %.0f/s), %d failed "
      "(%s); latency p50 %.2f ms, p99 %.2f ms, max %.1f ms (from the call's start: p50 %.2f "
      "ms, p99 %.2f ms)\n",
      what + ":", s.sent, s.sent / window_s, carried / window_s, unit, target_per_s, Failed(s),
      Codes(s), p50, p99, max, Percentile(s.round_trip_ms, 0.50),
      Percentile(s.round_trip_ms, 0.99));
  const int64_t done = static_cast<int64_t>(s.latency_ms.size());
  if (done > 0 && static_cast<double>(Failed(s)) > kLoudErrorFraction * static_cast<double>(done)) {
    const std::string warning = absl::StrFormat(
        "WARNING: %.1f%% of %s RPCs failed (%s); the latencies are not those of a healthy "
        "controller",
        100.0 * static_cast<double>(Failed(s)) / static_cast<double>(done), what, Codes(s));
    std::cout << warning << "\n";
    std::cerr << warning << std::endl;
  }
  if (carried < 0.9 * target_per_s * window_s) {
    std::cout << absl::StrFormat(
        "note: %s fell %.0f%% short of the target (each worker or rank waits for its answer: "
        "a slow controller gets fewer)\n",
        unit, 100 * (1 - carried / (target_per_s * window_s)));
  }
  return p99;
}

// ---------------------------------------------------------------- the jobs

// The tiny GPT of tests/cluster_test.cc, one rank, a schedule that outlasts
// the bench.
std::string JobSpecYaml(int i, const std::string& data_dir) {
  return absl::StrFormat(R"(name: cp-%d
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data: {train: ["%s/train_*.bin"]}
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 10000000, warmup_steps: 5}
batch: {global_batch: 8, micro_batch: 8}
resources: {workers: 1, ranks: 1}
seed: 7
)",
                         i, data_dir);
}

std::unique_ptr<grpc::ClientContext> Context(const std::string& token, int seconds) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  loom::AttachToken(ctx.get(), token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

int CountRunning(loom::v1::JobService::Stub* stub, const std::string& token) {
  loom::v1::ListJobsRequest req;
  req.add_states(loom::v1::RUNNING);
  req.set_page_size(1000);
  loom::v1::ListJobsResponse resp;
  auto ctx = Context(token, 10);
  if (!stub->ListJobs(ctx.get(), req, &resp).ok()) return -1;
  return resp.jobs_size();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    return Die("usage: loom_control_plane_bench BIN_DIR [WORKERS] [SECONDS] [JOBS] [WATCHERS] "
               "[WARMUP_SECONDS] [QUEUES] [CHANNELS]");
  }
  // The load generator, like the controller (controller_main.cc), skips
  // Abseil's lock-order graph, which gRPC's absl::Mutex keeps in Debian's
  // build: perf put it at ~10% of this process's CPU, on the cores the
  // controller under test needs.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const std::string bin = argv[1];
  const int workers = argc > 2 ? std::atoi(argv[2]) : 10000;
  const double window_s = argc > 3 ? std::atof(argv[3]) : 30;
  const int jobs = argc > 4 ? std::atoi(argv[4]) : 100;
  const int watchers = std::min(jobs, argc > 5 ? std::atoi(argv[5]) : 20);
  const double warmup_s = argc > 6 ? std::atof(argv[6]) : 5;
  // By default the controller and this load generator share every core,
  // as the issue's "on 2 cores" reads. CONTROL_PLANE_PIN=1 gives the
  // controller one CPU of its own and the generator the rest, closer to a
  // fleet on other machines: on this project's VM the two processes then
  // spent less CPU (controller ~73% -> ~57% of a core: fewer cross-core
  // wake-ups, which cost the VM exits) but the generator's one core
  // saturated in some runs. Set before any thread starts, so that every
  // thread of this process inherits it.
  cpu_set_t allowed, controller_cpus, fleet_cpus;
  CPU_ZERO(&controller_cpus);
  CPU_ZERO(&fleet_cpus);
  bool pinned = false;
  const char* pin = std::getenv("CONTROL_PLANE_PIN");
  if (pin != nullptr && std::string(pin) == "1" &&
      sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) >= 2) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &allowed)) continue;
      CPU_SET(cpu, CPU_COUNT(&controller_cpus) == 0 ? &controller_cpus : &fleet_cpus);
    }
    pinned = sched_setaffinity(0, sizeof(fleet_cpus), &fleet_cpus) == 0;
  }
  const unsigned fleet_cores =
      pinned ? static_cast<unsigned>(CPU_COUNT(&fleet_cpus)) : std::thread::hardware_concurrency();
  loom::bench::FleetOptions options;
  // More queue threads than cores only adds switches between them.
  options.queues = static_cast<int>(std::min(4u, std::max(1u, fleet_cores)));
  if (argc > 7) options.queues = std::atoi(argv[7]);
  if (argc > 8) options.channels = std::atoi(argv[8]);
  if (workers < 1 || jobs < 0 || jobs > workers || watchers < 0 || window_s <= 0 ||
      warmup_s < 0) {
    return Die("need WORKERS >= 1, 0 <= WATCHERS <= JOBS <= WORKERS (one slot each), "
               "SECONDS > 0, WARMUP_SECONDS >= 0");
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                 "/loom_control_plane_bench_XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) return Die("cannot make a directory under " + dir);

  // A token shard: the controller does not read it, but a spec should name
  // data that exists.
  if (auto made = loom::MakeDirs(dir + "/data", 0700); !made.ok()) return Die(made.ToString());
  std::vector<uint16_t> tokens(1 << 16);
  std::mt19937 rng(7);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 256);
  if (auto s = loom::engine::WriteShard(dir + "/data/train_000000.bin", tokens); !s.ok()) {
    return Die(s.ToString());
  }
  // The fleet holds the workers' token; the bench's client is an admin of
  // the users file (controller/service/access.h). Plaintext, as in the figures of
  // earlier runs: this bench measures the controller, not the handshakes.
  auto token = loom::GenerateToken();
  auto worker_token = loom::GenerateToken();
  if (!token.ok() || !worker_token.ok()) return Die("cannot generate tokens");
  if (auto s = loom::WritePrivateFile(dir + "/worker-token", *worker_token + "\n"); !s.ok()) {
    return Die(s.ToString());
  }
  if (auto s = loom::WritePrivateFile(
          dir + "/users", loom::controller::UsersFileLine("bench", loom::controller::Role::kAdmin,
                                                          *token));
      !s.ok()) {
    return Die(s.ToString());
  }

  // The store: SQLite in the data dir (the default), or, with
  // CONTROL_PLANE_STORE=postgres, a PostgreSQL server of this run's own
  // (initdb under $TMPDIR, fsync on, the unix socket), as two controllers
  // of the ha setup share.
  const char* store_env = std::getenv("CONTROL_PLANE_STORE");
  const std::string store = store_env != nullptr && *store_env != '\0' ? store_env : "sqlite";
  if (store != "sqlite" && store != "postgres") {
    return Die("CONTROL_PLANE_STORE: sqlite or postgres, not " + store);
  }
  std::unique_ptr<loom::controller::store::PostgresTestServer> database;
  std::vector<std::string> controller_args = {bin + "/loom-controller",
                                              "--listen=127.0.0.1:0",
                                              "--metrics_listen=127.0.0.1:0",
                                              "--data_dir=" + dir + "/controller",
                                              "--users_file=" + dir + "/users",
                                              "--worker_token_file=" + dir + "/worker-token",
                                              "--allow_plaintext",
                                              "--ready_file=" + dir + "/controller.json",
                                              "--worker_timeout_s=30",
                                              "--heartbeat_interval_s=1"};
  if (store == "postgres") {
    loom::controller::store::PostgresTestServer::Options pg;
    pg.fsync = true;  // a commit costs what it costs in production
    // What the server does besides commits shows in its statistics
    // (PgServerStats) and its log; CONTROL_PLANE_PG_SETTINGS adds settings
    // to try ("wal_init_zero=off,wal_buffers=16MB").
    pg.settings = {"track_wal_io_timing=on", "log_checkpoints=on",
                   "log_autovacuum_min_duration=0"};
    if (const char* extra = std::getenv("CONTROL_PLANE_PG_SETTINGS"); extra != nullptr) {
      for (absl::string_view s : absl::StrSplit(extra, ',', absl::SkipEmpty())) {
        pg.settings.emplace_back(s);
      }
    }
    auto started = loom::controller::store::PostgresTestServer::Start(pg);
    if (!started.ok()) return Die("PostgreSQL: " + started.status().ToString());
    database = *std::move(started);
    controller_args.push_back("--store=" + database->SocketUrl("loom"));
    std::cout << "store: PostgreSQL " << database->dir() << " (fsync on, unix socket), pid "
              << database->pid() << "; settings " << absl::StrJoin(pg.settings, " ") << "\n";
  } else {
    std::cout << "store: SQLite in the data dir (WAL, synchronous=FULL)\n";
  }
  const std::string log = dir + "/controller.log";
  auto controller =
      ControllerProcess::Start(controller_args, log, pinned ? &controller_cpus : nullptr);
  if (!controller.ok()) return Die(controller.status().ToString());
  absl::StatusOr<loom::cli::DaemonInfo> info =
      (*controller)->WaitReady(dir + "/controller.json", 30);
  if (!info.ok()) return Die("the controller did not start; see " + log);
  const int pid = (*controller)->pid();
  auto watchdog = std::make_unique<ThreadWatchdog>(pid);
  std::cout << absl::StrFormat(
      "controller: pid %d on %s, data dir %s (%s), heartbeat period 1 s, worker timeout 30 s\n",
      pid, info->grpc_address, dir, FileSystemOf(dir));
  std::cout << (pinned ? absl::StrFormat("cores: the controller on CPU %s, this load generator "
                                         "on %d other(s), %d completion queue(s) "
                                         "(CONTROL_PLANE_PIN=1)\n",
                                         CpuList(controller_cpus), CPU_COUNT(&fleet_cpus),
                                         options.queues)
                       : absl::StrFormat("cores: all %d shared by the controller and this load "
                                         "generator, %d completion queue(s) "
                                         "(CONTROL_PLANE_PIN=1 splits them)\n",
                                         std::thread::hardware_concurrency(), options.queues));

  options.address = info->grpc_address;
  options.token = *worker_token;
  options.watch_token = *token;
  options.workers = workers;
  Fleet fleet(options);
  const auto setup = Clock::now();
  fleet.Start();
  // Registration ends when every worker is in, when the count has not grown
  // for 30 s, or after a minute and 10 ms a worker (the controller takes no
  // more): the bench then goes on with those it has, and says so.
  constexpr double kRegistrationStallS = 30;
  const double registration_limit_s = 60 + 0.01 * workers;
  auto last_progress = Clock::now(), last_growth = Clock::now();
  int last_count = 0;
  while (fleet.registered() < workers && SecondsSince(last_growth) < kRegistrationStallS &&
         SecondsSince(setup) < registration_limit_s && !(*controller)->Exited()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (fleet.registered() > last_count) {
      last_count = fleet.registered();
      last_growth = Clock::now();
    }
    if (SecondsSince(last_progress) >= 5) {
      last_progress = Clock::now();
      std::cerr << absl::StrFormat(
          "control-plane bench: %d/%d workers registered (%d failed registrations, retried)\n",
          fleet.registered(), workers, fleet.register_errors());
    }
  }
  const double register_s = SecondsSince(setup);
  if ((*controller)->Exited()) return Die("the controller exited; see " + log);
  if (fleet.registered() < jobs) {
    return Die(absl::StrFormat("only %d of %d workers registered, fewer than the %d jobs need",
                               fleet.registered(), workers, jobs));
  }
  if (fleet.registered() < workers) {
    const std::string warning = absl::StrFormat(
        "WARNING: only %d of %d workers registered after %.0f s (%d failed registrations); "
        "the rest keep retrying through the window",
        fleet.registered(), workers, SecondsSince(setup), fleet.register_errors());
    std::cout << warning << "\n";
    std::cerr << warning << std::endl;
  }

  auto channel = grpc::CreateChannel(info->grpc_address, grpc::InsecureChannelCredentials());
  auto job_stub = loom::v1::JobService::NewStub(channel);
  // A submission the controller sheds (RESOURCE_EXHAUSTED: its RPC threads
  // are all busy; UNAVAILABLE) is retried, as a client would, up to 20
  // times; one that still fails is left out, and the bench says so.
  std::vector<std::string> job_ids;
  std::map<std::string, int> submit_errors;
  const auto submit_start = Clock::now();
  for (int i = 0; i < jobs; ++i) {
    auto spec = loom::ParseJobSpec(JobSpecYaml(i, dir + "/data"));
    if (!spec.ok()) return Die(spec.status().ToString());
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = *spec;
    loom::v1::SubmitJobResponse resp;
    grpc::Status s;
    for (int attempt = 0; attempt < 20; ++attempt) {
      auto ctx = Context(*token, 30);
      s = job_stub->SubmitJob(ctx.get(), req, &resp);
      if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED &&
          s.error_code() != grpc::StatusCode::UNAVAILABLE) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50 << std::min(attempt, 4)));
    }
    if (s.ok()) {
      job_ids.push_back(resp.job().id());
    } else {
      submit_errors[s.error_message()]++;
    }
  }
  const double submit_s = SecondsSince(submit_start);
  for (const auto& [message, n] : submit_errors) {
    const std::string warning = absl::StrFormat("WARNING: %d SubmitJob calls failed: %s", n, message);
    std::cout << warning << "\n";
    std::cerr << warning << std::endl;
  }
  const int submitted = static_cast<int>(job_ids.size());
  fleet.Watch(std::vector<std::string>(job_ids.begin(),
                                       job_ids.begin() + std::min(watchers, submitted)));
  int running = 0;
  const auto run_start = Clock::now();
  while (SecondsSince(run_start) < 60 && !(*controller)->Exited()) {
    running = CountRunning(job_stub.get(), *token);
    if (running >= submitted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  std::cout << absl::StrFormat(
      "setup: %d workers registered in %.1f s (%d failed registrations), %d/%d jobs submitted "
      "in %.1f s, %d RUNNING %.1f s later, %d watchers\n",
      fleet.registered(), register_s, fleet.register_errors(), submitted, jobs, submit_s,
      running, SecondsSince(run_start), std::min(watchers, submitted))
            << std::flush;
  if (running < jobs) {
    const std::string warning =
        absl::StrFormat("WARNING: only %d of %d jobs are RUNNING; step reports fall short", running,
                        jobs);
    std::cout << warning << "\n";
    std::cerr << warning << std::endl;
  }

  std::this_thread::sleep_for(std::chrono::duration<double>(warmup_s));
  const auto server_before = ScrapeRpcDurations(info->metrics_address);
  const double writes_before =
      ScrapeValue(info->metrics_address, "loom_controller_store_writes_total");
  const double transactions_before =
      ScrapeValue(info->metrics_address, "loom_controller_store_transactions_total");
  const double controller_cpu_before = CpuSeconds(std::to_string(pid));
  const double self_cpu_before = CpuSeconds("self");
  const MachineCpu machine_before = ReadMachineCpu();
  const PgServerStats pg_before =
      database != nullptr ? ReadPgServerStats(database->SocketUrl("loom")) : PgServerStats{};
  const auto window_start = Clock::now();
  fleet.OpenWindow();
  std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
  fleet.CloseWindow();
  const double measured_s = SecondsSince(window_start);
  const double controller_cpu = CpuSeconds(std::to_string(pid)) - controller_cpu_before;
  const double self_cpu = CpuSeconds("self") - self_cpu_before;
  const MachineCpu machine_after = ReadMachineCpu();
  const PgServerStats pg_after =
      database != nullptr ? ReadPgServerStats(database->SocketUrl("loom")) : PgServerStats{};
  const auto server_after = ScrapeRpcDurations(info->metrics_address);
  // (The controller updates these every tick, 100 ms.)
  const double writes =
      ScrapeValue(info->metrics_address, "loom_controller_store_writes_total") - writes_before;
  const double transactions =
      ScrapeValue(info->metrics_address, "loom_controller_store_transactions_total") -
      transactions_before;
  const double rss_mib = StatusField(pid, "VmRSS") / 1024;
  const double peak_rss_mib = StatusField(pid, "VmHWM") / 1024;
  const int threads = static_cast<int>(StatusField(pid, "Threads"));
  const int ranks_running = fleet.ranks_running();

  // RPCs sent in the window complete (or time out) before the figures are
  // taken; then the controller goes.
  const bool drained = fleet.Stop(std::chrono::seconds(15));
  const bool controller_alive = !(*controller)->Exited();
  const int most_threads = watchdog->most();
  const bool watchdog_fired = watchdog->fired();
  watchdog.reset();  // before the pid is reaped and may be reused
  (*controller)->Stop(std::chrono::seconds(5));
  if (!drained) fleet.Stop(std::chrono::seconds(15));
  FleetStats stats = fleet.Finish();

  std::cout << absl::StrFormat(
      "window: %.1f s after a %.1f s warm-up; %d ranks reporting steps; %d sends started over "
      "1 ms after they were due (this load generator's delay: a busy completion queue, a late "
      "timer, or a wait for one of its %d slots for RPCs in flight)\n",
      measured_s, warmup_s, ranks_running, stats.started_late, options.max_rpcs_in_flight);
  PrintTailBySecond(stats.heartbeat, stats.step);
  const double heartbeat_p99 = Report("heartbeat", stats.heartbeat, measured_s,
                                      stats.heartbeat.sent, "heartbeats", workers * 1.0);
  const double step_p99 = Report("step report", stats.step, measured_s, stats.steps_sent,
                                 "steps", static_cast<double>(job_ids.size()) * 10.0);
  std::sort(stats.watch_delay_ms.begin(), stats.watch_delay_ms.end());
  std::cout << absl::StrFormat(
      "watch:       %d streams, %d step events in the window (%.0f/s), delivery from the "
      "step's report p50 %.0f ms, p99 %.0f ms (ms clock); %d streams ended early\n",
      std::min(watchers, submitted), stats.watch_events, stats.watch_events / measured_s,
      Percentile(stats.watch_delay_ms, 0.5), Percentile(stats.watch_delay_ms, 0.99),
      stats.watches_ended_early);
  std::cout << absl::StrFormat(
      "whole run: re-registrations %d, rank starts taken %d, stops %d, ranks ended by the "
      "controller %d, steps dropped unreported (over %d piled up) %d\n",
      stats.reregistrations, stats.starts, stats.stops, stats.ranks_ended, 100,
      stats.steps_dropped);
  for (const char* method : {"Heartbeat", "ReportStepMetrics"}) {
    const auto b = server_before.find(method);
    const auto a = server_after.find(method);
    std::cout << absl::StrFormat(
        "controller's own handling time (its /metrics) of %s: %s\n", method,
        a == server_after.end()
            ? std::string("not reported")
            : DescribeServerTime(b == server_before.end() ? ServerHistogram{} : b->second,
                                 a->second));
  }
  std::cout << absl::StrFormat(
      "controller's store: %.0f writes in %.0f transactions (%.0f/s, %.1f writes each)\n",
      writes, transactions, transactions / measured_s,
      transactions > 0 ? writes / transactions : 0.0);
  if (database != nullptr) {
    std::cout << "PostgreSQL in the window: " << DescribePgServerStats(pg_before, pg_after)
              << "\n";
  }
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  const double machine_busy = machine_after.total > machine_before.total
                                  ? (machine_after.busy - machine_before.busy) /
                                        (machine_after.total - machine_before.total)
                                  : 0;
  std::cout << absl::StrFormat(
      "controller: CPU %.0f%% of one core (%.1f s over %.1f s), RSS %.0f MiB (peak %.0f MiB), "
      "%d threads at the end of the window (most seen %d)%s\n",
      100 * controller_cpu / measured_s, controller_cpu, measured_s, rss_mib, peak_rss_mib, threads,
      most_threads,
      controller_alive ? "" : "; it had EXITED before the end, see " + log);
  std::cout << absl::StrFormat(
      "bench client: CPU %.0f%% of one core; machine: %.0f cores %.0f%% busy, %.0f%% of one core "
      "from other processes\n",
      100 * self_cpu / measured_s, cores, 100 * machine_busy,
      std::max(0.0, 100 * (machine_busy * cores - (controller_cpu + self_cpu) / measured_s)));
  {
    // The controller says on stderr when one holder kept its lock or its
    // store connection over 200 ms (common/watched_mutex.h): what a stall
    // in the window waited on.
    std::ifstream in(log);
    std::vector<std::string> holds;
    for (std::string line; std::getline(in, line);) {
      if (line.find(" held the ") != std::string::npos) holds.push_back(line);
    }
    std::cout << absl::StrFormat("controller's slow holds (over 200 ms, whole run): %d line(s)%s\n",
                                 holds.size(), holds.empty() ? "" : ", the first:");
    for (size_t i = 0; i < holds.size() && i < 5; ++i) std::cout << "  " << holds[i] << "\n";
  }
  for (const auto& [what, message] : stats.first_errors) {
    std::cout << "first " << what << " error: " << message << "\n";
  }
  if (!drained) std::cout << "note: some RPCs were still in flight 15 s after the window\n";
  if (watchdog_fired) {
    const std::string warning = absl::StrFormat(
        "WARNING: the controller passed %d threads and was killed (SIGKILL) to spare the "
        "machine's pids; the figures after that are of a dead controller",
        kMaxControllerThreads);
    std::cout << warning << "\n";
    std::cerr << warning << std::endl;
  }

  const double worst = std::max(heartbeat_p99, step_p99);
  std::cout << absl::StrFormat("control-plane: %d workers, p99 %.2f ms on %s ratio=%.3f\n", workers,
                               worst, store, worst / kTargetP99Ms);
  if (controller_alive) loom::testing::RunCommand("rm -rf " + loom::testing::ShellQuote(dir));
  return 0;
}
