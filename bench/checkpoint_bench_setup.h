// What the checkpoint benches share (checkpoint_bench.cc, remote_tier_bench.cc):
// a GPT of GPT-2's vocabulary and 256-token sequences, trained one sequence a
// step on random tokens, with asynchronous checkpoints, from the command line
//   DIR [n_layer] [d_model] [steps] [interval] [threads]
// and a fresh working directory under DIR (holding the token shard).
#ifndef LOOM_BENCH_CHECKPOINT_BENCH_SETUP_H_
#define LOOM_BENCH_CHECKPOINT_BENCH_SETUP_H_

#include <stdlib.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/formats/data.h"
#include "worker/engine/trainer.h"

namespace loom::bench {

struct CheckpointBenchDefaults {
  int n_layer = 12;
  int d_model = 768;
  int64_t steps = 8;
  int64_t interval = 2;
  int threads = 2;
  int64_t min_steps = 2;
};

struct CheckpointBenchSetup {
  engine::TrainerConfig config;  // model, data, schedule, checkpoint interval, async
  int64_t steps = 0;
  int64_t interval = 0;
  int threads = 0;
  std::string work;  // the fresh working directory: the caller removes it
};

// The setup, or nullopt after printing why (usage, bad arguments, I/O).
inline std::optional<CheckpointBenchSetup> SetUpCheckpointBench(int argc, char** argv,
                                                                const char* work_name,
                                                                const CheckpointBenchDefaults& d) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [n_layer] [d_model] [steps] [interval] [threads]\n",
                 argv[0]);
    return std::nullopt;
  }
  auto arg = [&](int i, int64_t fallback) {
    return argc > i ? std::strtoll(argv[i], nullptr, 10) : fallback;
  };
  CheckpointBenchSetup s;
  engine::TrainerConfig& config = s.config;
  config.model.n_layer = static_cast<int>(arg(2, d.n_layer));
  config.model.d_model = static_cast<int>(arg(3, d.d_model));
  config.model.n_head = std::max(1, config.model.d_model / 64);
  config.model.vocab_size = 50304;
  config.model.seq_len = 256;
  s.steps = arg(4, d.steps);
  s.interval = arg(5, d.interval);
  s.threads = static_cast<int>(arg(6, d.threads));
  if (config.model.n_layer < 1 || config.model.d_model < 64 || s.steps < d.min_steps ||
      s.interval < 1 || s.threads < 1) {
    std::fprintf(stderr, "%s: bad arguments\n", argv[0]);
    return std::nullopt;
  }
  torch::set_num_threads(s.threads);
  s.work = (std::filesystem::path(argv[1]) / (std::string(work_name) + "XXXXXX")).string();
  if (mkdtemp(s.work.data()) == nullptr) {
    std::perror(argv[1]);
    return std::nullopt;
  }
  // Random tokens: the data only has to exist.
  std::mt19937 rng(1);
  std::vector<uint16_t> tokens((s.steps + 2) * (config.model.seq_len + 1));
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng() % config.model.vocab_size);
  const std::string shard = s.work + "/train_000000.bin";
  if (!engine::WriteShard(shard, tokens).ok()) {
    std::fprintf(stderr, "could not write %s\n", shard.c_str());
    return std::nullopt;
  }
  config.train_shards = {shard};
  config.global_batch = 1;
  config.micro_batch = 1;
  config.schedule.total_steps = s.steps;
  config.schedule.warmup_steps = 1;
  config.checkpoint_interval = s.interval;
  config.checkpoint_async = true;
  return s;
}

}  // namespace loom::bench

#endif  // LOOM_BENCH_CHECKPOINT_BENCH_SETUP_H_
