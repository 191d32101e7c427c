// loom-worker: flags and wiring only; the logic lives in WorkerAgent.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cpu_list.h"
#include "common/grpc_util.h"
#include "common/health_service.h"
#include "common/json_writer.h"
#include "common/metrics.h"
#include "common/metrics_server.h"
#include "worker/blas_info.h"
#include "worker/cpu_probe.h"
#include "worker/node_notice.h"
#include "worker/probe_cache.h"
#include "worker/snapshot_dirs.h"
#include "worker/telemetry/nvml.h"
#include "worker/worker_agent.h"

ABSL_FLAG(std::string, controller, "127.0.0.1:7070",
          "controller gRPC address; several, comma-separated, for controllers that share one "
          "database (one leads, the worker follows it)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the workers' token (mode 0600, or 0640/0440 with a group); not needed "
          "with a client certificate (--tls_cert)");
ABSL_FLAG(bool, tls, false, "use TLS to reach the controller");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle to trust for the controller");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate from the cluster CA, common name 'worker:<node>' (implies "
          "--tls); it identifies this worker as that node");
ABSL_FLAG(std::string, tls_key, "", "the client certificate's PEM private key");
ABSL_FLAG(std::string, tls_cert_dir, "",
          "directory of workers' certificates, as `loomctl ca issue worker NODE --dir DIR` "
          "writes them (e.g. a mounted Secret): this worker uses DIR/worker-<node>.pem and "
          ".key, and fails to start when its node has none (instead of --tls_cert/--tls_key)");
ABSL_FLAG(std::string, node, "", "node name (default: host name)");
ABSL_FLAG(std::string, address, "127.0.0.1", "address other ranks use to reach this node");
ABSL_FLAG(std::string, zone, "",
          "failure zone this worker runs in, reported at registration (default: $LOOM_ZONE)");
ABSL_FLAG(std::string, rack, "",
          "rack this worker runs in, reported at registration (default: $LOOM_RACK)");
ABSL_FLAG(std::string, host_id, "",
          "machine this worker shares with other workers reporting the same id (their slots "
          "share its cores and memory); empty = the kernel's boot id (or $LOOM_HOST_ID)");
ABSL_FLAG(int, slots, 1, "ranks this worker runs at once");
ABSL_FLAG(uint64_t, memory_bytes, 0,
          "memory this worker lends its ranks, reported to the controller, whose planner "
          "divides it over the slots (0 = the host's RAM)");
ABSL_FLAG(std::string, gpus, "auto",
          "GPUs ranks may train on (jobs with resources.gpus_per_rank 1): a count, or auto = "
          "the NVIDIA GPUs NVML sees (0 without a driver)");
ABSL_FLAG(double, grid_intensity_g_per_kwh, 475,
          "carbon intensity of this node's electricity, g CO2-eq per kWh, for "
          "loom_worker_co2_grams_total (default: the IEA's 2019 world average; set your "
          "grid's figure)");
ABSL_FLAG(std::string, work_dir, "", "per-rank logs and files (required)");
ABSL_FLAG(std::string, rank_binary, "", "path to loom-rank (default: next to loom-worker)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0", "/metrics listen address");
ABSL_FLAG(std::string, ready_file, "", "once registered-ready, write {metrics_address} JSON here");
ABSL_FLAG(std::string, notice_file, "",
          "a file whose appearance says this node is going away (empty, seconds left, or an "
          "RFC 3339 time): the controller drains the node by then (empty = none watched)");
ABSL_FLAG(std::string, notice_url, "",
          "an HTTP metadata endpoint polled each second for the node's reclaim notice, in the "
          "shape of AWS's spot instance-action or GCE's instance/preempted (empty = none)");
ABSL_FLAG(absl::Duration, sigterm_notice, absl::Seconds(25),
          "on SIGTERM with ranks running, tell the controller the node goes in this long, and "
          "exit once its ranks have saved and stopped (or then); 0 = stop the ranks at once");
ABSL_FLAG(int, upload_part_mib, 16,
          "object-store tier (checkpoint.remote): files over this many MiB are uploaded as "
          "multipart uploads of parts this size, one part in memory per upload thread (5-5120)");
