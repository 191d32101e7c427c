#include "common/parallel_layout.h"

#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(LayoutTest, TensorRankVariesFastestThenPipelineThenData) {
  const ParallelLayout layout{/*data=*/2, /*tensor=*/2, /*pipeline=*/3};
  ASSERT_EQ(layout.world_size(), 12);
  EXPECT_EQ(CoordinatesOf(layout, 0), (RankCoordinates{0, 0, 0}));
  EXPECT_EQ(CoordinatesOf(layout, 1), (RankCoordinates{0, 0, 1}));
  EXPECT_EQ(CoordinatesOf(layout, 2), (RankCoordinates{0, 1, 0}));
  EXPECT_EQ(CoordinatesOf(layout, 5), (RankCoordinates{0, 2, 1}));
  EXPECT_EQ(CoordinatesOf(layout, 6), (RankCoordinates{1, 0, 0}));
  EXPECT_EQ(CoordinatesOf(layout, 11), (RankCoordinates{1, 2, 1}));
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    EXPECT_EQ(RankOf(layout, CoordinatesOf(layout, rank)), rank);
  }
}

TEST(LayoutTest, GroupsOfARank) {
  const ParallelLayout layout{/*data=*/2, /*tensor=*/2, /*pipeline=*/3};
  // Rank 9 = dp 1, pp 1, tp 1.
  EXPECT_THAT(TensorGroupOf(layout, 9), ElementsAre(8, 9));
  EXPECT_THAT(PipelineGroupOf(layout, 9), ElementsAre(7, 9, 11));
  EXPECT_THAT(DataGroupOf(layout, 9), ElementsAre(3, 9));
}

TEST(LayoutTest, EveryKindOfGroupPartitionsTheWorld) {
  for (const ParallelLayout& layout :
       {ParallelLayout{1, 1, 1}, ParallelLayout{4, 1, 1}, ParallelLayout{1, 4, 1},
        ParallelLayout{1, 1, 4}, ParallelLayout{2, 2, 2}, ParallelLayout{3, 2, 5}}) {
    for (GroupKind kind : {GroupKind::kTensor, GroupKind::kPipeline, GroupKind::kData}) {
      const std::vector<std::vector<int>> groups = AllGroups(layout, kind);
      const int degree = kind == GroupKind::kTensor     ? layout.tensor
                         : kind == GroupKind::kPipeline ? layout.pipeline
                                                        : layout.data;
      ASSERT_EQ(static_cast<int>(groups.size()), layout.world_size() / degree)
          << LayoutName(layout) << " " << GroupKindName(kind);
      std::set<int> seen;
      for (const std::vector<int>& g : groups) {
        EXPECT_EQ(static_cast<int>(g.size()), degree);
        for (int r : g) EXPECT_TRUE(seen.insert(r).second) << "rank " << r << " twice";
      }
      EXPECT_EQ(static_cast<int>(seen.size()), layout.world_size());
    }
  }
}

TEST(LayoutTest, TensorGroupsAreConsecutiveRanks) {
  // So a scheduler that fills each node with consecutive ranks keeps every
  // TP group inside one node.
  const ParallelLayout layout{/*data=*/2, /*tensor=*/4, /*pipeline=*/2};
  for (const std::vector<int>& g : AllGroups(layout, GroupKind::kTensor)) {
    for (size_t i = 1; i < g.size(); ++i) EXPECT_EQ(g[i], g[0] + static_cast<int>(i));
    EXPECT_EQ(g[0] % 4, 0);
  }
}

TEST(LayoutTest, ValidateNamesTheField) {
  EXPECT_TRUE(ValidateLayout({2, 2, 1}, 4).ok());
  const absl::Status zero = ValidateLayout({1, 0, 1}, 1);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.message()), HasSubstr("parallelism.tensor"));
  const absl::Status product = ValidateLayout({2, 2, 2}, 4);
  EXPECT_EQ(product.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(product.message()), HasSubstr("= 8 ranks, but the job has 4"));
}

int Sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

TEST(SplitLayersTest, EvenWhenItDivides) {
  EXPECT_THAT(SplitLayers(8, 4).value(), ElementsAre(2, 2, 2, 2));
  EXPECT_THAT(SplitLayers(5, 1).value(), ElementsAre(5));
}

TEST(SplitLayersTest, ASlowStageGetsFewerBlocksInProportionToItsSpeed) {
  // Stage 1 computes 3x slower: 6 + 2 blocks cost 6 and 6.
  EXPECT_THAT(SplitLayers(8, 2, 0, 0, {1.0, 3.0}).value(), ElementsAre(6, 2));
  EXPECT_THAT(SplitLayers(8, 2, 0, 0, {3.0, 1.0}).value(), ElementsAre(2, 6));
  // Every stage keeps a block however slow.
  EXPECT_THAT(SplitLayers(4, 2, 0, 0, {1.0, 50.0}).value(), ElementsAre(3, 1));
  // Factors of 1 are the even split; the extras still count, scaled.
  EXPECT_EQ(SplitLayers(12, 4, 0.5, 2, {1, 1, 1, 1}).value(), SplitLayers(12, 4, 0.5, 2).value());
  // The first stage takes the fewest blocks that keep the optimum (3).
  EXPECT_THAT(SplitLayers(8, 4, 0, 0, {1, 1, 2, 1}).value(), ElementsAre(1, 3, 1, 3));
  EXPECT_FALSE(SplitLayers(8, 2, 0, 0, {1.0}).ok());
  EXPECT_FALSE(SplitLayers(8, 2, 0, 0, {1.0, 0.0}).ok());
  EXPECT_FALSE(SplitLayers(8, 2, 0, 0, {1.0, std::nan("")}).ok());
}

