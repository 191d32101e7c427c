// Helpers of the trainer's tests (trainer_test.cc, resume_test.cc): text
// to train on, parameters to compare, in-process Gloo ranks, checkpoint
// directory names.
#ifndef LOOM_WORKER_ENGINE_TRAINER_TEST_UTIL_H_
#define LOOM_WORKER_ENGINE_TRAINER_TEST_UTIL_H_

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/process_group_handle.h"
#include "worker/engine/trainer_config.h"

namespace loom::engine {

// English-like byte stream: sentences drawn from a small grammar, so that a
// tiny model has real structure (spelling, spaces, word order) to learn.
inline std::vector<uint16_t> MakeText(uint32_t seed, size_t bytes) {
  static const std::vector<std::string> kSubjects = {"the cat",     "a dog", "my friend",
                                                     "the old man", "she",   "we"};
  static const std::vector<std::string> kVerbs = {"sees",   "likes", "walks to",
                                                  "paints", "finds", "reads about"};
  static const std::vector<std::string> kObjects = {"the river",    "a small house", "the moon",
                                                    "green apples", "the market",    "a letter"};
  std::mt19937 rng(seed);
  auto pick = [&](const std::vector<std::string>& words) {
    return words[std::uniform_int_distribution<size_t>(0, words.size() - 1)(rng)];
  };
  std::string text;
  while (text.size() < bytes) {
    text += pick(kSubjects) + " " + pick(kVerbs) + " " + pick(kObjects) + ". ";
  }
  return std::vector<uint16_t>(text.begin(), text.begin() + bytes);
}

// Current parameters of a module, copied.
inline std::vector<torch::Tensor> Snapshot(const torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : module.parameters()) out.push_back(p.detach().clone());
  return out;
}

inline double MaxAbsDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
  }
  return diff;
}

// An in-process Gloo group of `world_size` ranks over one HashStore. The
// shared_ptr holds an intrusive reference (see Train's contract).
inline std::shared_ptr<c10d::ProcessGroup> MakeGlooRank(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size) {
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return AsProcessGroup(
      store, c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options), rank,
      world_size, /*nccl=*/false, std::chrono::seconds(60));
}

// The tests' tiny GPT (2 layers, 2 heads, d_model 32, seq 32, bytes as
// tokens, no dropout), AdamW at lr 3e-3 with 2 warm-up steps, global batch
// 8 in micro-batches of 2; the caller sets the data and anything else.
inline TrainerConfig TinyGptConfig(int64_t steps, uint64_t seed) {
  TrainerConfig c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.d_model = 32;
  c.model.seq_len = 32;
  c.model.vocab_size = 256;
  c.model.dropout = 0.0;
  c.optimizer.lr = 3e-3;
  c.schedule.total_steps = steps;
  c.schedule.warmup_steps = 2;
  c.global_batch = 8;
  c.micro_batch = 2;
  c.seed = seed;
  return c;
}

// "<dir>/step-<9 digits>": the directory of checkpoint `step`.
inline std::string StepDir(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%09lld", static_cast<long long>(step));
  return dir + "/" + name;
}

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAINER_TEST_UTIL_H_