ABSL_FLAG(int, upload_threads, 2, "object-store tier: files uploaded at once (1-16)");
ABSL_FLAG(double, upload_max_mbps, 0,
          "object-store tier: the most each upload thread sends, megabytes a second (0: no cap)");
ABSL_FLAG(std::string, upload_cpus, "",
          "object-store tier: the CPUs uploads run on, e.g. 30-31 (empty: any, at nice 10); "
          "leave the ranks' CPUs out to keep uploads off training's cores");
ABSL_FLAG(int, upload_min_kbps, 1,
          "object-store tier: a request that moves fewer kilobytes a second than this for "
          "--upload_slow_for fails (and is retried): a stalled store is an outage, not a hang");
ABSL_FLAG(absl::Duration, upload_slow_for, absl::Seconds(30),
          "object-store tier: how long a request may stay under --upload_min_kbps");
ABSL_FLAG(absl::Duration, probe_max_age, absl::Minutes(10),
          "reuse the CPU and block probes another worker of this host measured this long ago "
          "at most, for the same rank binary, BLAS core and CPUs (<temp dir>/loom-probe.cache), "
          "instead of probing again: a worker starts in well under a second, and one started "
          "beside training ranks does not measure them; its ranks likewise reuse a GEMM peak "
          "calibrated this long ago at most (<temp dir>/loom-gemm-peak.cache); 0 = always probe");
ABSL_FLAG(std::string, snapshot_dir, "auto",
          "where ranks keep in-memory snapshots of their jobs (checkpoint.snapshots): a "
          "directory in host memory; auto = /dev/shm/loom-snapshots-<uid>; empty = none");
ABSL_FLAG(absl::Duration, snapshot_idle, absl::Minutes(10),
          "a job's snapshots on this node are removed once none was written for this long and "
          "none of its ranks runs here");
ABSL_FLAG(int, warm_ranks, -1,
          "rank processes kept started, LibTorch loaded, waiting for an assignment, so that a "
          "restart, re-plan or resume here skips process start-up (a gang is as quick as its "
          "slowest rank: -1 = one per slot); started once a rank has run here and none has "
          "started for --warm_after; each holds an idle process's memory; 0 = none");
ABSL_FLAG(absl::Duration, warm_after, absl::Seconds(20),
          "start a warm rank only once no rank has started here for this long");
ABSL_FLAG(std::string, health_listen, "",
          "serve grpc.health.v1 (plaintext) here: SERVING while registered with the controller, "
          "NOT_SERVING otherwise (empty = off)");

namespace {

std::atomic<bool> agent_stopping{false};

int Fail(const std::string& msg) {
  std::cerr << "loom-worker: " << msg << std::endl;
  return 1;
}

// The flag's value, or when it is empty the environment variable's.
std::string FlagOrEnv(const std::string& flag, const char* env) {
  if (!flag.empty()) return flag;
  const char* v = getenv(env);
  return v ? v : "";
}

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, n);
  return p.substr(0, p.rfind('/'));
}

}  // namespace

