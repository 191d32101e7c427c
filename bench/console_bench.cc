// Loom Console against a big history: a real loom-controller whose store
// holds CONSOLE_JOBS finished jobs (default 10,000), one finished job of
// CONSOLE_STEPS steps (default 1,000,000, kept whole: the worst case of a
// series, as a running job of that length has) whose 64 ranks over two
// attempts logged CONSOLE_LOG_LINES lines (default 10,000,000), and a live
// job that simulated workers (bench/control_plane_fleet.h) train at 10
// steps a second. The store is filled before the controller starts, through
// the controller's own Store and LogStore classes, as a controller that ran
// those jobs would have left it. Then:
//   * the jobs page's request (GET /api/v1/jobs?page_size=200, as the page
//     asks, and filtered by state), timed from this process over loopback:
//     p50/p95 and reply size;
//   * the big job's series over HTTP as the page asks it, first right after
//     the controller started (read from the store by that request or by the
//     controller's warmer, whichever is first), then again;
//   * in Debian's Chromium (bench/console_bench.mjs, playwright-core): the
//     big job's page opened for the first time and again, the browser's own
//     time from navigation to the charts painted, and the series reply's
//     size;
//     the jobs page's time to its table; and the live job's page for
//     CONSOLE_LIVE_SECONDS (default 30): when each step showed, against the
//     time the simulated rank sent its report (the step's time_unix_ms);
//   * log search across the big job's ranks and attempts through
//     /api/v1/jobs/{id}/logs:search: a rare string, a line that occurs once,
//     and a common string (capped at 1,000 lines), median of ten each.
// The console is served over plain HTTP (--allow_plaintext): this measures
// the controller and the page, not TLS handshakes. The last line:
//   console: jobs p95 <ms>, chart paint <ms>, step to page p99 <ms>,
//            log search <ms> ratio=<worst figure / its target>
// (targets: 300 ms, 1,000 ms, 2,000 ms, 500 ms; ratio <= 1: all met). Exits
// 1 when a target is missed.
//
// Usage: loom_console_bench BIN_DIR SOURCE_DIR
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/control_plane_fleet.h"
#include "bench/control_plane_report.h"
#include "bench/controller_process.h"
#include "cli/local_cluster.h"
#include "common/file_util.h"
#include "common/formats/data.h"
#include "common/grpc_util.h"
#include "common/jobspec_parse.h"
#include "controller/logs/log_store.h"
#include "controller/service/access.h"
#include "controller/store/store.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "loom/v1/service.grpc.pb.h"
#include "tests/test_util.h"

namespace {

using Clock = std::chrono::steady_clock;
using loom::bench::ControllerProcess;
using loom::bench::Percentile;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  int64_t out = 0;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int Die(const std::string& why) {
  std::cerr << "console bench: " << why << std::endl;
  return 1;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string SpecYaml(const std::string& name, const std::string& data_dir, int64_t steps) {
  return absl::StrFormat(R"(name: %s
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data: {train: ["%s/train_*.bin"]}
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: %d, warmup_steps: 5}
batch: {global_batch: 8, micro_batch: 8}
resources: {workers: 1, ranks: 1}
seed: 7
)",
                         name, data_dir, steps);
}

