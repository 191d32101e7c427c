// loom-controller: flags and wiring only; the logic lives in JobManager.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/grpc_util.h"
#include "common/health_service.h"
#include "common/json_writer.h"
#include "common/metrics.h"
#include "common/metrics_server.h"
#include "controller/admission/path_policy.h"
#include "controller/checkpoints/checkpoint_verifier.h"
#include "controller/console/console_server.h"
#include "controller/console/sessions.h"
#include "controller/controller_flags.h"
#include "controller/job_manager.h"
#include "controller/leader/catalog_mirror.h"
#include "controller/leader/leader_lease.h"
#include "controller/logs/log_store.h"
#include "controller/progress/goodput.h"
#include "controller/scheduling/queue_config.h"
#include "controller/service/access.h"
#include "controller/service/job_service.h"
#include "controller/service/worker_service.h"
#include "controller/store/store.h"

namespace {

// Threads for RPCs other than watch streams (see the ResourceQuota below).
constexpr int kShortRpcThreads = 64;

int Fail(const std::string& msg) {
  std::cerr << "loom-controller: " << msg << std::endl;
  return 1;
}

// A unique name for this process's claim on the leader lease.
std::string LeaseHolderId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::random_device random;
  return absl::StrFormat("%s-%d-%04x", host, getpid(), random() & 0xffff);
}

// The directory holding this executable ("" if /proc/self/exe is unreadable).
}  // namespace

