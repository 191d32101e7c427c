#include "worker/engine/parallel/reduce_scatter.h"

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "worker/engine/parallel/process_groups.h"

namespace loom::engine {
namespace {

// Runs fn(rank, groups) on `world` threads, each a rank of a pure
// data-parallel layout over one HashStore; returns each rank's error text.
template <typename Fn>
std::vector<std::string> OnRanks(int world, Fn fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world);
  // Groups outlive every rank's work (see layout_trainer_test.cc, Run).
  std::vector<std::optional<ParallelGroups>> kept(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ParallelGroupOptions options;
        options.timeout_seconds = 60;
        options.local_addr = "127.0.0.1";
        absl::StatusOr<ParallelGroups> groups =
            CreateParallelGroups(store, rank, ParallelLayout{world, 1, 1}, options);
        if (!groups.ok()) {
          errors[rank] = groups.status().ToString();
          return;
        }
        kept[rank].emplace(*std::move(groups));
        fn(rank, *kept[rank]);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

// Rank r's input: element i = (r + 1) * 1000 + i, so chunk c of the sum over
// n ranks is sum_r (r + 1) * 1000 + i = 1000 * n(n+1)/2 + n * i.
torch::Tensor InputOf(int rank, int64_t elements) {
  return torch::arange(elements, torch::kFloat) + (rank + 1) * 1000.0f;
}

class ReduceScatterTest
    : public ::testing::TestWithParam<std::tuple<int, ReduceScatterAlgorithm>> {};

TEST_P(ReduceScatterTest, EachRankGetsTheSumOfItsChunk) {
  const auto [world, algorithm] = GetParam();
  constexpr int64_t kChunk = 7;
  std::vector<torch::Tensor> results(world);
  const std::vector<std::string> errors = OnRanks(world, [&](int rank, ParallelGroups& g) {
    torch::Tensor flat = InputOf(rank, world * kChunk);
    ReduceScatterInPlace(flat, g.data.get(), algorithm);
    results[rank] = flat.narrow(0, rank * kChunk, kChunk).clone();
  });
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_EQ(errors[rank], "") << "rank " << rank;
    const torch::Tensor expected =
        torch::arange(rank * kChunk, (rank + 1) * kChunk, torch::kFloat) * world +
        1000.0f * world * (world + 1) / 2;
    EXPECT_TRUE(torch::equal(results[rank], expected))
        << "rank " << rank << " of " << world << " ("
        << ReduceScatterAlgorithmName(algorithm) << "): " << results[rank];
  }
}

INSTANTIATE_TEST_SUITE_P(
    GlooRanks, ReduceScatterTest,
    ::testing::Combine(::testing::Values(2, 3, 4),
                       ::testing::Values(ReduceScatterAlgorithm::kAuto,
                                         ReduceScatterAlgorithm::kRing,
                                         ReduceScatterAlgorithm::kAllReduce)));

TEST(AllGatherTest, EveryRankEndsWithEveryChunk) {
  constexpr int kWorld = 3;
  constexpr int64_t kChunk = 5;
  std::vector<torch::Tensor> results(kWorld);
  const std::vector<std::string> errors = OnRanks(kWorld, [&](int rank, ParallelGroups& g) {
    torch::Tensor flat = torch::full({kWorld * kChunk}, -1.0f);
    flat.narrow(0, rank * kChunk, kChunk).fill_(static_cast<float>(rank));
    AllGatherInPlace(flat, g.data.get());
    results[rank] = flat;
  });
  const torch::Tensor expected =
      torch::arange(kWorld, torch::kFloat).repeat_interleave(kChunk);
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(errors[rank], "") << "rank " << rank;
    EXPECT_TRUE(torch::equal(results[rank], expected)) << "rank " << rank;
  }
}

TEST(ReduceScatterSingleRankTest, IsIdentity) {
  torch::Tensor flat = InputOf(0, 6);
  const torch::Tensor before = flat.clone();
  ReduceScatterInPlace(flat, nullptr);
  AllGatherInPlace(flat, nullptr);
  EXPECT_TRUE(torch::equal(flat, before));
}

}  // namespace
}  // namespace loom::engine
