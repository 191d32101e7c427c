// The object-store tier against the tool people would use instead, and its
// cost to training (./bench/run.sh checkpoint-remote).
//
// Throughput, side by side against the same store: the newest checkpoint of
// the run below goes up with Loom's upload (UploadCheckpoint: 16 MiB
// multipart parts, two files at once, each file's CRC-32C checked and its
// SHA-256 taken on the way; four parts in flight) and with `aws s3 cp
// --recursive` (Debian's awscli, four requests at once, its other defaults:
// 8 MiB parts), three times each, then comes down with Loom's
// restore (DownloadCheckpoint: every object checked against the manifest's
// SHA-256, each file fsynced and committed by a rename) and with `aws s3 cp
// --recursive` (no check, no fsync). Medians; up and down are Loom's
// bytes/s over awscli's.
//
// Cost to training: a GPT trains through
// loom::engine::Train with asynchronous checkpoints twice in one run, side
// by side, on the same data and seed:
//   local:   checkpoints to the directory alone;
//   remote:  the same, and each committed checkpoint handed to the worker's
//            CheckpointUploader (its low-priority thread, multipart parts of
//            16 MiB, two files at once) for Ceph's RADOS Gateway on loopback
//            (a one-monitor, one-manager, one-OSD cluster started here:
//            common/object_store/s3_test_server.h).
// Reported: the median step time of each run (steps 2.. ; step 1 warms up),
// the remote run's steps that overlapped an upload against its others, the
// save stall of each, and the upload throughput (bytes / upload seconds).
// The gateway and its OSD run on the same cores as training here, so this
// is a worst case: on a cluster the store is elsewhere, and only the
// upload's reading, checksumming and sending stay on the node.
//
// The store's daemons run at nice 19 (REMOTE_TIER_STORE_NICE), standing in
// for a store on other machines.
//
// Whose CPUs: by default training, the upload and the store share every
// CPU (the worst case: on two cores the store's daemons take a share of
// training's). REMOTE_TIER_UPLOAD_CPUS=LIST gives the upload
// (CheckpointUploader::Options::cpus, the worker's --upload_cpus) and the
// store those CPUs, and training the others with as many LibTorch threads:
// what the upload costs training when the node gives it cores the ranks do
// not use. (Pinned, the client side of the throughput comparison has those
// fewer cores too, awscli as much as Loom.)
//
// Usage: loom_remote_tier_bench DIR [n_layer] [d_model] [steps] [interval] [threads]
//   defaults: 6 layers, d_model 512 (~45M parameters, ~0.5 GB checkpoints),
//   12 steps, a checkpoint every 3 steps, 2 LibTorch threads. awscli:
//   /usr/bin/aws, or $AWSCLI.
// Last line:
//   checkpoint-remote: up <x> of awscli, down <y>, stall <z>% ratio=<min(x,y)/0.8>
// where z is the training stall with uploads running, as the checkpoint
// bench states it: the median time a save blocked training (its
// stall_seconds) over the median step, of the checkpoints saved while an
// upload ran. The line before it gives the other cost, the steps' slowdown
// beside the upload (and here the store): how much longer the steps that
// overlapped an upload took than the directory-only run's.
#include <stdlib.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/checkpoint_bench_setup.h"
#include "common/cpu_list.h"
#include "common/object_store/remote_checkpoints.h"
#include "common/object_store/s3_test_server.h"
#include "worker/checkpoint_uploader.h"
#include "worker/engine/gpt.h"
#include "worker/engine/trainer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Run {
  std::map<int64_t, double> step_seconds;
  std::map<int64_t, Clock::time_point> step_end;
  std::vector<double> stalls;
  std::map<int64_t, double> stall_at;  // by the step the save followed
  // Remote: when each upload was handed over and when it was reported.
  std::vector<std::pair<Clock::time_point, Clock::time_point>> uploads;
  std::vector<loom::v1::CheckpointInfo> outcomes;
  double seconds = 0;
};