int main(int argc, char** argv) {
  // Block SIGINT/SIGTERM before any thread exists, so every thread inherits
  // the mask and only the sigwait below takes them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGHUP);  // reloads --queues
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  // Debian builds Abseil without NDEBUG, so every absl::Mutex (gRPC's
  // locks are) keeps a lock-order graph for deadlock detection: under
  // 10,000 heartbeating workers that bookkeeping was ~4% of the
  // controller's CPU (perf, bench control-plane). Loom's own locks are
  // std::mutex; tests and sanitizer builds keep the detection.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage("Loom controller: job catalog, scheduling, worker registry.");
  // --help lists the controller's own flags (abseil's default looks for a
  // file named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "controller/controller_flags.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  using namespace loom;

  std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  if (data_dir.empty()) return Fail("--data-dir is required");
  mkdir(data_dir.c_str(), 0700);
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    return Fail(
        "--token_file is retired: workers and people no longer share a credential. Give the "
        "workers' token as --worker_token_file (or workers certificates from --tls_client_ca) "
        "and people tokens of their own in --users_file (`loomctl users add NAME --role admin`)");
  }
  if (absl::GetFlag(FLAGS_worker_token_file).empty() &&
      absl::GetFlag(FLAGS_tls_client_ca).empty()) {
    return Fail("workers cannot authenticate: pass --worker_token_file, or --tls_client_ca with "
                "--tls_cert and --tls_key for worker certificates");
  }
  auto access = controller::AccessControl::Load(absl::GetFlag(FLAGS_users_file),
                                                absl::GetFlag(FLAGS_worker_token_file));
  if (!access.ok()) return Fail(std::string(access.status().message()));

  const absl::Duration lease = absl::Seconds(absl::GetFlag(FLAGS_lease_s));
  auto store = loom::controller::OpenStoreFromFlags(data_dir, lease);
  const absl::Time wait_until = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_store_wait_s));
  for (int tries = 0; absl::IsUnavailable(store.status()) && !absl::GetFlag(FLAGS_store).empty() &&
                      absl::Now() < wait_until;
       ++tries) {
    if (tries == 0) {
      std::cerr << "loom-controller: waiting for the store: " << store.status().message()
                << std::endl;
    }
    absl::SleepFor(absl::Seconds(1));
    store = loom::controller::OpenStoreFromFlags(data_dir, lease);
  }
  if (!store.ok()) return Fail(std::string(store.status().message()));
  const bool shared_store = (*store)->dialect() == controller::store::SqlDialect::kPostgres;
  const absl::Duration lease_renew = absl::Seconds(absl::GetFlag(FLAGS_lease_renew_s));
  if (shared_store && (lease_renew <= absl::ZeroDuration() || lease < 2 * lease_renew)) {
    return Fail("--lease_s must be at least twice --lease_renew_s, and both > 0");
  }
  const std::string lease_holder = LeaseHolderId();

  controller::JobManagerOptions opts;
  opts.worker_timeout = absl::Seconds(absl::GetFlag(FLAGS_worker_timeout_s));
  opts.heartbeat_interval = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_interval_s));
  // The ticker below runs every ~100 ms; a gap of a second (or of a quarter
  // of the timeout, if shorter) means this process was not running, and
  // that is not its workers' silence (a VM frozen for 12 s once had two
  // controllers declare every worker dead on waking, before any could
  // heartbeat).
  opts.pause_threshold = std::min(absl::Seconds(1), opts.worker_timeout / 4);
  opts.max_watchers = absl::GetFlag(FLAGS_max_watchers);
  if (opts.max_watchers < 1) return Fail("--max_watchers must be >= 1");
  opts.finished_steps_kept = absl::GetFlag(FLAGS_finished_steps_kept);
  if (opts.finished_steps_kept < 0 || opts.finished_steps_kept == 1) {
    return Fail("--finished_steps_kept must be 0 (keep all) or >= 2");
  }
  opts.finished_events_kept = absl::GetFlag(FLAGS_finished_events_kept);
  if (opts.finished_events_kept < 0) return Fail("--finished_events_kept must be >= 0 (0: all)");
  std::vector<std::string> checkpoint_roots =
      controller::SplitRoots(absl::GetFlag(FLAGS_checkpoint_root));
  if (checkpoint_roots.empty()) checkpoint_roots.push_back(data_dir + "/checkpoints");
  for (const std::string& root : checkpoint_roots) {
    if (root[0] != '/') {
      return Fail(absl::StrCat("--checkpoint_root: \"", root,
                               "\" must be an absolute path (workers write under it)"));
    }
  }
  opts.checkpoint_root = checkpoint_roots[0];
  opts.extra_checkpoint_roots.assign(checkpoint_roots.begin() + 1, checkpoint_roots.end());
  opts.data_roots = controller::SplitRoots(absl::GetFlag(FLAGS_data_root));
  for (const std::string& root : opts.data_roots) {
    if (root[0] != '/') {
      return Fail(absl::StrCat("--data_root: \"", root, "\" must be an absolute path"));
    }
  }
  if (opts.data_roots.empty()) {
    std::cerr << "loom-controller: warning: no --data_root: jobs may read data from any path "
                 "the workers can read; give the directories that hold training data"
              << std::endl;
  }
  // Workers write the checkpoints; the controller only names the directory,
  // so a root it cannot create (not mounted here) is worth a warning only.
  if (absl::Status made = MakeDirs(opts.checkpoint_root, 0700); !made.ok()) {
    std::cerr << "loom-controller: warning: checkpoint root " << opts.checkpoint_root << ": "
              << made.message() << std::endl;
  }
  auto registry = std::make_shared<metrics::Registry>();
  controller::RecoveryMetrics recovery_metrics(*registry);
  controller::FileCheckpointVerifier checkpoint_verifier;
  controller::JobManager manager(store->get(), RealClock::Get(), opts, &recovery_metrics,
                                 &checkpoint_verifier);
  // The queue configuration: refused at start with the field at fault;
  // on SIGHUP a bad file is reported and the running configuration kept.
  const std::string queues_file = absl::GetFlag(FLAGS_queues);
  auto load_queues = [&queues_file]() -> absl::StatusOr<scheduling::QueueConfig> {
    if (queues_file.empty()) return scheduling::DefaultQueueConfig();
    return scheduling::LoadQueueConfigFile(queues_file);
  };
  {
    absl::StatusOr<scheduling::QueueConfig> queues = load_queues();
    if (!queues.ok()) return Fail(absl::StrCat("--queues: ", queues.status().message()));
    manager.SetQueueConfig(*std::move(queues));
  }
  // Leadership. Alone on a SQLite store this controller leads from the
  // start: the directory lock proves any earlier holder gone, so it takes
  // the lease at once with the next epoch, and workers refuse the decisions
  // of any controller before it. On a shared store it stands by until it
  // takes the lease (the elector below), and loads the catalogs then.
  controller::Leadership leadership;
  if (!shared_store) {
    absl::StatusOr<controller::Store::Lease> taken =
        (*store)->AcquireLease(lease_holder, "", absl::Hours(24 * 365), /*force=*/true);
    if (!taken.ok()) return Fail(absl::StrCat("leader lease: ", taken.status().message()));
    (*store)->SetFencingEpoch(taken->epoch);
    leadership.BecomeLeader(taken->epoch, controller::Leadership::kForever);
    absl::Status recovered = manager.Recover();
    if (!recovered.ok()) return Fail(absl::StrCat("recovering jobs: ", recovered.message()));
  }

  auto logs = controller::LogStore::Open(store->get(), {absl::GetFlag(FLAGS_log_max_bytes)});
  if (!logs.ok()) return Fail(absl::StrCat("--log_max_bytes / rank logs: ", logs.status().message()));
  // Rank logs an earlier version kept as files under the data directory
  // move into the store (once; the leader writes them).
  const std::string log_files = absl::StrCat(data_dir, "/logs");
  if (!shared_store) {
    if (auto imported = (*logs)->ImportFiles(log_files); !imported.ok()) {
      return Fail(absl::StrCat("rank logs: ", imported.status().message()));
    }
  }
  const absl::Duration log_retention = absl::GetFlag(FLAGS_log_retention);
  if (log_retention < absl::ZeroDuration()) return Fail("--log_retention: must be >= 0");

  controller::RpcMetrics rpc_metrics(*registry);
  auto& jobs_gauge = metrics::BuildGauge()
                         .Name("loom_controller_jobs")
                         .Help("Jobs known to the controller, by state.")
                         .Register(*registry);
  controller::GoodputMetrics goodput_metrics(*registry);
  auto& workers_gauge = metrics::BuildGauge()
                            .Name("loom_controller_workers_alive")
                            .Help("Workers currently heartbeating.")
                            .Register(*registry)
                            .Add({});
  auto& restarts_total = metrics::BuildCounter()
                             .Name("loom_controller_job_restarts_total")
                             .Help("Job restarts from a checkpoint after a rank or worker failed.")
                             .Register(*registry)
                             .Add({});
  auto& rollbacks_total = metrics::BuildCounter()
                              .Name("loom_controller_job_rollbacks_total")
                              .Help("Loss-spike rollbacks (resume earlier, skip data).")
                              .Register(*registry)
                              .Add({});
  auto& preemptions_total =
      metrics::BuildCounter()
          .Name("loom_controller_job_preemptions_total")
          .Help(
              "Preemptions of jobs (checkpoint-then-preempt), all jobs; per job and reason: "
              "loom_controller_preemptions_total.")
          .Register(*registry)
          .Add({});
  auto& spikes_total = metrics::BuildCounter()
                           .Name("loom_controller_loss_spikes_total")
                           .Help("Loss spikes declared by the detector.")
                           .Register(*registry)
                           .Add({});
  auto& store_write_failures_total =
      metrics::BuildCounter()
          .Name("loom_controller_store_write_failures_total")
          .Help("Durable writes of job records that failed; each is retried until it lands.")
          .Register(*registry)
          .Add({});
  auto& illegal_transitions_total =
      metrics::BuildCounter()
          .Name("loom_controller_illegal_transitions_total")
          .Help("Job state changes outside the state machine (a controller bug; each is recorded "
                "and logged).")
          .Register(*registry)
          .Add({});
  auto& store_writes_total = metrics::BuildCounter()
                                 .Name("loom_controller_store_writes_total")
                                 .Help("Job and step writes committed to the job store.")
                                 .Register(*registry)
                                 .Add({});
  auto& store_transactions_total =
      metrics::BuildCounter()
          .Name("loom_controller_store_transactions_total")
          .Help("Transactions (one fsync each) that committed those writes: writes that "
                "arrive together share one (group commit).")
          .Register(*registry)
          .Add({});
  auto exposer = metrics::Exposer::Start(absl::GetFlag(FLAGS_metrics_listen));
  if (!exposer.ok()) return Fail(absl::StrCat("metrics: ", exposer.status().message()));
  (*exposer)->RegisterCollectable(registry);

  auto creds = MakeServerCredentials(absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                     absl::GetFlag(FLAGS_tls_client_ca));
  if (!creds.ok()) return Fail(std::string(creds.status().message()));
  if (absl::GetFlag(FLAGS_tls_cert).empty()) {
    if (!absl::GetFlag(FLAGS_allow_plaintext)) {
      return Fail("no --tls_cert/--tls_key: pass them (loomctl local up makes a cluster CA and "
                  "certificates), or --allow_plaintext to serve without TLS");
    }
    std::cerr << "loom-controller: WARNING: serving without TLS (--allow_plaintext): tokens and "
                 "job specs cross the network in the clear"
              << std::endl;
  }

  std::atomic<bool> shutting_down{false};
  controller::console::ConsoleSessions sessions(store->get(),
                                                absl::GetFlag(FLAGS_console_session_lifetime));
  controller::JobServiceImpl job_service(
      &manager, access->get(), &rpc_metrics, &shutting_down, logs->get(), &leadership,
      absl::GetFlag(FLAGS_console_port) >= 0 ? &sessions : nullptr);
  controller::WorkerServiceImpl worker_service(&manager, access->get(), &rpc_metrics, logs->get(),
                                               &leadership);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  std::string listen = absl::GetFlag(FLAGS_listen);
  builder.AddListeningPort(listen, *creds, &port);
  // gRPC's synchronous server takes a thread for every RPC in progress
  // and, unbounded, grows one per waiting client: 10,000 heartbeating
  // workers once took it to ~8,000 threads and the host out of pids. A
  // watch stream holds its thread for as long as it lasts, so the bound is
  // the watchers plus room for the short RPCs; past it an RPC is answered
  // RESOURCE_EXHAUSTED (workers retry heartbeats and reports).
  grpc::ResourceQuota quota("loom-controller");
  quota.SetMaxThreads(opts.max_watchers + kShortRpcThreads);
  builder.SetResourceQuota(quota);
  // A synchronous RPC that finds fewer than MIN_POLLERS threads polling
  // starts one, and a thread that finishes one while more than MAX_POLLERS
  // poll exits. At gRPC's defaults (1 and 2) a thousand step reports a
  // second, each waiting some milliseconds for its transaction's fsync,
  // started and ended ~500 threads a second (bench control-plane). Idle
  // threads cost a stack each; keep those the short RPCs may need.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              kShortRpcThreads);
  builder.RegisterService(&job_service);
  builder.RegisterService(&worker_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail(absl::StrCat("cannot listen on ", listen));
  server->GetHealthCheckService()->SetServingStatus(true);
  // Probes carry no credentials and speak no TLS: their own listener, with
  // nothing but the health service on it.
  HealthService health;
  std::unique_ptr<grpc::Server> health_server;
  if (const std::string health_listen = absl::GetFlag(FLAGS_health_listen);
      !health_listen.empty()) {
    grpc::ServerBuilder health_builder;
    int health_port = 0;
    health_builder.AddListeningPort(health_listen, grpc::InsecureServerCredentials(),
                                    &health_port);
    health_builder.RegisterService(&health);
    health_server = health_builder.BuildAndStart();
    if (!health_server || health_port == 0) {
      return Fail(absl::StrCat("cannot listen on ", health_listen, " (--health_listen)"));
    }
    health.SetServing(true);
  }

  std::string host = listen.substr(0, listen.rfind(':'));
  std::string grpc_address = absl::StrCat(host, ":", port);
  // Loom Console: the JSON API answered by this server's own services.
  std::unique_ptr<controller::console::ConsoleServer> console;
  if (const int console_port = absl::GetFlag(FLAGS_console_port); console_port >= 0) {
    auto started = controller::console::StartControllerConsole(
        absl::StrCat(host, ":", console_port), absl::GetFlag(FLAGS_console_url),
        absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), server.get(), store->get(),
        &sessions, &leadership, lease_holder);
    if (!started.ok()) return Fail(absl::StrCat("--console_port: ", started.status().message()));
    console = *std::move(started);
  }
  const std::string console_url = console ? console->url() : "";
  std::cerr << "loom-controller: serving gRPC on " << grpc_address << ", metrics on "
            << (*exposer)->address() << ", data in " << data_dir << ", store "
            << (*store)->Describe() << ", checkpoints under " << opts.checkpoint_root
            << (console ? ", console on " + console_url : "") << std::endl;
  auto& leader_gauge = metrics::BuildGauge()
                           .Name("loom_controller_leader")
                           .Help(
                               "1 while this controller leads (a controller alone on its store "
                               "always does), 0 while it stands by.")
                           .Register(*registry)
                           .Add({});
  auto& epoch_gauge = metrics::BuildGauge()
                          .Name("loom_controller_leader_epoch")
                          .Help("The leader epoch this controller leads under (0: standby).")
                          .Register(*registry)
                          .Add({});
  // The ready file: where this controller serves, and its role ("active",
  // or "standby" until it takes the lease; `loomctl local status` shows it).
  const std::string ready = absl::GetFlag(FLAGS_ready_file);
  const std::string metrics_address = (*exposer)->address();
  auto write_ready = [ready, grpc_address, metrics_address, console_url](const char* role) {
    if (ready.empty()) return absl::OkStatus();
    JsonWriter w;
    w.BeginObject();
    w.Field("grpc_address", grpc_address);
    w.Field("metrics_address", metrics_address);
    if (!console_url.empty()) w.Field("console_url", console_url);
    w.Field("pid", static_cast<int>(getpid()));
    w.Field("role", role);
    w.EndObject();
    return WritePrivateFile(ready, w.Finish());
  };
  if (absl::Status s = write_ready(shared_store ? "standby" : "active"); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  // A shared store: stand by until this controller takes the lease; then
  // load the catalogs and re-adopt running jobs, as a restart does. When
  // the lease is lost, step down: run this program again, as a standby on
  // the same port, with nothing of the old leader's memory.
  // A standby's warm catalog (declared first: the elector uses it).
  controller::CatalogMirror mirror(store->get());
  std::unique_ptr<controller::LeaderElector> elector;
  if (shared_store) {
    controller::LeaderElectorOptions lease_options;
    lease_options.holder = lease_holder;
    lease_options.address = absl::GetFlag(FLAGS_advertise_address).empty()
                                ? grpc_address
                                : absl::GetFlag(FLAGS_advertise_address);
    lease_options.console_url = console_url;
    lease_options.lease = lease;
    lease_options.renew_interval = lease_renew;
    std::vector<std::string> again(argv, argv + argc);
    for (std::string& arg : again) {  // the same ports again
      if (absl::StartsWith(arg, "--listen=")) arg = absl::StrCat("--listen=", grpc_address);
      if (absl::StartsWith(arg, "--console_port=") && console) {
        arg = absl::StrCat("--console_port=", console->port());
      }
    }
    elector = std::make_unique<controller::LeaderElector>(
        store->get(), &leadership, lease_options,
        [&manager, &write_ready, &leadership, &mirror, &logs, &log_files, lease_holder,
         address = lease_options.address](int64_t epoch) -> absl::Status {
          const absl::Time start = absl::Now();
          // Who led before (the standby's last look at the lease row).
          const std::string previous = leadership.last_seen_holder();
          // The warm copy, with what the old leader wrote since the last
          // look: it can write nothing more now that this epoch leads.
          const size_t warm = mirror.size();
          absl::StatusOr<size_t> fresh = mirror.Refresh();
          if (!fresh.ok()) return fresh.status();
          absl::Status recovered = manager.Recover(
              previous.empty() ? absl::StrCat("controller ", lease_holder,
                                              " took over as leader (epoch ", epoch, ")")
                               : absl::StrCat("controller ", lease_holder, " took over from ",
                                              previous, " as leader (epoch ", epoch, ")"),
              mirror.TakeAll());
          if (!recovered.ok()) return recovered;
          if (auto imported = (*logs)->ImportFiles(log_files); !imported.ok()) {
            return imported.status();
          }
          std::cerr << absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::UTCTimeZone())
                    << "loom-controller: leading as epoch " << epoch << " (" << lease_holder
                    << " at " << address << "): loaded " << manager.List({}, 0).size()
                    << " job(s) in " << absl::FormatDuration(absl::Now() - start) << " (" << warm
                    << " kept warm, " << *fresh << " read at the takeover)" << std::endl;
          return write_ready("active");
        },
        [again](const std::string& reason) {
          std::cerr << absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::UTCTimeZone())
                    << "loom-controller: stepping down: " << reason
                    << "; starting again as a standby" << std::endl;
          std::vector<char*> args;
          for (const std::string& a : again) args.push_back(const_cast<char*>(a.c_str()));
          args.push_back(nullptr);
          execv("/proc/self/exe", args.data());
          std::cerr << "loom-controller: cannot start again (" << std::strerror(errno)
                    << "); exiting" << std::endl;
          _exit(75);
        });
    std::cerr << absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::UTCTimeZone())
              << "loom-controller: standing by as " << lease_holder << " (lease "
              << absl::FormatDuration(lease) << ", renewed every "
              << absl::FormatDuration(lease_renew) << ")" << std::endl;
    elector->Start();
  }

  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    absl::Time next_log_sweep = absl::Now();
    absl::Time next_goodput = absl::Now();
    while (!stop.load()) {
      const bool leading = leadership.LeadingNow();
      leader_gauge.Set(leading ? 1 : 0);
      // "loom.leader" on the health port: a readiness probe on it sends a
      // Kubernetes Service's traffic to the leader alone.
      health.SetServing("loom.leader", leading);
      server->GetHealthCheckService()->SetServingStatus("loom.leader", leading);
      epoch_gauge.Set(static_cast<double>(leadership.epoch()));
      if (!leading) {
        // A standby keeps a copy of the job catalog, reading each second
        // the jobs written since (and its connection warm with it).
        if (shared_store && absl::Now() >= next_goodput) {
          next_goodput = absl::Now() + absl::Seconds(1);
          if (absl::StatusOr<size_t> read = mirror.Refresh(); !read.ok()) {
            std::cerr << "loom-controller: standby: reading the catalog: "
                      << read.status().message() << std::endl;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      manager.Tick();
      // Every job's goodput buckets (controller/progress/goodput.h): each job that
      // ended, within a tick (its final figures); the jobs not ended, every
      // 5 s.
      auto record = [&](const loom::v1::Job& job) {
        absl::StatusOr<loom::v1::GetGoodputResponse> figures =
            job_service.goodput().Get(job, absl::Now());
        if (!figures.ok()) return;
        goodput_metrics.Record(job.id(), controller::GoodputBoard::FromResponse(*figures));
      };
      for (const std::string& id : manager.TakeRecentlyEnded()) {
        if (absl::StatusOr<loom::v1::Job> ended = manager.Get(id); ended.ok()) record(*ended);
      }
      if (absl::Now() >= next_goodput) {
        next_goodput = absl::Now() + absl::Seconds(5);
        for (const loom::v1::Job& job : manager.List(
                 {loom::v1::PENDING, loom::v1::SCHEDULED, loom::v1::RUNNING, loom::v1::PREEMPTED},
                 0)) {
          record(job);
        }
      }
      // Rank logs of jobs that ended more than --log_retention ago (or that
      // the controller no longer knows) go, once a minute.
      if (absl::Now() >= next_log_sweep) {
        next_log_sweep = absl::Now() + absl::Minutes(1);
        absl::Status swept = (*logs)->RemoveExpired([&](const std::string& job) {
          absl::StatusOr<std::optional<absl::Time>> ended = manager.EndedAt(job);
          return absl::IsNotFound(ended.status()) ||
                 (ended.ok() && ended->has_value() && **ended + log_retention <= absl::Now());
        });
        if (!swept.ok())
          std::cerr << "loom-controller: rank logs: " << swept.message() << std::endl;
      }
      controller::ControllerGauges gauges = manager.Gauges();
      auto& counts = gauges.jobs_by_state;
      for (int s = loom::v1::PENDING; s <= loom::v1::PREEMPTED; ++s) {
        auto state = static_cast<loom::v1::JobState>(s);
        jobs_gauge.Add({{"state", loom::v1::JobState_Name(state)}})
            .Set(counts.count(state) ? counts[state] : 0);
      }
      workers_gauge.Set(gauges.alive_workers);
      const controller::RecoveryTotals& totals = gauges.recovery;
      auto bump = [](metrics::Counter& c, int64_t total) {
        if (total > c.Value()) c.Increment(static_cast<double>(total) - c.Value());
      };
      bump(restarts_total, totals.restarts);
      bump(rollbacks_total, totals.rollbacks);
      bump(preemptions_total, totals.preemptions);
      bump(spikes_total, totals.spikes);
      bump(store_write_failures_total, gauges.store_write_failures);
      bump(illegal_transitions_total, gauges.illegal_transitions);
      bump(store_writes_total, (*store)->writes_committed());
      bump(store_transactions_total, (*store)->batches_committed());
      // An edited users file takes effect within a tick (revocation).
      if (absl::Status reload = (*access)->ReloadIfChanged(); !reload.ok()) {
        std::cerr << "loom-controller: users file: " << reload.message() << std::endl;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  int sig = 0;
  while (sigwait(&sigs, &sig) == 0 && sig == SIGHUP) {
    absl::StatusOr<scheduling::QueueConfig> queues = load_queues();
    if (!queues.ok()) {
      std::cerr << "loom-controller: SIGHUP: --queues not reloaded, keeping the running "
                   "configuration: "
                << queues.status().message() << std::endl;
      continue;
    }
    const size_t count = queues->queues.size();
    manager.SetQueueConfig(*std::move(queues));
    std::cerr << "loom-controller: SIGHUP: reloaded " << count << " queue(s) from "
              << (queues_file.empty() ? "the default configuration" : queues_file) << std::endl;
  }
  std::cerr << "loom-controller: signal " << sig << ", shutting down" << std::endl;
  shutting_down = true;
  stop = true;
  ticker.join();
  // A clean stop hands the lease over at once.
  if (elector != nullptr) elector->Stop();
  if (health_server) {
    health.SetServing(false);
    health_server->Shutdown();
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
