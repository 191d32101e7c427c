// The object-store tier's cost to training: a GPT trains through
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
// Usage: loom_remote_tier_bench DIR [n_layer] [d_model] [steps] [interval] [threads]
//   defaults: 6 layers, d_model 512 (~45M parameters, ~0.5 GB checkpoints),
//   12 steps, a checkpoint every 3 steps, 2 LibTorch threads.
// Last line:
//   remote-tier: <upload GB/s> GB/s uploaded, steps +<x>% while uploading ratio=<remote/local step>
#include <stdlib.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "bench/checkpoint_bench_setup.h"
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
    if (r.step != config.schedule.total_steps) run->stalls.push_back(r.stall_seconds);
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

}  // namespace

int main(int argc, char** argv) {
  loom::bench::CheckpointBenchDefaults defaults;
  defaults.n_layer = 6;
  defaults.d_model = 512;
  defaults.steps = 12;
  defaults.interval = 3;
  defaults.min_steps = 4;
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
  auto store = loom::object_store::S3TestServer::Start("bench", store_nice);
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
  std::fflush(stdout);

  Run local, remote;
  std::printf("local tier only:\n");
  if (!TrainOnce(config, work + "/local", nullptr, "", &local)) return 1;
  fs::remove_all(work + "/local");

  loom::worker::CheckpointUploader::Options options;
  options.uploader = "the bench";
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
  fs::remove_all(work);

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
  const double local_step = Median(local_steps);
  const double remote_step = Median(busy.empty() ? quiet : busy);
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
  std::printf("remote-tier: %.3f GB/s uploaded, steps %+.0f%% while uploading ratio=%.3f\n",
              rate / 1e9, local_step > 0 ? 100.0 * (remote_step / local_step - 1) : 0.0,
              local_step > 0 ? remote_step / local_step : 0.0);
  return failed == 0 ? 0 : 1;
}