bool TrainOnce(loom::engine::TrainerConfig config, const std::string& dir,
               loom::worker::CheckpointUploader* uploader, const std::string& remote, Run* run) {
  config.checkpoint_dir = dir;
  loom::engine::TrainerCallbacks callbacks;
  callbacks.on_step = [&](const loom::v1::StepMetrics& r) {
    run->step_end[r.step()] = Clock::now();
    run->step_seconds[r.step()] = r.step_time_seconds();
  };
  callbacks.on_checkpoint = [&](const loom::engine::CheckpointReport& r) {
    if (r.step != config.schedule.total_steps) {
      run->stalls.push_back(r.stall_seconds);
      run->stall_at[r.step] = r.stall_seconds;
    }
    std::printf("  checkpoint %lld: %.3f GB, write %.2f s, stall %.4f s\n",
                static_cast<long long>(r.step), r.bytes / 1e9, r.write_seconds, r.stall_seconds);
    std::fflush(stdout);
    if (uploader == nullptr) return;
    loom::v1::CheckpointInfo c;
    c.set_step(r.step);
    c.set_path(r.path);
    c.set_bytes(r.bytes);
    uploader->Enqueue("bench", 0, c, {remote});
  };
  const Clock::time_point start = Clock::now();
  absl::StatusOr<loom::engine::TrainResult> result =
      loom::engine::Train(config, nullptr, callbacks);
  if (!result.ok()) {
    std::fprintf(stderr, "training failed: %s\n", result.status().ToString().c_str());
    return false;
  }
  if (uploader != nullptr) uploader->WaitIdle();
  run->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return true;
}

// Seconds `command` took, or -1 if it failed three times. A one-OSD
// gateway sharing two cores drops connections under awscli's ten parts at
// once now and then; a failed try is said and tried again (awscli resumes
// nothing: the whole transfer is timed again).
double TimeCommand(const std::string& command) {
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const Clock::time_point start = Clock::now();
    const int rc = std::system(command.c_str());
    if (rc == 0) return std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("  awscli failed (status %d, try %d of 3): %s\n", rc, attempt, command.c_str());
    std::fflush(stdout);
  }
  return -1;
}

struct Throughput {
  double loom_up = 0, aws_up = 0, loom_down = 0, aws_down = 0;  // bytes / s
};