// A finished job as a controller leaves it: its spec, history, summary and
// who submitted it.
loom::v1::Job FinishedJob(const loom::v1::JobSpec& spec, const std::string& id,
                          loom::v1::JobState end, int64_t created_ms, int64_t run_ms,
                          int64_t last_step, const std::string& user) {
  loom::v1::Job job;
  job.set_id(id);
  *job.mutable_spec() = spec;
  job.set_state(end);
  job.set_submitted_by(user);
  job.set_created_unix_ms(created_ms);
  job.set_updated_unix_ms(created_ms + run_ms + 10'000);
  job.set_reason(end == loom::v1::SUCCEEDED ? "all steps done"
                 : end == loom::v1::FAILED  ? "rank 0 exited with status 1"
                                            : "cancelled: by user '" + user + "'");
  const std::pair<loom::v1::JobState, int64_t> path[] = {{loom::v1::PENDING, 0},
                                                         {loom::v1::SCHEDULED, 2'000},
                                                         {loom::v1::RUNNING, 10'000},
                                                         {end, 10'000 + run_ms}};
  loom::v1::JobState from = loom::v1::JOB_STATE_UNSPECIFIED;
  for (const auto& [to, at] : path) {
    auto* t = job.add_history();
    t->set_from(from);
    t->set_to(to);
    t->set_time_unix_ms(created_ms + at);
    from = to;
  }
  auto* s = job.mutable_summary();
  s->set_last_step(last_step);
  s->set_first_loss(5.6);
  s->set_last_loss(2.0 + 3.0 / (1.0 + static_cast<double>(last_step) / 500.0));
  s->set_tokens_per_second(2048);
  s->set_last_tokens_per_second(2048);
  s->set_tokens_seen(last_step * 256);
  s->set_first_step_unix_ms(created_ms + 10'000);
  s->set_last_step_unix_ms(created_ms + 10'000 + run_ms);
  return job;
}

// Puts `count` finished jobs from `threads` threads (the store commits
// concurrent writes together, as it does for a busy controller).
absl::Status FillJobs(loom::controller::Store* store, const loom::v1::JobSpec& spec, int count,
                      int64_t now_ms) {
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  absl::Status first_error;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < count && !failed; i = next++) {
        static const char* const kKinds[] = {"sweep-lr", "ablate-heads", "baseline", "long-ctx",
                                             "data-mix"};
        loom::v1::JobSpec s = spec;
        const std::string name = absl::StrCat(kKinds[i % 5], "-", i / 5 % 400);
        s.set_name(name);
        s.set_seed(static_cast<uint64_t>(i));
        const loom::v1::JobState end = i % 20 == 0   ? loom::v1::FAILED
                                       : i % 20 == 1 ? loom::v1::CANCELLED
                                                     : loom::v1::SUCCEEDED;
        const int64_t created = now_ms - int64_t{40} * 24 * 3600 * 1000 + int64_t{i} * 300'000;
        loom::v1::Job job =
            FinishedJob(s, absl::StrCat(name, "-", i + 1), end, created, 60'000 + (i % 97) * 10'000,
                        1000 + i % 5000, absl::StrCat("user", i % 12));
        if (absl::Status st = store->PutJob(job, job.history_size()); !st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          first_error = st;
          failed = true;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return first_error;
}

// The big job's steps, in batches of 10,000: a decaying loss with noise
// and two spikes, validation every 1,000 steps, tokens/s and MFU.
absl::Status FillSteps(loom::controller::Store* store, const std::string& job, int64_t steps,
                       int64_t first_ms, int64_t run_ms) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0, 0.03);
  std::vector<loom::v1::StepMetrics> batch;
  for (int64_t step = 0; step <= steps; ++step) {
    loom::v1::StepMetrics m;
    m.set_step(step);
    double loss = 2.0 + 3.5 * std::exp(-static_cast<double>(step) / 80'000.0) + noise(rng);
    if (step >= 250'000 && step < 250'040) loss += 4.0;
    if (step >= 610'000 && step < 610'030) loss += 2.5;
    m.set_loss(loss);
    m.set_lr(3e-4);
    m.set_tokens_per_second(2048 + 40 * noise(rng));
    m.set_step_time_seconds(0.125);
    m.set_mfu(0.41 + noise(rng) / 10);
    m.set_time_unix_ms(first_ms + run_ms * step / std::max<int64_t>(1, steps));
    m.set_tokens_seen(step * 256);
    m.set_data_batch(step);
    m.set_total_steps(steps);
    if (step % 1000 == 0) {
      m.set_has_val_loss(true);
      m.set_val_loss(loss + 0.05);
    }
    batch.push_back(std::move(m));
    if (batch.size() == 10'000 || step == steps) {
      if (absl::Status s = store->AppendStepMetrics(job, batch); !s.ok()) return s;
      batch.clear();
    }
  }
  return absl::OkStatus();
}

constexpr char kRare[] = "NCCL WARN watchdog timeout";
constexpr char kOnce[] = "checkpoint 7f3a9c written to s3 bucket-zeta";

// The big job's logs: 64 ranks, two attempts, training lines with kRare at
// a dozen places and kOnce once, appended in 16 KiB pieces as a worker
// ships them.
absl::StatusOr<int64_t> FillLogs(loom::controller::Store* store, const std::string& job,
                                 int64_t lines) {
  auto opened = loom::controller::LogStore::Open(store, {int64_t{1} << 30});
  if (!opened.ok()) return opened.status();
  constexpr int kRanks = 64, kAttempts = 2;
  const int64_t per_log = lines / (kRanks * kAttempts);
  int64_t bytes = 0;
  std::mt19937_64 rng(5);
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    for (int rank = 0; rank < kRanks; ++rank) {
      std::string log;
      log.reserve(static_cast<size_t>(per_log) * 80);
      for (int64_t i = 0; i < per_log; ++i) {
        if (i == per_log / 2 && rank % 11 == attempt) {
          absl::StrAppend(&log, "[rank ", rank, "] step ", i, " ", kRare, " after 600000 ms\n");
        } else if (i == per_log / 3 && rank == 5 && attempt == 1) {
          absl::StrAppend(&log, "[rank 5] ", kOnce, "\n");
        } else {
          absl::StrAppend(&log, "[rank ", rank, "] step ", i, " loss ",
                          absl::StrFormat("%.4f", 2.0 + static_cast<double>(rng() % 10000) / 1e4),
                          " lr 3.0e-04 tok/s ", 10000 + rng() % 5000, " grad_norm ",
                          absl::StrFormat("%.3f", static_cast<double>(rng() % 2000) / 1000), "\n");
        }
      }
      constexpr size_t kAppend = 16 << 10;
      for (size_t at = 0; at < log.size(); at += kAppend) {
        auto end = (*opened)->Append({job, rank, attempt}, static_cast<int64_t>(at),
                                     absl::string_view(log).substr(at, kAppend),
                                     at + kAppend >= log.size());
        if (!end.ok()) return end.status();
      }
      bytes += static_cast<int64_t>(log.size());
    }
  }
  return bytes;
}

struct Timed {
  std::vector<double> ms;
  size_t bytes = 0;
  int errors = 0;
  std::string first_error;
};

// GETs `path` `n` times over one keep-alive connection.
Timed TimeGets(httplib::Client& http, const std::string& path, int n) {
  Timed out;
  for (int i = 0; i < n; ++i) {
    const auto t = Clock::now();
    auto res = http.Get(path.c_str());
    out.ms.push_back(SecondsSince(t) * 1000);
    if (!res || res->status != 200) {
      if (out.errors++ == 0) {
        out.first_error = res ? absl::StrCat(res->status, " ", res->body.substr(0, 300))
                              : httplib::to_string(res.error());
      }
      continue;
    }
    out.bytes = res->body.size();
  }
  std::sort(out.ms.begin(), out.ms.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Die("usage: loom_console_bench BIN_DIR SOURCE_DIR");
  const std::string bin = argv[1], source = argv[2];
  const int jobs = static_cast<int>(EnvInt("CONSOLE_JOBS", 10'000));
  const int64_t steps = EnvInt("CONSOLE_STEPS", 1'000'000);
  const int64_t log_lines = EnvInt("CONSOLE_LOG_LINES", 10'000'000);
  const int live_s = static_cast<int>(EnvInt("CONSOLE_LIVE_SECONDS", 30));
  const char* tools_env = std::getenv("LOOM_CONSOLE_TOOLS_DIR");
  const char* home = std::getenv("HOME");
  const std::string tools = tools_env != nullptr
                                ? tools_env
                                : std::string(home ? home : "/root") + "/.cache/loom/console-tests";
  if (!std::filesystem::exists(tools + "/node_modules/playwright-core/index.mjs")) {
    return Die("no playwright-core under " + tools + ": run ./scripts/install-deploy-deps.sh");
  }
  const std::string dir = loom::testing::MakeTempDir("loom_console_bench");
  std::cout << absl::StrFormat(
      "console bench: %d jobs, a %d-step job with %d log lines, a live job; data in %s\n", jobs,
      steps, log_lines, dir);

  // Credentials and a data shard (the live job's spec must name data that
  // exists; the simulated workers read none).
  if (auto made = loom::MakeDirs(dir + "/data", 0700); !made.ok()) return Die(made.ToString());
  std::vector<uint16_t> shard(1 << 16, 7);
  if (auto s = loom::engine::WriteShard(dir + "/data/train_000000.bin", shard); !s.ok()) {
    return Die(s.ToString());
  }
  auto token = loom::GenerateToken();
  auto worker_token = loom::GenerateToken();
  if (!token.ok() || !worker_token.ok()) return Die("cannot generate tokens");
  if (auto s = loom::WritePrivateFile(dir + "/worker-token", *worker_token + "\n"); !s.ok()) {
    return Die(s.ToString());
  }
  if (auto s = loom::WritePrivateFile(
          dir + "/users",
          loom::controller::UsersFileLine("bench", loom::controller::Role::kAdmin, *token));
      !s.ok()) {
    return Die(s.ToString());
  }

  // The history, written before the controller starts.
  const int64_t now_ms = NowMs();
  auto spec = loom::ParseJobSpec(SpecYaml("x", dir + "/data", 5000));
  if (!spec.ok()) return Die(spec.status().ToString());
  const std::string big = absl::StrCat("pretrain-1b-", jobs + 1);
  if (auto made = loom::MakeDirs(dir + "/controller", 0700); !made.ok()) {
    return Die(made.ToString());
  }
  {
    auto store = loom::controller::Store::Open(dir + "/controller");
    if (!store.ok()) return Die(store.status().ToString());
    auto t = Clock::now();
    if (absl::Status s = FillJobs(store->get(), *spec, jobs, now_ms); !s.ok()) {
      return Die(s.ToString());
    }
    const double jobs_s = SecondsSince(t);
    loom::v1::JobSpec big_spec = *spec;
    big_spec.set_name("pretrain-1b");
    big_spec.mutable_schedule()->set_total_steps(steps);
    const int64_t run_ms = int64_t{30} * 24 * 3600 * 1000;
    const int64_t big_created = now_ms - run_ms - 3'600'000;
    loom::v1::Job big_job =
        FinishedJob(big_spec, big, loom::v1::SUCCEEDED, big_created, run_ms, steps, "user0");
    for (int64_t at : {int64_t{250'000}, int64_t{610'000}}) {
      auto* spike = big_job.add_events();
      spike->set_kind(loom::v1::RecoveryEvent::SPIKE);
      spike->set_step(at);
      spike->set_time_unix_ms(big_created + run_ms * at / steps);
      auto* rollback = big_job.add_events();
      rollback->set_kind(loom::v1::RecoveryEvent::ROLLBACK);
      rollback->set_step(at);
      rollback->set_time_unix_ms(big_created + run_ms * at / steps + 1000);
    }
    if (absl::Status s = (*store)->PutJob(big_job, big_job.history_size()); !s.ok()) {
      return Die(s.ToString());
    }
    t = Clock::now();
    if (absl::Status s = FillSteps(store->get(), big, steps, big_created + 10'000, run_ms);
        !s.ok()) {
      return Die(s.ToString());
    }
    const double steps_s = SecondsSince(t);
    t = Clock::now();
    auto log_bytes = FillLogs(store->get(), big, log_lines);
    if (!log_bytes.ok()) return Die(log_bytes.status().ToString());
    std::cout << absl::StrFormat(
        "filled: %d jobs in %.1f s, %d steps in %.1f s, %d log lines (%.0f MB) in %.1f s; "
        "store %.0f MB\n",
        jobs, jobs_s, steps + 1, steps_s, log_lines, *log_bytes / 1e6, SecondsSince(t),
        std::filesystem::file_size(dir + "/controller/loom.db") / 1e6);
  }

  // The controller, on that store, with its default retention and
  // thinning (a job loaded finished is not thinned again).
  const std::string log = dir + "/controller.log";
  auto controller = ControllerProcess::Start(
      {bin + "/loom-controller", "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
       "--data_dir=" + dir + "/controller", "--users_file=" + dir + "/users",
       "--worker_token_file=" + dir + "/worker-token", "--allow_plaintext",
       "--ready_file=" + dir + "/controller.json", "--console_port=0", "--data_root=" + dir},
      log, nullptr);
  if (!controller.ok()) return Die(controller.status().ToString());
  const auto started = Clock::now();
  absl::StatusOr<loom::cli::DaemonInfo> info =
      (*controller)->WaitReady(dir + "/controller.json", 120);
  if (!info.ok() || info->console_url.empty()) return Die("the controller did not start; " + log);
  std::cout << absl::StrFormat("controller: serving after %.1f s, console %s\n",
                               SecondsSince(started), info->console_url);
  const std::string console = info->console_url;
  httplib::Client http(console);
  http.set_keep_alive(true);
  http.set_read_timeout(60, 0);
  http.set_default_headers({{"Authorization", "Bearer " + *token}});
  // The big job's series at once, as the page asks it (1,280 buckets): read
  // from the store by this request, or by the controller's warmer (it reads
  // the longest jobs ahead as the controller starts), whichever is first.
  const std::string series_path =
      absl::StrCat("/api/v1/jobs/", big,
                   "/series?buckets=1280&series=loss&series=val_loss&series=tokens_per_second"
                   "&series=mfu");
  Timed first_series = TimeGets(http, series_path, 1);
  if (first_series.errors > 0) return Die("series: " + first_series.first_error);
  Timed next_series = TimeGets(http, series_path, 20);
  std::cout << absl::StrFormat(
      "the %d-step job's series over HTTP: the first request after the start %.0f ms, the "
      "next 20 p50 %.1f ms (%.0f KB)\n",
      steps, first_series.ms[0], Percentile(next_series.ms, 0.5), next_series.bytes / 1e3);

  // The live job, on four simulated workers.
  loom::bench::FleetOptions fleet_options;
  fleet_options.address = info->grpc_address;
  fleet_options.token = *worker_token;
  fleet_options.watch_token = *token;
  fleet_options.workers = 4;
  fleet_options.queues = 1;
  fleet_options.channels = 1;
  loom::bench::Fleet fleet(fleet_options);
  fleet.Start();
  auto stub = loom::v1::JobService::NewStub(
      grpc::CreateChannel(info->grpc_address, grpc::InsecureChannelCredentials()));
  auto context = [&] {
    auto ctx = std::make_unique<grpc::ClientContext>();
    loom::AttachToken(ctx.get(), *token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  };
  auto live_spec = loom::ParseJobSpec(SpecYaml("live", dir + "/data", 10'000'000));
  if (!live_spec.ok()) return Die(live_spec.status().ToString());
  loom::v1::SubmitJobRequest submit;
  *submit.mutable_spec() = *live_spec;
  loom::v1::SubmitJobResponse submitted;
  if (grpc::Status s = stub->SubmitJob(context().get(), submit, &submitted); !s.ok()) {
    return Die("SubmitJob: " + s.error_message());
  }
  const std::string live = submitted.job().id();
  for (const auto t = Clock::now(); SecondsSince(t) < 60;) {
    loom::v1::GetJobRequest get;
    get.set_job_id(live);
    loom::v1::Job job;
    if (stub->GetJob(context().get(), get, &job).ok() && job.summary().last_step() >= 10) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }

  // The jobs page's request, as the page asks it.
  Timed jobs_page = TimeGets(http, "/api/v1/jobs?page_size=200", 200);
  Timed jobs_failed = TimeGets(http, "/api/v1/jobs?page_size=200&states=FAILED", 50);
  for (const Timed* t : {&jobs_page, &jobs_failed}) {
    if (t->errors > 0) return Die("jobs page: " + t->first_error);
  }
  const double jobs_p95 = Percentile(jobs_page.ms, 0.95);
  std::cout << absl::StrFormat(
      "jobs page (GET /api/v1/jobs?page_size=200 of %d jobs, 200 times): p50 %.1f ms, p95 %.1f "
      "ms, max %.1f ms, %.0f KB; FAILED only: p95 %.1f ms, %.0f KB\n",
      jobs + 2, Percentile(jobs_page.ms, 0.5), jobs_p95, jobs_page.ms.back(), jobs_page.bytes / 1e3,
      Percentile(jobs_failed.ms, 0.95), jobs_failed.bytes / 1e3);

  // The browser: the big job's page cold then warm, the jobs page, the live
  // job's page.
  const std::string out_json = dir + "/browser.json";
  auto browser = loom::testing::RunCommand(absl::StrCat(
      "LOOM_CONSOLE_TOOLS=", loom::testing::ShellQuote(tools), " LOOM_CONSOLE_URL=",
      loom::testing::ShellQuote(console), " LOOM_TOKEN=", loom::testing::ShellQuote(*token),
      " LOOM_BIG_JOB=", big, " LOOM_LIVE_JOB=", live, " LOOM_LIVE_SECONDS=", live_s,
      " LOOM_OUT=", loom::testing::ShellQuote(out_json), " timeout 300 node ", source,
      "/bench/console_bench.mjs"));
  std::cout << browser.out;
  if (browser.exit_code != 0) return Die("the browser run failed: " + browser.err);
  auto result_text = loom::ReadFile(out_json);
  if (!result_text.ok()) return Die(result_text.status().ToString());
  google::protobuf::Struct result;
  if (!google::protobuf::util::JsonStringToMessage(*result_text, &result).ok()) {
    return Die("cannot parse " + out_json);
  }
  const auto& f = result.fields();
  auto number = [&](const std::string& key) {
    auto it = f.find(key);
    return it == f.end() ? -1.0 : it->second.number_value();
  };
  const double cold_ms = number("big_cold_ms"), warm_ms = number("big_warm_max_ms");
  const double series_bytes = number("series_bytes");
  std::cout << absl::StrFormat(
      "the %d-step job's page in Chromium (navigation to charts painted, the browser's "
      "clock): first open %.0f ms, then %.0f ms (worst of 3); first contentful paint %.0f ms; "
      "series reply %.0f KB (%d buckets)\n",
      steps, cold_ms, warm_ms, number("big_fcp_ms"), series_bytes / 1e3,
      static_cast<int>(number("series_buckets")));
  std::cout << absl::StrFormat("jobs page in Chromium: navigation to the table drawn %.0f ms\n",
                               number("jobs_table_ms"));

  // When each step showed on the live page, against when its report left
  // the simulated rank.
  loom::v1::GetStepMetricsRequest get_steps;
  get_steps.set_job_id(live);
  loom::v1::GetStepMetricsResponse live_steps;
  if (grpc::Status s = stub->GetStepMetrics(context().get(), get_steps, &live_steps); !s.ok()) {
    return Die("GetStepMetrics: " + s.error_message());
  }
  std::map<int64_t, int64_t> reported;
  for (const auto& m : live_steps.steps()) reported[m.step()] = m.time_unix_ms();
  std::vector<double> delays;
  auto shown = f.find("live_shown");
  if (shown != f.end()) {
    for (const auto& pair : shown->second.list_value().values()) {
      const auto& v = pair.list_value().values();
      if (v.size() != 2) continue;
      auto it = reported.find(static_cast<int64_t>(v[0].number_value()));
      if (it != reported.end()) delays.push_back(v[1].number_value() - it->second);
    }
  }
  if (delays.size() < 10) return Die("the live page showed fewer than 10 steps");
  std::sort(delays.begin(), delays.end());
  const double step_p99 = Percentile(delays, 0.99);
  std::cout << absl::StrFormat(
      "live job: %d step changes seen on its page in %d s; report to page p50 %.0f ms, p99 %.0f "
      "ms, max %.0f ms (system clock, ms)\n",
      delays.size(), live_s, Percentile(delays, 0.5), step_p99, delays.back());

  // Log search through the console's API.
  auto search = [&](const std::string& pattern) {
    return TimeGets(http,
                    absl::StrCat("/api/v1/jobs/", big, "/logs:search?pattern=",
                                 httplib::detail::encode_query_param(pattern)),
                    10);
  };
  Timed rare = search(kRare), once = search(kOnce), common = search("grad_norm 1.5");
  for (const Timed* t : {&rare, &once, &common}) {
    if (t->errors > 0) return Die("log search: " + t->first_error);
  }
  const double search_ms =
      std::max({Percentile(rare.ms, 0.5), Percentile(once.ms, 0.5), Percentile(common.ms, 0.5)});
  std::cout << absl::StrFormat(
      "log search over %d lines (median of 10): rare %.1f ms (%.0f KB), once %.1f ms, common "
      "(1,000 lines) %.1f ms (%.0f KB)\n",
      log_lines, Percentile(rare.ms, 0.5), rare.bytes / 1e3, Percentile(once.ms, 0.5),
      Percentile(common.ms, 0.5), common.bytes / 1e3);

  fleet.Stop(std::chrono::seconds(10));
  (*controller)->Stop(std::chrono::seconds(10));
  const double chart_ms = std::max(cold_ms, warm_ms);
  const double ratio = std::max({jobs_p95 / 300, chart_ms / 1000, step_p99 / 2000, search_ms / 500,
                                 jobs_page.bytes / 1e6, series_bytes / 500e3});
  std::cout << absl::StrFormat(
      "console: jobs p95 %.1f ms, chart paint %.0f ms, step to page p99 %.0f ms, log search %.1f "
      "ms ratio=%.3f\n",
      jobs_p95, chart_ms, step_p99, search_ms, ratio);
  if (ratio > 1) return 1;
  std::filesystem::remove_all(dir);
  return 0;
}