TEST(SplitLayersTest, UnevenSplitsKeepTheMostExpensiveStageSmallest) {
  EXPECT_THAT(SplitLayers(3, 2).value(), ElementsAre(1, 2));
  // BLOOM-176B: 70 layers on 12 stages; the bottleneck is ceil(70/12) = 6.
  const std::vector<int> bloom = SplitLayers(70, 12).value();
  ASSERT_EQ(bloom.size(), 12u);
  EXPECT_EQ(Sum(bloom), 70);
  EXPECT_EQ(*std::max_element(bloom.begin(), bloom.end()), 6);
  EXPECT_GE(*std::min_element(bloom.begin(), bloom.end()), 1);
}

TEST(SplitLayersTest, EmbeddingAndHeadCostsMoveBlocksToMiddleStages) {
  // 10 blocks on 4 stages with the head worth 2 blocks on the last stage:
  // the best bottleneck is 3 (e.g. 3, 3, 3, 1 + 2).
  const std::vector<int> split = SplitLayers(10, 4, 0, 2).value();
  EXPECT_THAT(split, ElementsAre(3, 3, 3, 1));
  // Embedding worth 1 block on the first stage and head worth 1 on the last:
  // 8 blocks on 4 stages, bottleneck 3: 2 + 1, 3, 2, 1 + 1 or similar.
  const std::vector<int> both = SplitLayers(8, 4, 1, 1).value();
  EXPECT_EQ(Sum(both), 8);
  EXPECT_LE(both[0] + 1, 3);
  EXPECT_LE(both[3] + 1, 3);
  EXPECT_LE(both[1], 3);
  EXPECT_LE(both[2], 3);
}

// Among splits with the same bottleneck, the first stage (which holds p
// micro-batches' activations under 1F1B) gets as few blocks as it can.
TEST(SplitLayersTest, TheFirstStageTakesTheFewestBlocksTheOptimumAllows) {
  // Llama 3 405B: 126 blocks on 16 stages, the LM head worth 0.6 of a block
  // on the last: Meta's split, one block off the first and the last stage.
  const std::vector<int> llama = SplitLayers(126, 16, 0, 0.6).value();
  EXPECT_THAT(llama, ElementsAre(7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7));
  // No costs beyond the blocks: the short stage goes first.
  EXPECT_THAT(SplitLayers(7, 2).value(), ElementsAre(3, 4));
  // The bottleneck never grows for it: with a head the 4 must go first.
  EXPECT_THAT(SplitLayers(7, 2, 0, 0.5).value(), ElementsAre(4, 3));
}

TEST(SplitLayersTest, RejectsImpossibleSplits) {
  EXPECT_EQ(SplitLayers(2, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(SplitLayers(2, 3).status().message()),
              HasSubstr("every stage needs at least one block"));
  EXPECT_EQ(SplitLayers(4, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitLayers(4, 2, -1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SplitLayersTest, FirstBlockOfStage) {
  const std::vector<int> split = {3, 2, 2};
  EXPECT_EQ(FirstBlockOfStage(split, 0), 0);
  EXPECT_EQ(FirstBlockOfStage(split, 1), 3);
  EXPECT_EQ(FirstBlockOfStage(split, 2), 5);
}

TEST(CheckInterleavingTest, NamesTheRuleThatFails) {
  EXPECT_TRUE(CheckInterleaving(40, 1, 1, 7).ok());  // not interleaved: nothing to check
  EXPECT_TRUE(CheckInterleaving(40, 4, 0, 0).ok());
  EXPECT_TRUE(CheckInterleaving(40, 4, 5, 8).ok());  // 10 layers per stage, 2 chunks of 5
  EXPECT_TRUE(CheckInterleaving(40, 4, 5, 0).ok());  // micro-batches not known yet
  EXPECT_EQ(CheckInterleaving(40, 1, 2, 4).message(),
            "interleaving needs more than one pipeline stage");
  EXPECT_EQ(CheckInterleaving(70, 12, 2, 24).message(),
            "interleaving needs equal stages, but 12 pipeline stages do not divide the 70 layers");
  EXPECT_EQ(CheckInterleaving(40, 4, 3, 8).message(), "3 does not divide the 10 layers per stage");
  EXPECT_EQ(CheckInterleaving(40, 4, 2, 6).message(),
            "the interleaved schedule needs the 6 micro-batches per replica to be a multiple of "
            "the 4 pipeline stages");
  EXPECT_EQ(CheckInterleaving(40, 4, 2, 6).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