// Loom's upload and restore of the checkpoint directory `checkpoint` against
// awscli's `s3 cp --recursive`, `reps` times each, medians.
std::optional<Throughput> CompareWithAwscli(const loom::object_store::S3TestServer& store,
                                            const std::string& checkpoint, const std::string& work,
                                            int reps) {
  const char* aws_env = std::getenv("AWSCLI");
  const std::string aws = aws_env != nullptr ? aws_env : "/usr/bin/aws";
  if (!fs::exists(aws)) {
    std::fprintf(stderr, "%s: no awscli (scripts/install-deploy-deps.sh installs Debian's)\n",
                 aws.c_str());
    return std::nullopt;
  }
  // awscli's own configuration for this store: path-style addressing, the
  // test credentials (in the environment, not on a command line).
  const std::string config_file = work + "/aws-config";
  std::FILE* f = std::fopen(config_file.c_str(), "w");
  if (f == nullptr) return std::nullopt;
  // Four requests at once, as Loom's upload has parts in flight
  // (TransferOptions::parts_in_flight): awscli's default of ten overwhelms
  // the one-OSD gateway on these two cores (it stops answering for minutes).
  std::fprintf(f,
               "[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n"
               "  max_concurrent_requests = 4\n");
  std::fclose(f);
  setenv("AWS_CONFIG_FILE", config_file.c_str(), 1);
  setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null", 1);
  setenv("AWS_ACCESS_KEY_ID", store.access_key().c_str(), 1);
  setenv("AWS_SECRET_ACCESS_KEY", store.secret_key().c_str(), 1);
  unsetenv("AWS_PROFILE");
  const std::string cli = absl::StrCat(aws, " --endpoint-url ", store.endpoint(),
                                       " s3 cp --recursive --only-show-errors ");
  uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(checkpoint)) bytes += fs::file_size(e.path());
  const std::string step = fs::path(checkpoint).filename().string();
  loom::object_store::S3Client client(store.Config());
  // What a measurement no longer needs is deleted. The gateway frees the
  // space only at its garbage collection, later, so run.sh gives the OSD a
  // file large enough for all of it (OSD_GIB).
  auto remove_prefix = [&](const std::string& prefix) {
    auto objects = client.ListObjects("bench", prefix);
    if (!objects.ok()) return;
    for (const auto& o : *objects) (void)client.DeleteObject("bench", o.key);
  };
  remove_prefix("runs/");  // the training run's uploads
  std::vector<double> loom_up, aws_up, loom_down, aws_down;
  for (int i = 0; i < reps; ++i) {
    loom::object_store::S3Location at{"bench", absl::StrCat("cmp/loom-", i, "/")};
    auto up = loom::object_store::UploadCheckpoint(client, at, checkpoint);
    if (!up.ok()) {
      std::fprintf(stderr, "loom upload: %s\n", up.status().ToString().c_str());
      return std::nullopt;
    }
    loom_up.push_back(bytes / up->seconds);
    const double t =
        TimeCommand(absl::StrCat(cli, checkpoint, " s3://bench/cmp/aws-", i, "/", step, "/"));
    if (t <= 0) return std::nullopt;
    aws_up.push_back(bytes / t);
    std::printf("  up %d: Loom %.3f GB/s, awscli %.3f GB/s\n", i, loom_up.back() / 1e9,
                aws_up.back() / 1e9);
    std::fflush(stdout);
    if (i > 0) {  // the first pair stays for the downloads
      remove_prefix(absl::StrCat("cmp/loom-", i, "/"));
      remove_prefix(absl::StrCat("cmp/aws-", i, "/"));
    }
  }
  auto listed = loom::object_store::ListRemoteCheckpoints(
      client, loom::object_store::S3Location{"bench", "cmp/loom-0/"});
  if (!listed.ok() || listed->empty()) return std::nullopt;
  for (int i = 0; i < reps; ++i) {
    const std::string loom_dir = absl::StrCat(work, "/down-loom-", i);
    fs::create_directories(loom_dir);
    auto down = loom::object_store::DownloadCheckpoint(client, listed->front(), loom_dir);
    if (!down.ok()) {
      std::fprintf(stderr, "loom restore: %s\n", down.status().ToString().c_str());
      return std::nullopt;
    }
    loom_down.push_back(bytes / down->seconds);
    const std::string aws_dir = absl::StrCat(work, "/down-aws-", i);
    const double t = TimeCommand(absl::StrCat(cli, "s3://bench/cmp/aws-0/", step, "/ ", aws_dir));
    if (t <= 0) return std::nullopt;
    aws_down.push_back(bytes / t);
    std::printf("  down %d: Loom %.3f GB/s (checked, fsynced), awscli %.3f GB/s\n", i,
                loom_down.back() / 1e9, aws_down.back() / 1e9);
    std::fflush(stdout);
    fs::remove_all(loom_dir);
    fs::remove_all(aws_dir);
  }
  return Throughput{Median(loom_up), Median(aws_up), Median(loom_down), Median(aws_down)};
}

}  // namespace

