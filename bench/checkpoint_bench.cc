// Checkpoint benchmark: a ~124M-parameter GPT
// (GPT-2 small: 12 layers, d_model 768, vocab 50304, seq 256) trains a few
// steps through loom::engine::Train with asynchronous checkpoints, and in
// the same run, side by side:
//   disk:  the disk's own sequential write throughput with fsync, for a file
//          of the checkpoint's size in the same directory: write() of 8 MiB
//          chunks of a buffer of unique bytes, then fsync, both through the
//          page cache (`dd bs=8M conv=fsync`) and with O_DIRECT
//          (`dd bs=8M oflag=direct conv=fsync`), measured before training
//          and after each checkpoint commits (so never during a save). The
//          faster of the two medians is the disk's figure (Loom writes
//          shards with O_DIRECT where the filesystem allows);
//   loom:  bytes / write_seconds of every checkpoint (serialise, CRC-32C,
//          write, fsync, manifest, rename: CheckpointReport);
//   stall: stall_seconds of each periodic (asynchronous) checkpoint as a
//          fraction of the median step time of the steps that no save
//          overlapped. The final checkpoint is synchronous and not counted.
// To stay within minutes on 2 cores the step is small (one sequence of 256
// tokens); a real batch makes the step longer and the stall fraction smaller.
// Steps that overlapped a save are reported too: on a host with few cores
// the writer thread competes with training for CPU and memory bandwidth.
//
// Usage: loom_checkpoint_bench DIR [n_layer] [d_model] [steps] [interval] [threads]
//   defaults: 12 layers, d_model 768, 8 steps, a checkpoint every 2 steps,
//   2 LibTorch threads. DIR must exist; the bench works in a fresh
//   subdirectory and removes it.
// Last line:
//   checkpoint: <loom GB/s> GB/s ratio=<loom/disk> of disk, stall <x>% of a step
#include <fcntl.h>
#include <stdlib.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "bench/checkpoint_bench_setup.h"
#include "common/crc32c.h"
#include "common/formats/data.h"
#include "worker/engine/gpt.h"
#include "worker/engine/trainer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kChunkBytes = size_t{8} << 20;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Join(const std::vector<double>& v, const char* format) {
  std::string out;
  char buffer[32];
  for (double x : v) {
    std::snprintf(buffer, sizeof(buffer), format, x);
    out += out.empty() ? "" : " ";
    out += buffer;
  }
  return out;
}

