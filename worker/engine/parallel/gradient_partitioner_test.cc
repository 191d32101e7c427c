// GradientPartitioner (ZeRO-2's gradient reduction) over real in-process
// Gloo groups: each rank ends with exactly its slice of the sum of every
// rank's gradients, accumulated over micro-batches; buckets cross parameter
// and shard boundaries; gradients are freed as they are taken; the staging
// memory stays a fraction of the model's gradients; deferred and unused
// parameters are handled; a group of one keeps everything.
#include "worker/engine/parallel/gradient_partitioner.h"

#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "worker/engine/gpt.h"
#include "worker/engine/gradient_test_model.h"
#include "worker/engine/parallel/process_groups.h"

namespace loom::engine {
namespace {

using testing::Batch;
using testing::SmallGpt;

Gpt MakeModel() {
  static std::mutex init;  // the global generator is shared between threads
  std::lock_guard<std::mutex> lock(init);
  torch::manual_seed(42);
  Gpt model(SmallGpt());
  model->train();
  return model;
}

// What a rank runs: `micros` backwards, an optional tweak of the deferred
// gradients, then Finish.
struct Scenario {
  int world = 2;
  int micros = 2;
  int64_t bucket_bytes = 2048;  // many buckets, most cut through parameters
  bool defer_wte = false;       // wte's gradient is doubled after backward
  bool unused_parameter = false;  // one more slot that never gets a gradient
};

struct RankResult {
  torch::Tensor accumulator;
  int64_t shard = 0;
  int64_t total = 0;
  int buckets = 0;
  int64_t launched_during_backward = 0;
  int64_t peak_staging_bytes = 0;
  bool gradients_released = true;
};

// The whole space's expected sum: every rank's own gradients, flattened in
// slot order (deferred wte doubled, the unused slot zero).
torch::Tensor ExpectedSum(const Scenario& s) {
  torch::Tensor sum;
  for (int rank = 0; rank < s.world; ++rank) {
    Gpt model = MakeModel();
    for (int m = 0; m < s.micros; ++m) {
      auto [x, y] = Batch(rank, m, SmallGpt());
      (model->Loss(x, y) / s.micros).backward();
    }
    std::vector<torch::Tensor> parts;
    for (const auto& item : model->named_parameters()) {
      torch::Tensor g = item.value().grad().reshape({-1});
      if (s.defer_wte && item.key() == "wte.weight") g = g * 2;
      parts.push_back(g);
    }
    if (s.unused_parameter) parts.push_back(torch::zeros({10}));
    torch::Tensor flat = torch::cat(parts);
    sum = sum.defined() ? sum + flat : flat;
  }
  return sum;
}

std::vector<RankResult> RunRanks(const Scenario& s) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankResult> results(s.world);
  std::vector<std::optional<ParallelGroups>> kept(s.world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < s.world; ++rank) {
    threads.emplace_back([&, rank] {
      torch::set_num_threads(1);
      c10d::ProcessGroup* group = nullptr;
      if (s.world > 1) {
        ParallelGroupOptions options;
        options.timeout_seconds = 60;
        options.local_addr = "127.0.0.1";
        absl::StatusOr<ParallelGroups> groups =
            CreateParallelGroups(store, rank, ParallelLayout{s.world, 1, 1}, options);
        ASSERT_TRUE(groups.ok()) << groups.status();
        kept[rank].emplace(*std::move(groups));
        group = kept[rank]->world.get();
      }
      Gpt model = MakeModel();
      std::vector<GradientSlot> slots;
      int64_t total = 0;
      torch::Tensor wte;
      for (const auto& item : model->named_parameters()) {
        const bool deferred = s.defer_wte && item.key() == "wte.weight";
        if (deferred) wte = item.value();
        slots.push_back({item.value(), total, 0, deferred});
        total += item.value().numel();
      }
      torch::Tensor unused = torch::zeros({10}, torch::requires_grad());
      if (s.unused_parameter) {
        slots.push_back({unused, total, 0, false});
        total += unused.numel();
      }
      const int64_t shard = (total + s.world - 1) / s.world;
      torch::Tensor accumulator = torch::zeros({shard});
      std::vector<torch::Tensor> parameters;
      for (const GradientSlot& slot : slots) parameters.push_back(slot.parameter);
      GradientPartitioner partitioner(std::move(slots), shard, accumulator, group,
                                      s.bucket_bytes, /*max_in_flight=*/2);
      for (int m = 0; m < s.micros; ++m) {
        auto [x, y] = Batch(rank, m, SmallGpt());
        (model->Loss(x, y) / s.micros).backward();
      }
      if (s.defer_wte) {
        torch::NoGradGuard no_grad;
        wte.mutable_grad().mul_(2);  // what a pipeline's tied-embedding sum does
      }
      partitioner.Finish();
      RankResult& r = results[rank];
      r.accumulator = accumulator;
      r.shard = shard;
      r.total = total;
      r.buckets = partitioner.buckets();
      r.launched_during_backward = partitioner.launched_during_backward();
      r.peak_staging_bytes = partitioner.peak_staging_bytes();
      for (const torch::Tensor& p : parameters) {
        if (p.grad().defined()) r.gradients_released = false;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Each rank's accumulator against its slice of the expected sum; returns the
// worst difference.
double CheckSlices(const Scenario& s, const std::vector<RankResult>& results) {
  const torch::Tensor expected = ExpectedSum(s);
  double worst = 0;
  for (int rank = 0; rank < s.world; ++rank) {
    const RankResult& r = results[rank];
    EXPECT_EQ(r.total, expected.numel());
    const int64_t begin = rank * r.shard;
    const int64_t size = std::max<int64_t>(0, std::min(r.shard, r.total - begin));
    torch::Tensor mine = r.accumulator.narrow(0, 0, size);
    worst = std::max(worst, (mine - expected.narrow(0, begin, size)).abs().max().item<double>());
    if (size < r.shard) {  // the padded tail owns nothing
      EXPECT_EQ(r.accumulator.narrow(0, size, r.shard - size).abs().max().item<double>(), 0);
    }
    EXPECT_TRUE(r.gradients_released) << "rank " << rank;
  }
  return worst;
}

TEST(GradientPartitionerTest, EachRankGetsItsSliceOfTheSumOverMicroBatches) {
  Scenario s;
  const std::vector<RankResult> results = RunRanks(s);
  const double worst = CheckSlices(s, results);
  std::cout << "world 2, 2 micro-batches: worst difference " << worst << ", "
            << results[0].buckets << " buckets" << std::endl;
  EXPECT_LT(worst, 1e-6);
  EXPECT_GT(results[0].buckets, 20);
  // Most buckets go out from the hooks, while backward runs.
  EXPECT_GT(results[0].launched_during_backward, results[0].buckets);
}

TEST(GradientPartitionerTest, ThreeRanksUnevenShards) {
  Scenario s;
  s.world = 3;
  s.micros = 1;
  s.bucket_bytes = 3000;  // not a divisor of anything
  const double worst = CheckSlices(s, RunRanks(s));
  EXPECT_LT(worst, 1e-6);
}

TEST(GradientPartitionerTest, StagingIsAFractionOfTheGradients) {
  Scenario s;
  s.micros = 1;
  s.bucket_bytes = 4096;
  const std::vector<RankResult> results = RunRanks(s);
  EXPECT_LT(CheckSlices(s, results), 1e-6);
  const int64_t gradient_bytes = results[0].total * 4;
  for (const RankResult& r : results) {
    std::cout << "peak staging " << r.peak_staging_bytes << " of " << gradient_bytes
              << " gradient bytes" << std::endl;
    // The largest parameter (wte, 64 x 32 floats = 8 KiB) spans three
    // buckets at once; the rest is a couple of buckets.
    EXPECT_LT(r.peak_staging_bytes, gradient_bytes / 4);
    EXPECT_GT(r.peak_staging_bytes, 0);
  }
}

TEST(GradientPartitionerTest, DeferredParameterIsTakenByFinish) {
  Scenario s;
  s.defer_wte = true;
  EXPECT_LT(CheckSlices(s, RunRanks(s)), 1e-6);
}

TEST(GradientPartitionerTest, UnusedParameterIsSentAsZerosAndNothingHangs) {
  Scenario s;
  s.unused_parameter = true;
  s.world = 3;
  EXPECT_LT(CheckSlices(s, RunRanks(s)), 1e-6);
}

TEST(GradientPartitionerTest, GroupOfOneKeepsTheWholeSum) {
  Scenario s;
  s.world = 1;
  EXPECT_LT(CheckSlices(s, RunRanks(s)), 1e-6);
}

TEST(GradientPartitionerTest, RefusesBadArguments) {
  Gpt model = MakeModel();
  const torch::Tensor a = model->parameters()[0], b = model->parameters()[1];
  const int64_t n = a.numel() + b.numel();
  auto make = [&](std::vector<GradientSlot> slots, int64_t shard, int64_t accumulator) {
    GradientPartitioner p(std::move(slots), shard, torch::zeros({accumulator}), nullptr);
  };
  EXPECT_NO_THROW(make({{a, 0, 0, false}, {b, a.numel(), 0, false}}, n, n));
  EXPECT_THROW(make({{a, 0, 0, false}, {b, a.numel() + 1, 0, false}}, n + 1, n + 1),
               c10::Error);                                             // a gap
  EXPECT_THROW(make({{a, 0, 0, false}, {b, a.numel(), 0, false}}, n, n - 1), c10::Error);
  EXPECT_THROW(make({{a, 0, 0, false}, {b, a.numel(), 0, false}}, n - 1, n - 1),
               c10::Error);                                             // does not fit
  EXPECT_THROW(make({{a, 0, 0, false}}, 0, 0), c10::Error);
}

}  // namespace
}  // namespace loom::engine