int main(int argc, char** argv) {
  // The upload's CPUs (and the store's), and training's: the rest. Set
  // before LibTorch starts its threads, which inherit the main thread's.
  std::vector<int> upload_cpus;
  std::vector<int> train_cpus = loom::AllowedCpus();
  const char* upload_env = std::getenv("REMOTE_TIER_UPLOAD_CPUS");
  const std::string upload_spec = upload_env != nullptr ? upload_env : "";
  if (!upload_spec.empty() && upload_spec != "any") {
    absl::StatusOr<std::vector<int>> list = loom::ParseCpuList(upload_spec);
    if (!list.ok()) {
      std::fprintf(stderr, "REMOTE_TIER_UPLOAD_CPUS: %s\n", list.status().ToString().c_str());
      return 2;
    }
    upload_cpus = *list;
    std::vector<int> rest;
    for (int c : train_cpus) {
      if (std::find(upload_cpus.begin(), upload_cpus.end(), c) == upload_cpus.end()) {
        rest.push_back(c);
      }
    }
    if (!upload_cpus.empty() && !rest.empty()) {
      train_cpus = rest;
      if (absl::Status pinned = loom::PinThisThread(train_cpus); !pinned.ok()) {
        std::fprintf(stderr, "%s\n", pinned.ToString().c_str());
        return 2;
      }
    } else {
      upload_cpus.clear();
    }
  }
  loom::bench::CheckpointBenchDefaults defaults;
  defaults.n_layer = 6;
  defaults.d_model = 512;
  defaults.steps = 12;
  defaults.interval = 3;
  defaults.min_steps = 4;
  if (!upload_cpus.empty()) defaults.threads = static_cast<int>(train_cpus.size());
  std::optional<loom::bench::CheckpointBenchSetup> setup =
      loom::bench::SetUpCheckpointBench(argc, argv, "loom_remote_tier_bench", defaults);
  if (!setup) return 2;
  loom::engine::TrainerConfig config = setup->config;
  const int64_t steps = setup->steps, interval = setup->interval;
  const int threads = setup->threads;
  const std::string work = setup->work;
  config.keep_checkpoints = 1000;  // every checkpoint stays for its upload

  // The store's daemons at the lowest CPU priority: on a cluster the store
  // is on other machines, and what is measured here is what the upload
  // itself costs the node (reading, checksumming, sending). They still
  // share the two cores, so this remains a pessimistic figure.
  const int store_nice = static_cast<int>(std::strtol(
      std::getenv("REMOTE_TIER_STORE_NICE") ? std::getenv("REMOTE_TIER_STORE_NICE") : "19",
      nullptr, 10));
  loom::object_store::S3TestServer::Options store_options;
  store_options.nice = store_nice;
  if (!upload_cpus.empty()) {
    store_options.prefix = {"taskset", "-c", loom::FormatCpuList(upload_cpus)};
  }
  auto store = loom::object_store::S3TestServer::Start("bench", store_options);
  if (!store.ok()) {
    std::fprintf(stderr, "object store: %s\n", store.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "remote-tier bench: GPT n_layer=%d d_model=%d: %.1fM parameters; %lld steps, a "
      "checkpoint every %lld steps, %d threads; store: RADOS Gateway at %s\n",
      config.model.n_layer, config.model.d_model,
      loom::engine::GptParameterCount(config.model) / 1e6, static_cast<long long>(steps),
      static_cast<long long>(interval), threads, (*store)->endpoint().c_str());
  if (upload_cpus.empty()) {
    std::printf("CPUs: training, the upload and the store share every CPU\n");
  } else {
    std::printf("CPUs: training on %s; the upload and the store on %s\n",
                loom::FormatCpuList(train_cpus).c_str(), loom::FormatCpuList(upload_cpus).c_str());
  }
  std::fflush(stdout);

  Run local, remote;
  std::printf("local tier only:\n");
  if (!TrainOnce(config, work + "/local", nullptr, "", &local)) return 1;
  fs::remove_all(work + "/local");

  loom::worker::CheckpointUploader::Options options;
  options.uploader = "the bench";
  options.cpus = upload_cpus;
  const loom::object_store::S3Config store_config = (*store)->Config();
  options.config = [store_config] { return store_config; };
  std::mutex mu;
  std::map<int64_t, Clock::time_point> reported;
  loom::worker::CheckpointUploader uploader(
      options, [&](const std::string&, int64_t, const loom::v1::CheckpointInfo& c) {
        std::lock_guard<std::mutex> lock(mu);
        remote.outcomes.push_back(c);
        reported[c.step()] = Clock::now();
        std::printf("  uploaded %lld: %s, %.3f GB in %.2f s\n", static_cast<long long>(c.step()),
                    c.status().c_str(), c.bytes() / 1e9, c.upload_seconds());
        std::fflush(stdout);
      });
  std::printf("local tier and the object store:\n");
  if (!TrainOnce(config, work + "/remote", &uploader, "s3://bench/runs/bench", &remote)) return 1;
  // The run's final checkpoint, up and down, Loom's and awscli's ways.
  std::printf("throughput against aws s3 cp (the run's final checkpoint, 3 times each):\n");
  const std::optional<Throughput> cmp =
      CompareWithAwscli(**store, loom::engine::CheckpointPath(work + "/remote", steps), work, 3);
  fs::remove_all(work);
  if (!cmp.has_value()) return 1;

  // Steps of the remote run that overlapped an upload (its report's time
  // less its upload_seconds, to the report).
  std::vector<double> quiet, busy, local_steps;
  for (int64_t s = 2; s <= steps; ++s) local_steps.push_back(local.step_seconds[s]);
  int64_t failed = 0;
  uint64_t bytes = 0;
  double upload_seconds = 0;
  for (const loom::v1::CheckpointInfo& c : remote.outcomes) {
    if (c.status() != "uploaded") {
      ++failed;
      continue;
    }
    bytes += c.bytes();
    upload_seconds += c.upload_seconds();
    const auto end = reported[c.step()];
    const auto begin = end - std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(c.upload_seconds()));
    remote.uploads.push_back({begin, end});
  }
  for (int64_t s = 2; s <= steps; ++s) {
    const Clock::time_point end = remote.step_end[s];
    const Clock::time_point begin =
        end - std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(remote.step_seconds[s]));
    bool overlapped = false;
    for (const auto& [ub, ue] : remote.uploads) overlapped = overlapped || (begin < ue && end > ub);
    (overlapped ? busy : quiet).push_back(remote.step_seconds[s]);
  }
  // The saves made while an upload ran (at the end of the step they follow).
  std::vector<double> busy_stalls;
  for (const auto& [step, stall] : remote.stall_at) {
    const Clock::time_point at = remote.step_end[step];
    bool during = false;
    for (const auto& [ub, ue] : remote.uploads) during = during || (at >= ub && at <= ue);
    if (during) busy_stalls.push_back(stall);
  }
  const double local_step = Median(local_steps);
  const double remote_step = Median(busy.empty() ? quiet : busy);
  const double stall_pct =
      remote_step > 0 && !busy_stalls.empty() ? 100.0 * Median(busy_stalls) / remote_step : 0.0;
  const double slowdown_pct = local_step > 0 ? 100.0 * (remote_step / local_step - 1) : 0.0;
  std::printf("local only: median step %.3f s over %zu steps, median stall %.4f s, %.1f s in all\n",
              local_step, local_steps.size(), Median(local.stalls), local.seconds);
  std::printf(
      "with uploads: %zu steps overlapped an upload, median %.3f s; %zu did not, median "
      "%.3f s; median stall %.4f s; %.1f s in all (the last upload included)\n",
      busy.size(), Median(busy), quiet.size(), Median(quiet), Median(remote.stalls),
      remote.seconds);
  const double rate = upload_seconds > 0 ? bytes / upload_seconds : 0;
  std::printf("uploads: %zu checkpoints, %.3f GB, %.1f s uploading = %.3f GB/s; %lld failed\n",
              remote.outcomes.size() - failed, bytes / 1e9, upload_seconds, rate / 1e9,
              static_cast<long long>(failed));
  const double up = cmp->aws_up > 0 ? cmp->loom_up / cmp->aws_up : 0;
  const double down = cmp->aws_down > 0 ? cmp->loom_down / cmp->aws_down : 0;
  std::printf(
      "transfer medians: up Loom %.3f GB/s, awscli %.3f GB/s; down Loom %.3f GB/s, awscli %.3f "
      "GB/s\n",
      cmp->loom_up / 1e9, cmp->aws_up / 1e9, cmp->loom_down / 1e9, cmp->aws_down / 1e9);
  std::printf(
      "saves while an upload ran: %zu, median stall %.4f s = %.3f%% of a step; steps beside an "
      "upload %+.1f%% against the directory-only run's (%s)\n",
      busy_stalls.size(), Median(busy_stalls), stall_pct, slowdown_pct,
      upload_cpus.empty() ? "training, the upload and the store on the same CPUs"
                          : "the upload and the store on CPUs of their own");
  std::printf("checkpoint-remote: up %.2f of awscli, down %.2f, stall %.3f%% ratio=%.2f\n", up,
              down, stall_pct, std::min(up, down) / 0.8);
  return failed == 0 ? 0 : 1;
}