// The disk's own sequential write throughput, in bytes per second: create
// `path`, write `bytes` of `data` in kChunkBytes writes, fsync, close.
// `data` and `bytes` must be 4096-aligned for `direct`.
double DiskWriteBytesPerSecond(const std::string& path, const char* data, size_t bytes,
                               bool direct) {
  const Clock::time_point start = Clock::now();
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd, data + done, std::min(kChunkBytes, bytes - done));
    if (n <= 0) {
      std::perror("write");
      std::exit(1);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::perror("fsync");
    std::exit(1);
  }
  const double seconds = Seconds(start, Clock::now());
  ::unlink(path.c_str());
  return bytes / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<loom::bench::CheckpointBenchSetup> setup =
      loom::bench::SetUpCheckpointBench(argc, argv, "loom_checkpoint_bench", {});
  if (!setup) return 2;
  loom::engine::TrainerConfig config = setup->config;
  const int64_t steps = setup->steps, interval = setup->interval;
  const int threads = setup->threads;
  const std::string work = setup->work;
  config.checkpoint_dir = work + "/ckpt";
  config.keep_checkpoints = 2;

  const int64_t params = loom::engine::GptParameterCount(config.model);
  std::printf("checkpoint bench: GPT n_layer=%d d_model=%d vocab=%d seq=%d: %.1fM parameters; "
              "%lld steps of 1 x %d tokens, %d threads, a checkpoint every %lld steps; "
              "crc32c %s\n",
              config.model.n_layer, config.model.d_model, config.model.vocab_size,
              config.model.seq_len, params / 1e6, static_cast<long long>(steps),
              config.model.seq_len, threads, static_cast<long long>(interval),
              loom::Crc32cIsHardwareAccelerated() ? "sse4.2" : "table");
  std::fflush(stdout);

  // The baseline's data: unique bytes, as many as a checkpoint has (weights
  // and two AdamW moments, 12 bytes a parameter, plus headers and padding;
  // resized to the real size once the first checkpoint reports it).
  size_t checkpoint_bytes = static_cast<size_t>(params) * 12 + (1 << 20);
  const size_t data_capacity = (checkpoint_bytes + (64 << 20)) / 4096 * 4096;
  std::unique_ptr<char, decltype(&std::free)> data(
      static_cast<char*>(std::aligned_alloc(4096, data_capacity)), &std::free);
  {
    std::mt19937_64 fill(7);
    for (size_t i = 0; i + 8 <= data_capacity; i += 8) {
      const uint64_t v = fill();
      std::memcpy(data.get() + i, &v, 8);
    }
  }
  const std::string baseline_path = work + "/disk_baseline.bin";
  std::vector<double> buffered_rates, direct_rates;
  auto measure_disk = [&] {
    const size_t bytes = (checkpoint_bytes + 4095) / 4096 * 4096;
    buffered_rates.push_back(DiskWriteBytesPerSecond(baseline_path, data.get(), bytes, false));
    direct_rates.push_back(DiskWriteBytesPerSecond(baseline_path, data.get(), bytes, true));
    std::printf("  disk: %.3f GB/s buffered, %.3f GB/s O_DIRECT\n", buffered_rates.back() / 1e9,
                direct_rates.back() / 1e9);
    std::fflush(stdout);
  };
  measure_disk();

  std::vector<loom::engine::CheckpointReport> reports;
  std::map<int64_t, Clock::time_point> step_end;       // training thread
  std::map<int64_t, double> step_seconds;              // training thread
  std::map<int64_t, Clock::time_point> committed_at;   // written under a mutex
  std::mutex committed_mu;
  loom::engine::TrainerCallbacks callbacks;
  callbacks.on_step = [&](const loom::v1::StepMetrics& r) {
    step_end[r.step()] = Clock::now();
    step_seconds[r.step()] = r.step_time_seconds();
    std::printf("  step %lld: %.3f s, loss %.3f\n", static_cast<long long>(r.step()),
                r.step_time_seconds(), r.loss());
    std::fflush(stdout);
  };
  callbacks.on_checkpoint_stage = [&](loom::engine::CheckpointStage stage, int64_t step) {
    if (stage != loom::engine::CheckpointStage::kCommitted) return;
    std::lock_guard<std::mutex> lock(committed_mu);
    committed_at[step] = Clock::now();
  };
  callbacks.on_checkpoint = [&](const loom::engine::CheckpointReport& r) {
    reports.push_back(r);
    std::printf("  checkpoint %lld: %.3f GB in %.3f s = %.3f GB/s; stall %.4f s\n",
                static_cast<long long>(r.step), r.bytes / 1e9, r.write_seconds,
                r.bytes / r.write_seconds / 1e9, r.stall_seconds);
    checkpoint_bytes = std::min(static_cast<size_t>(r.bytes), data_capacity);
    measure_disk();  // no save is in flight now: the disk alone
  };

  const Clock::time_point start = Clock::now();
  absl::StatusOr<loom::engine::TrainResult> result = loom::engine::Train(config, nullptr, callbacks);
  const double total_seconds = Seconds(start, Clock::now());
  fs::remove_all(work);
  if (!result.ok()) {
    std::fprintf(stderr, "training failed: %s\n", result.status().ToString().c_str());
    return 1;
  }

  // Steps that overlapped a save: after the step it captured, ending before
  // it committed (+1: the step during which it committed).
  std::vector<bool> overlapped(steps + 1, false);
  for (const auto& [step, at] : committed_at) {
    for (int64_t s = step + 1; s <= steps; ++s) {
      overlapped[s] = true;
      if (step_end[s] >= at) break;
    }
  }
  std::vector<double> quiet, busy;
  for (int64_t s = 2; s <= steps; ++s) {  // step 1 warms up
    (overlapped[s] ? busy : quiet).push_back(step_seconds[s]);
  }
  std::vector<double> loom_rates, stalls, write_seconds;
  for (const loom::engine::CheckpointReport& r : reports) {
    loom_rates.push_back(r.bytes / r.write_seconds);
    write_seconds.push_back(r.write_seconds);
    if (r.step != steps) stalls.push_back(r.stall_seconds);  // the last one waits
  }
  const double disk = std::max(Median(buffered_rates), Median(direct_rates));
  const double loom = Median(loom_rates);
  const double step = Median(quiet);
  const double stall = Median(stalls);
  std::printf("checkpoint size: %.3f GB (%zu checkpoints written, %.0f s in all)\n",
              checkpoint_bytes / 1e9, reports.size(), total_seconds);
  for (std::vector<double>* rates : {&buffered_rates, &direct_rates}) {
    for (double& r : *rates) r /= 1e9;
  }
  std::printf("disk write+fsync: %.3f GB/s = the faster of buffered %.3f GB/s (%s) and "
              "O_DIRECT %.3f GB/s (%s), medians of %zu runs\n",
              disk / 1e9, Median(buffered_rates), Join(buffered_rates, "%.3g").c_str(),
              Median(direct_rates), Join(direct_rates, "%.3g").c_str(), direct_rates.size());
  for (double& r : loom_rates) r /= 1e9;
  std::printf("loom checkpoint write: %.3f GB/s (median of %zu checkpoints, GB/s: %s; "
              "write_seconds: %s)\n",
              loom / 1e9, loom_rates.size(), Join(loom_rates, "%.3g").c_str(),
              Join(write_seconds, "%.3g").c_str());
  std::printf("step: median %.3f s over %zu steps no save overlapped; %zu steps overlapped a "
              "save: median %.3f s (%+.0f%%)\n",
              step, quiet.size(), busy.size(), Median(busy),
              step > 0 && !busy.empty() ? 100.0 * (Median(busy) / step - 1) : 0.0);
  std::printf("stall: median %.4f s per asynchronous checkpoint (s: %s) = %.2f%% of a step\n",
              stall, Join(stalls, "%.3g").c_str(), step > 0 ? 100.0 * stall / step : 0.0);
  std::printf("checkpoint: %.3f GB/s ratio=%.2f of disk, stall %.2f%% of a step\n", loom / 1e9,
              disk > 0 ? loom / disk : 0.0, step > 0 ? 100.0 * stall / step : 0.0);
  return 0;
}