int main(int argc, char** argv) {
  // Block SIGINT/SIGTERM before any thread exists, so every thread inherits
  // the mask and only the sigwait below takes them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  // Heartbeats fail fast while the controller is unreachable, so between
  // them no RPC drives the channel's reconnection; gRPC's timer thread does,
  // once per backup-poll interval (5 s by default). A TLS handshake needs
  // several polls: at 5 s apiece it outlived its connection attempt, and a
  // worker whose controller restarted never got back in. Poll every 100 ms
  // (before gRPC initializes, which reads it; an operator's setting wins).
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", /*overwrite=*/0);
  // Debian builds Abseil without NDEBUG, so every absl::Mutex (gRPC's
  // locks are) keeps a lock-order graph for deadlock detection: under
  // 10,000 heartbeating workers that bookkeeping was ~4% of the
  // controller's CPU (perf, bench control-plane). Loom's own locks are
  // std::mutex; tests and sanitizer builds keep the detection.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage("Loom worker: runs the ranks the controller assigns.");
  // --help lists the worker's own flags (abseil's default looks for a file
  // named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "worker/worker_main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  using namespace loom;

  worker::WorkerOptions opts;
  opts.node = absl::GetFlag(FLAGS_node);
  if (opts.node.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    opts.node = host;
  }
  opts.address = absl::GetFlag(FLAGS_address);
  opts.zone = FlagOrEnv(absl::GetFlag(FLAGS_zone), "LOOM_ZONE");
  opts.rack = FlagOrEnv(absl::GetFlag(FLAGS_rack), "LOOM_RACK");
  opts.host_id = FlagOrEnv(absl::GetFlag(FLAGS_host_id), "LOOM_HOST_ID");
  opts.grid_intensity_g_per_kwh = absl::GetFlag(FLAGS_grid_intensity_g_per_kwh);
  if (!(opts.grid_intensity_g_per_kwh >= 0)) {
    std::cerr << "loom-worker: --grid_intensity_g_per_kwh must be >= 0" << std::endl;
    return 2;
  }
  const int part_mib = absl::GetFlag(FLAGS_upload_part_mib);
  if (part_mib < 5 || part_mib > 5120) {
    return Fail("--upload_part_mib must be in [5, 5120] (S3's part sizes)");
  }
  opts.upload.transfer.part_bytes = static_cast<uint64_t>(part_mib) << 20;
  opts.upload.transfer.threads = absl::GetFlag(FLAGS_upload_threads);
  if (opts.upload.transfer.threads < 1 || opts.upload.transfer.threads > 16) {
    return Fail("--upload_threads must be in [1, 16]");
  }
  const double max_mbps = absl::GetFlag(FLAGS_upload_max_mbps);
  if (!(max_mbps >= 0)) return Fail("--upload_max_mbps must be >= 0");
  opts.upload.client.max_send_bytes_per_second = static_cast<int64_t>(max_mbps * 1e6);
  if (const std::string cpus = absl::GetFlag(FLAGS_upload_cpus); !cpus.empty()) {
    absl::StatusOr<std::vector<int>> list = loom::ParseCpuList(cpus);
    if (!list.ok()) return Fail(absl::StrCat("--upload_cpus: ", list.status().message()));
    const std::vector<int> allowed = loom::AllowedCpus();
    for (int c : *list) {
      if (!std::binary_search(allowed.begin(), allowed.end(), c)) {
        return Fail(absl::StrCat("--upload_cpus: CPU ", c, " is not one this worker may use (",
                                 loom::FormatCpuList(allowed), ")"));
      }
    }
    opts.upload.cpus = *list;
  }
  const int min_kbps = absl::GetFlag(FLAGS_upload_min_kbps);
  const absl::Duration slow = absl::GetFlag(FLAGS_upload_slow_for);
  if (min_kbps < 1) return Fail("--upload_min_kbps must be >= 1");
  if (slow < absl::Seconds(1)) return Fail("--upload_slow_for must be at least 1s");
  opts.upload.client.low_speed_bytes = int64_t{min_kbps} * 1000;
  opts.upload.client.low_speed_time = slow;
  opts.slots = absl::GetFlag(FLAGS_slots);
  opts.memory_bytes = absl::GetFlag(FLAGS_memory_bytes);
  if (opts.slots < 1) return Fail("--slots must be >= 1");
  if (const std::string gpus = absl::GetFlag(FLAGS_gpus); gpus == "auto") {
    absl::StatusOr<std::unique_ptr<loom::telemetry::Nvml>> nvml = loom::telemetry::Nvml::Open();
    absl::StatusOr<int> count =
        nvml.ok() ? (*nvml)->DeviceCount() : absl::StatusOr<int>(nvml.status());
    opts.gpus = count.ok() ? *count : 0;
    if (!count.ok()) {
      std::cerr << "loom-worker: no GPUs (" << count.status().message() << ")" << std::endl;
    }
  } else if (!absl::SimpleAtoi(gpus, &opts.gpus) || opts.gpus < 0 || opts.gpus > 64) {
    return Fail(absl::StrCat("--gpus must be auto or a count in [0, 64], got \"", gpus, "\""));
  }
  opts.work_dir = absl::GetFlag(FLAGS_work_dir);
  if (opts.work_dir.empty()) return Fail("--work-dir is required");
  mkdir(opts.work_dir.c_str(), 0755);
  opts.warm_ranks = absl::GetFlag(FLAGS_warm_ranks) < 0
                        ? std::max(1, absl::GetFlag(FLAGS_slots))
                        : std::min(absl::GetFlag(FLAGS_warm_ranks), 64);
  opts.warm_after = absl::GetFlag(FLAGS_warm_after);
  opts.rank_binary = absl::GetFlag(FLAGS_rank_binary);
  if (opts.rank_binary.empty()) opts.rank_binary = SelfDir() + "/loom-rank";
  if (access(opts.rank_binary.c_str(), X_OK) != 0) {
    return Fail(absl::StrCat("rank binary ", opts.rank_binary, " is not executable"));
  }
  std::string tls_cert = absl::GetFlag(FLAGS_tls_cert);
  std::string tls_key = absl::GetFlag(FLAGS_tls_key);
  if (const std::string dir = absl::GetFlag(FLAGS_tls_cert_dir); !dir.empty()) {
    if (!tls_cert.empty() || !tls_key.empty()) {
      return Fail("--tls_cert_dir and --tls_cert/--tls_key are alternatives: give one");
    }
    // One directory holds every node's pair (a Kubernetes Secret mounted
    // into every worker pod); the node name picks this worker's.
    tls_cert = absl::StrCat(dir, "/worker-", opts.node, ".pem");
    tls_key = absl::StrCat(dir, "/worker-", opts.node, ".key");
    for (const std::string& f : {tls_cert, tls_key}) {
      if (access(f.c_str(), R_OK) != 0) {
        return Fail(absl::StrCat("no certificate for node '", opts.node, "' in ", dir, ": ", f,
                                 " is not readable (", strerror(errno),
                                 "); issue one with `loomctl ca issue worker ", opts.node,
                                 " --dir DIR` and add worker-", opts.node,
                                 ".pem/.key to the directory (the loom-worker-tls Secret on "
                                 "Kubernetes)"));
      }
    }
  }
  const bool has_cert = !tls_cert.empty();
  if (!has_cert || !absl::GetFlag(FLAGS_token_file).empty()) {
    auto token = ReadTokenFile(absl::GetFlag(FLAGS_token_file));
    if (!token.ok()) {
      return Fail(absl::StrCat(token.status().message(),
                               " (a worker needs --token_file or a client certificate)"));
    }
    opts.token = *token;
  }

  // OpenBLAS 0.3.21 (Debian 12) does not know newer AVX-512 cores and falls
  // back to its generic SSE3 kernels: sgemm measured 62 GFLOP/s instead of
  // 307 with the SkylakeX kernels on this project's machines. Unless the
  // operator chose a core, name the closest one it knows; ranks inherit it.
  if (getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
    std::cerr << "loom-worker: OPENBLAS_CORETYPE=SkylakeX for the ranks (AVX-512 CPU)" << std::endl;
  }
  // After OPENBLAS_CORETYPE is settled: the probe loads the BLAS as ranks will.
  // One worker of a host probes at a time (cpu_probe.h, HostProbeLock), and
  // the next one started on the host within --probe_max_age takes its
  // results (probe_cache.h).
  auto probe_lock = std::make_unique<worker::HostProbeLock>(
      worker::HostProbeLock::DefaultPath(), /*wait_seconds=*/60);
  if (!probe_lock->note().empty()) std::cerr << "loom-worker: " << probe_lock->note() << std::endl;
  if (probe_lock->waited_seconds() > 0.1) {
    std::cerr << absl::StrFormat("loom-worker: waited %.1f s for another worker's probes",
                                 probe_lock->waited_seconds())
              << std::endl;
  }
  // Its ranks reuse a calibrated GEMM peak for as long (gemm_peak_cache.h).
  setenv("LOOM_PROBE_MAX_AGE_SECONDS",
         absl::StrCat(absl::ToDoubleSeconds(
                          std::max(absl::ZeroDuration(), absl::GetFlag(FLAGS_probe_max_age))))
             .c_str(),
         1);
  // In-memory snapshots: the ranks find the root in their environment.
  // (The default one may not be writable, as a root-owned /dev/shm volume
  // in a container: the worker then keeps none and says so.)
  std::string snapshot_root = absl::GetFlag(FLAGS_snapshot_dir);
  const bool snapshot_auto = snapshot_root == "auto";
  if (snapshot_auto) snapshot_root = worker::DefaultSnapshotRoot();
  std::unique_ptr<worker::SnapshotJanitor> snapshot_janitor;
  if (!snapshot_root.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(snapshot_root, ec);
    if (ec && !snapshot_auto) {
      return Fail(absl::StrCat("--snapshot_dir: ", snapshot_root, ": ", ec.message()));
    }
    if (ec) {
      std::cerr << "loom-worker: no in-memory snapshots: cannot create " << snapshot_root << ": "
                << ec.message() << " (set --snapshot_dir)" << std::endl;
      snapshot_root.clear();
    }
  }
  if (!snapshot_root.empty()) {
    std::error_code ec;
    std::filesystem::permissions(snapshot_root, std::filesystem::perms::owner_all, ec);
    setenv(worker::kSnapshotDirEnv, snapshot_root.c_str(), 1);
    snapshot_janitor = std::make_unique<worker::SnapshotJanitor>(
        snapshot_root, absl::GetFlag(FLAGS_snapshot_idle), absl::Seconds(30));
  } else {
    unsetenv(worker::kSnapshotDirEnv);
  }
  const std::string probe_cache = worker::DefaultProbeCachePath();
  const std::string probe_key = worker::ProbeCacheKey(opts.rank_binary);
  std::optional<worker::HostProbes> probes = worker::ReadProbeCache(
      probe_cache, probe_key, absl::GetFlag(FLAGS_probe_max_age), absl::Now());
  const bool cached = probes.has_value();
  if (!cached) {
    probes.emplace();
    probes->cpu = worker::ProbeCpu();
  }
  const worker::CpuProbe& cpu = probes->cpu;
  opts.gemm_flops_per_second_per_thread = cpu.gemm_flops_per_second_per_thread;
  opts.memory_bandwidth_bytes_per_second = cpu.memory_bandwidth_bytes_per_second;
  opts.gemm_source = cpu.gemm_source;
  const std::string from_cache =
      cached ? absl::StrFormat(" (measured %.0f s ago by worker pid %d, from %s)",
                               absl::ToDoubleSeconds(absl::Now() - probes->measured), probes->pid,
                               probe_cache)
             : "";
  std::cerr << absl::StrFormat(
                   "loom-worker: CPU probe: %.1f GFLOP/s fp32 GEMM per thread (%s), %.1f GB/s "
                   "copy, %.2fs%s",
                   cpu.gemm_flops_per_second_per_thread / 1e9, cpu.gemm_source,
                   cpu.memory_bandwidth_bytes_per_second / 1e9, cpu.seconds, from_cache)
            << std::endl;
  // What a block costs a rank beyond its FLOPs, for the planner: measured
  // by the rank binary itself (the worker does not link LibTorch).
  absl::StatusOr<worker::BlockProbe> blocks = probes->blocks;
  if (!cached) blocks = worker::ProbeBlocks(opts.rank_binary);
  if (blocks.ok()) {
    opts.block_fixed_seconds = blocks->fixed_seconds;
    opts.block_seconds_per_activation = blocks->seconds_per_activation;
    opts.allreduce_latency_seconds = blocks->allreduce_latency_seconds;
    opts.tensor_collective_extra_seconds = blocks->tensor_collective_extra_seconds;
    opts.tensor_collective_idle_fraction = blocks->tensor_collective_idle_fraction;
    opts.concurrent_slowdown = blocks->concurrent_slowdown;
    opts.allreduce_bytes_per_second = blocks->allreduce_bytes_per_second;
    std::cerr << absl::StrFormat(
                     "loom-worker: block probe: %.3f ms fixed + %.1f ns per activation element "
                     "per block forward + backward; 2-rank all-reduce %.0f us per step, %.2f GB/s; "
                     "tensor-parallel collectives %.0f us more each, %.0f%% of their time "
                     "off the CPU; %.2fx slower with every core computing%s",
                     blocks->fixed_seconds * 1e3, blocks->seconds_per_activation * 1e9,
                     blocks->allreduce_latency_seconds * 1e6,
                     blocks->allreduce_bytes_per_second / 1e9,
                     blocks->tensor_collective_extra_seconds * 1e6,
                     blocks->tensor_collective_idle_fraction * 100, blocks->concurrent_slowdown,
                     cached ? " (cached)" : "")
              << std::endl;
    // Only a whole measurement is kept: a worker whose block probe failed
    // leaves the next one to try again.
    if (!cached && absl::GetFlag(FLAGS_probe_max_age) > absl::ZeroDuration()) {
      probes->blocks = *blocks;
      probes->measured = absl::Now();
      probes->pid = static_cast<int>(getpid());
      if (absl::Status w = worker::WriteProbeCache(probe_cache, probe_key, *probes); !w.ok()) {
        std::cerr << "loom-worker: " << w.message() << " (the next worker probes again)"
                  << std::endl;
      }
    }
  } else {
    std::cerr << "loom-worker: block probe failed, the planner counts FLOPs only: "
              << blocks.status().message() << std::endl;
  }
  probe_lock.reset();
  auto registry = std::make_shared<metrics::Registry>();
  worker::BlasInfo blas = worker::DetectBlas();
  metrics::BuildGauge()
      .Name("loom_worker_blas_info")
      .Help("The BLAS library libblas.so.3 resolves to (value is 1; 0 if it is the slow reference).")
      .Register(*registry)
      .Add({{"vendor", blas.vendor}, {"path", blas.path}})
      .Set(blas.optimized ? 1 : 0);
  if (blas.optimized) {
    std::cerr << "loom-worker: BLAS: " << blas.vendor << " (" << blas.path << ")" << std::endl;
  } else {
    std::cerr << "loom-worker: WARNING ******************************************************\n"
              << "loom-worker: WARNING: libblas.so.3 is " << blas.vendor << " ("
              << (blas.path.empty() ? "not found" : blas.path) << ").\n"
              << "loom-worker: WARNING: training will run ~100x slower than with OpenBLAS.\n"
              << "loom-worker: WARNING: fix: sudo ./scripts/install-deps.sh (selects OpenBLAS)\n"
              << "loom-worker: WARNING ******************************************************"
              << std::endl;
  }

  auto exposer = metrics::Exposer::Start(absl::GetFlag(FLAGS_metrics_listen));
  if (!exposer.ok()) return Fail(absl::StrCat("metrics: ", exposer.status().message()));
  (*exposer)->RegisterCollectable(registry);
  opts.metrics_address = (*exposer)->address();

  auto creds = MakeChannelCredentials(absl::GetFlag(FLAGS_tls) || has_cert,
                                      absl::GetFlag(FLAGS_tls_ca), tls_cert, tls_key);
  if (!creds.ok()) return Fail(std::string(creds.status().message()));
  // Reconnect within a second of the controller coming back (gRPC's default
  // backoff grows past 10 s, longer than the lease: a restarted controller
  // would find the ranks already killed).
  // (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is also how long one connection
  // attempt, TCP and TLS handshakes together, may take: at 100 ms, TLS
  // handshakes on a loaded host timed out one after another and a worker
  // never registered. A refused connection still fails at once.)
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  channel_args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::vector<std::string> controllers =
      absl::StrSplit(absl::GetFlag(FLAGS_controller), ',', absl::SkipWhitespace());
  if (controllers.empty()) return Fail("--controller: give at least one address");
  std::vector<std::shared_ptr<loom::v1::WorkerService::StubInterface>> stubs;
  for (const std::string& address : controllers) {
    stubs.push_back(
        loom::v1::WorkerService::NewStub(grpc::CreateCustomChannel(address, *creds, channel_args)));
  }
  auto link = std::make_shared<worker::ControllerLink>(controllers, std::move(stubs));

  // The health service answers kubelet gRPC probes and the image's
  // HEALTHCHECK; it carries no secrets, so it is plaintext and needs no token.
  HealthService health;  // outlives health_server and the agent
  std::unique_ptr<grpc::Server> health_server;
  std::string health_listen = absl::GetFlag(FLAGS_health_listen);
  if (!health_listen.empty()) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(health_listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&health);
    health_server = builder.BuildAndStart();
    if (!health_server || port == 0) return Fail(absl::StrCat("cannot listen on ", health_listen));
    opts.on_registration = [&health](bool registered) { health.SetServing(registered); };
    std::cerr << "loom-worker: grpc.health.v1 on "
              << health_listen.substr(0, health_listen.rfind(':')) << ":" << port << std::endl;
  }

  // What says this node is going away: read by each heartbeat.
  worker::NodeNoticeOptions notice_options;
  notice_options.file = absl::GetFlag(FLAGS_notice_file);
  notice_options.url = absl::GetFlag(FLAGS_notice_url);
  if (!notice_options.url.empty() && !absl::StartsWith(notice_options.url, "http://")) {
    return Fail("--notice_url: must be http://host[:port]/path (a metadata endpoint)");
  }
  auto notices = std::make_shared<worker::NodeNoticeWatcher>(notice_options);
  opts.notice = [notices] { return notices->Current(); };
  auto agent = std::make_unique<worker::WorkerAgent>(opts, link, registry);
  std::cerr << "loom-worker: node " << opts.node
            << (opts.zone.empty() ? "" : absl::StrCat(", zone ", opts.zone))
            << (opts.rack.empty() ? "" : absl::StrCat(", rack ", opts.rack)) << ", "
            << opts.slots << " slot(s), " << opts.gpus << " GPU(s), metrics on "
            << opts.metrics_address << ", controller " << absl::GetFlag(FLAGS_controller)
            << std::endl;
  std::string ready = absl::GetFlag(FLAGS_ready_file);
  if (!ready.empty()) {
    absl::Status s = WritePrivateFile(
        ready, [&] {
          JsonWriter w;
          w.BeginObject();
          w.Field("metrics_address", opts.metrics_address);
          w.Field("pid", static_cast<int>(getpid()));
          w.EndObject();
          return w.Finish();
        }());
    if (!s.ok()) return Fail(std::string(s.message()));
  }
  std::atomic<bool> gave_up{false};
  std::thread runner([&] {
    agent->Run();
    if (!agent_stopping.load()) {
      gave_up = true;
      kill(getpid(), SIGTERM);  // wake the signal wait below
    }
  });
  int sig = 0;
  sigwait(&sigs, &sig);
  // SIGTERM is a notice (Kubernetes' drain or eviction, a spot reclaim's
  // shutdown): with ranks running, the controller is told the node goes by
  // the deadline and moves them (they save at their next step boundary);
  // the worker exits once they have stopped, at the deadline, or at a
  // second signal.
  const absl::Duration sigterm_notice = absl::GetFlag(FLAGS_sigterm_notice);
  if (!gave_up && sig == SIGTERM && sigterm_notice > absl::ZeroDuration() &&
      agent->RanksRunning() > 0) {
    const absl::Time deadline = absl::Now() + sigterm_notice;
    loom::v1::NodeNotice n;
    n.set_source("sigterm");
    n.set_deadline_unix_ms(absl::ToUnixMillis(deadline));
    n.set_detail("the worker received SIGTERM");
    notices->Raise(n);
    std::cerr << "loom-worker: SIGTERM: the controller drains this node; exiting once its "
              << agent->RanksRunning() << " rank(s) have saved and stopped, or in "
              << absl::FormatDuration(sigterm_notice) << std::endl;
    // Until the ranks have stopped and their exits reached the controller
    // (which then moves their jobs, losing nothing), not just stopped.
    const struct timespec tick = {0, 50 * 1000 * 1000};
    while (!gave_up && !agent->Quiet() && absl::Now() < deadline) {
      if (sigtimedwait(&sigs, nullptr, &tick) > 0) {
        std::cerr << "loom-worker: a second signal: stopping now" << std::endl;
        break;
      }
    }
  }
  agent_stopping = true;
  if (!gave_up) std::cerr << "loom-worker: signal " << sig << ", stopping ranks and exiting" << std::endl;
  agent->Stop();
  runner.join();
  agent.reset();
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now());
  return gave_up ? 1 : 0;
}
