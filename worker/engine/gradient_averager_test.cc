// GradientAverager over a real in-process Gloo group: the averaged
// gradients equal the mean of each rank's own gradients, buckets go out
// while backward still runs, accumulation over micro-batches and unused
// parameters are handled, and a world of one is an identity.
#include "worker/engine/gradient_averager.h"

#include <functional>
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

// A model with the same weights on every call (seeded).
Gpt MakeModel() {
  torch::manual_seed(42);
  Gpt model(SmallGpt());
  model->train();
  return model;
}

// Gradients of one rank computed alone: backward over `micros` micro-
// batches, each loss divided by micros.
std::vector<torch::Tensor> LocalGradients(int rank, int micros) {
  Gpt model = MakeModel();
  for (int m = 0; m < micros; ++m) {
    auto [x, y] = Batch(rank, m, SmallGpt());
    (model->Loss(x, y) / micros).backward();
  }
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

struct RankRun {
  std::vector<torch::Tensor> grads;
  int buckets = 0;
  int launched_during_backward = 0;
};

// Every rank of a world of `world` threads builds the model, runs `body`
// (which calls the averager) and keeps its gradients.
std::vector<RankRun> RunRanks(int world,
                              const std::function<void(int, Gpt&, GradientAverager&)>& body,
                              int64_t bucket_bytes) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankRun> runs(world);
  std::vector<std::optional<ParallelGroups>> kept(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      torch::set_num_threads(1);
      ParallelGroupOptions options;
      options.timeout_seconds = 60;
      options.local_addr = "127.0.0.1";
      absl::StatusOr<ParallelGroups> groups =
          CreateParallelGroups(store, rank, ParallelLayout{world, 1, 1}, options);
      ASSERT_TRUE(groups.ok()) << groups.status();
      kept[rank].emplace(*std::move(groups));
      Gpt model{nullptr};
      {
        static std::mutex init;  // the global generator is shared
        std::lock_guard<std::mutex> lock(init);
        model = MakeModel();
      }
      GradientAverager averager(model->parameters(), kept[rank]->world.get(), bucket_bytes);
      body(rank, model, averager);
      for (const torch::Tensor& p : model->parameters()) {
        runs[rank].grads.push_back(p.grad().clone());
      }
      runs[rank].buckets = averager.buckets();
      runs[rank].launched_during_backward = averager.launched_during_backward();
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// The worst |a - b| over all tensors.
double MaxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

// One step of `micros` micro-batches the way the replicated engine runs it.
void Step(int rank, int micros, Gpt& model, GradientAverager& averager) {
  averager.ZeroGradients();
  for (int m = 0; m < micros; ++m) {
    auto [x, y] = Batch(rank, m, SmallGpt());
    if (m == micros - 1) averager.Arm();
    (model->Loss(x, y) / micros).backward();
  }
  averager.Finish();
}

TEST(GradientAveragerTest, TwoRanksEqualTheMeanOfTheirOwnGradients) {
  // Small buckets: many of them, so that most go out during backward.
  const std::vector<RankRun> runs = RunRanks(
      2, [](int rank, Gpt& model, GradientAverager& a) { Step(rank, 1, model, a); }, 4096);
  std::vector<torch::Tensor> mean;
  const std::vector<torch::Tensor> g0 = LocalGradients(0, 1), g1 = LocalGradients(1, 1);
  for (size_t i = 0; i < g0.size(); ++i) mean.push_back((g0[i] + g1[i]) / 2);
  // Two addends sum the same in either order and halving is exact: bitwise.
  EXPECT_EQ(MaxDiff(runs[0].grads, mean), 0.0);
  EXPECT_EQ(MaxDiff(runs[1].grads, mean), 0.0);
  // The ranks' gradients differ before averaging (else the test proves
  // nothing).
  EXPECT_GT(MaxDiff(g0, g1), 1e-4);
}

TEST(GradientAveragerTest, BucketsGoOutWhileBackwardRuns) {
  const std::vector<RankRun> runs = RunRanks(
      2, [](int rank, Gpt& model, GradientAverager& a) { Step(rank, 1, model, a); }, 4096);
  for (const RankRun& run : runs) {
    ASSERT_GE(run.buckets, 8) << "the model should need many 4 KiB buckets";
    // Only the buckets behind the embeddings (whose gradients complete last,
    // with the tied LM head's) may wait for the end of backward.
    std::printf("buckets %d, launched during backward %d\n", run.buckets,
                run.launched_during_backward);
    EXPECT_GE(run.launched_during_backward, run.buckets - 2);
  }
}

TEST(GradientAveragerTest, AccumulatesMicroBatchesBeforeReducing) {
  const std::vector<RankRun> runs = RunRanks(
      2, [](int rank, Gpt& model, GradientAverager& a) { Step(rank, 3, model, a); },
      kGradientBucketBytes);
  const std::vector<torch::Tensor> g0 = LocalGradients(0, 3), g1 = LocalGradients(1, 3);
  std::vector<torch::Tensor> mean;
  for (size_t i = 0; i < g0.size(); ++i) mean.push_back((g0[i] + g1[i]) / 2);
  // Accumulation order is the same as LocalGradients' (0 + g0 + g1 + g2
  // against g0 + g1 + g2: adding to zero is exact).
  EXPECT_EQ(MaxDiff(runs[0].grads, mean), 0.0);
  EXPECT_EQ(runs[0].buckets, 1);
}

TEST(GradientAveragerTest, SecondStepStartsFromZero) {
  const std::vector<RankRun> runs = RunRanks(
      2,
      [](int rank, Gpt& model, GradientAverager& a) {
        Step(rank, 1, model, a);
        Step(rank, 1, model, a);  // same batch, same weights: same gradient
      },
      8192);
  const std::vector<torch::Tensor> g0 = LocalGradients(0, 1), g1 = LocalGradients(1, 1);
  std::vector<torch::Tensor> mean;
  for (size_t i = 0; i < g0.size(); ++i) mean.push_back((g0[i] + g1[i]) / 2);
  EXPECT_EQ(MaxDiff(runs[1].grads, mean), 0.0);
}

TEST(GradientAveragerTest, ParameterWithoutGradientIsReducedAsZeros) {
  // Backward reaches only parameter 0: no other accumulator fires, so
  // Finish sends their buckets (in order, on both ranks).
  const std::vector<RankRun> runs = RunRanks(
      2,
      [](int rank, Gpt& model, GradientAverager& a) {
        a.ZeroGradients();
        a.Arm();
        (model->parameters()[0].sum() * (rank + 1)).backward();
        a.Finish();
      },
      1024);
  // Parameter 0 got 1 on rank 0 and 2 on rank 1: the mean is 1.5.
  EXPECT_TRUE(torch::allclose(runs[0].grads[0],
                              torch::full_like(runs[0].grads[0], 1.5)));
  // Every other parameter's gradient is zero, on both ranks.
  for (const RankRun& run : runs) {
    for (size_t i = 1; i < run.grads.size(); ++i) {
      EXPECT_EQ(run.grads[i].abs().max().item<double>(), 0.0) << i;
    }
  }
}

TEST(GradientAveragerTest, WorldOfOneIsAPlainBackward) {
  Gpt model = MakeModel();
  GradientAverager averager(model->parameters(), nullptr, 2048);
  Step(0, 2, model, averager);
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : model->parameters()) grads.push_back(p.grad());
  EXPECT_EQ(MaxDiff(grads, LocalGradients(0, 2)), 0.0);
}

TEST(GradientAveragerTest, ReinstallsAViewSomeoneReplaced) {
  Gpt model = MakeModel();
  GradientAverager averager(model->parameters(), nullptr);
  torch::Tensor p = model->parameters()[0];
  p.mutable_grad() = torch::Tensor();  // as a careless caller might
  Step(0, 1, model, averager);
  EXPECT_EQ(MaxDiff({p.grad()}, {LocalGradients(0, 1)[0]}), 0.0);
}

}  // namespace
}  // namespace loom::engine
