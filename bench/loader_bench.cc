// Data loader benchmark: the share of the training
// step spent waiting for input, on the benchmark configuration (GPT-2-style,
// 4 layers, 4 heads, d_model 256, vocab 50304, seq 256, batch 8, 2 threads),
// with the prefetching loader (TrainerConfig::prefetch_depth 2: a background
// thread keeps the next batches ready) and, in the same run, without it
// (prefetch_depth 0: each step gathers its own batch). The data are
// `epochs` passes over a shard of random tokens, so epoch boundaries (a new
// permutation of the samples) fall inside the run.
//
// Figures: StepMetrics::data_wait_seconds over step_time_seconds, summed over
// the steps after `warmup` (the same steps for both), per configuration.
//
// Usage: loom_loader_bench [steps] [warmup] [threads]
//   defaults: 10 steps, 2 warm-up, 2 threads.
// Output: human-readable lines, then
//   LOOM_LOADER prefetch_wait_fraction=<x> sync_wait_fraction=<x> ...
#include <stdlib.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/cpu_gpt_config.h"
#include "common/formats/data.h"
#include "worker/engine/host_allocator.h"
#include "worker/engine/openmp_wait.h"
#include "worker/engine/trainer.h"

namespace fs = std::filesystem;

namespace {

struct Outcome {
  bool ok = false;
  double wait = 0, step = 0, max_wait = 0;
};

Outcome Run(const loom::engine::TrainerConfig& config, int warmup) {
  Outcome out;
  loom::engine::TrainerCallbacks callbacks;
  callbacks.on_step = [&](const loom::v1::StepMetrics& r) {
    if (r.step() <= warmup) return;
    out.wait += r.data_wait_seconds();
    out.step += r.step_time_seconds();
    out.max_wait = std::max(out.max_wait, r.data_wait_seconds());
  };
  absl::StatusOr<loom::engine::TrainResult> result =
      loom::engine::Train(config, nullptr, callbacks);
  if (!result.ok()) {
    std::fprintf(stderr, "Train: %s\n", result.status().ToString().c_str());
    return out;
  }
  out.ok = true;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // As loom-rank runs the engine (openmp_wait.h).
  (void)loom::engine::ReexecWithShortOpenMpSpin(argv);
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int warmup = argc > 2 ? std::atoi(argv[2]) : 2;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  if (steps <= warmup || warmup < 0 || threads < 1) {
    std::fprintf(stderr, "usage: %s [steps > warmup] [warmup >= 0] [threads >= 1]\n", argv[0]);
    return 2;
  }
  torch::set_num_threads(threads);
  // As loom-rank runs the engine (host_allocator.h).
  (void)loom::engine::RetainFreedHostMemory();

  loom::engine::TrainerConfig config = loom::bench::CpuBenchGptConfig(steps);
  config.seed = 7;

  // Two and a half epochs of random tokens over the run.
  std::string work = (fs::temp_directory_path() / "loom_loader_bench.XXXXXX").string();
  if (mkdtemp(work.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const int64_t samples = std::max<int64_t>(config.global_batch, steps * config.global_batch * 2 / 5);
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> token(0, config.model.vocab_size - 1);
  std::vector<uint16_t> tokens(static_cast<size_t>(samples * config.model.seq_len + 1));
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(token(rng));
  const std::string shard = (fs::path(work) / "train_000000.bin").string();
  if (absl::Status s = loom::engine::WriteShard(shard, tokens); !s.ok()) {
    std::fprintf(stderr, "WriteShard: %s\n", s.ToString().c_str());
    fs::remove_all(work);
    return 1;
  }
  config.train_shards = {shard};

  loom::engine::TrainerConfig prefetch = config;
  prefetch.prefetch_depth = 2;
  loom::engine::TrainerConfig sync = config;
  sync.prefetch_depth = 0;
  const Outcome with = Run(prefetch, warmup);
  const Outcome without = Run(sync, warmup);
  fs::remove_all(work);
  if (!with.ok || !without.ok) return 1;

  const int timed = steps - warmup;
  std::printf("loader, prefetch_depth 2: data wait %.3f ms per step (max %.3f ms) = %.4f%% of a "
              "%.3f s step\n",
              1e3 * with.wait / timed, 1e3 * with.max_wait, 100 * with.wait / with.step,
              with.step / timed);
  std::printf("loader, no prefetching:   data wait %.3f ms per step (max %.3f ms) = %.4f%% of a "
              "%.3f s step\n",
              1e3 * without.wait / timed, 1e3 * without.max_wait,
              100 * without.wait / without.step, without.step / timed);
  std::printf("LOOM_LOADER prefetch_wait_fraction=%.6g sync_wait_fraction=%.6g "
              "prefetch_wait_seconds=%.6g sync_wait_seconds=%.6g steps=%d\n",
              with.wait / with.step, without.wait / without.step, with.wait / timed,
              without.wait / timed, timed);
  return 0;
}
