#include "controller/planner/formulas.h"

#include "controller/planner/test_models.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

using test_models::MegatronGpt;

// The chapter's network wall (lines 1501-1512): 14 GB of fp16 gradients,
// 8 devices one per node, 100 Gb/s.
TEST(NetworkWallTest, RingAllReduceOfFourteenGigabytes) {
  const double seconds = RingAllReduceSeconds(14e9, 8, 100e9 / 8, 0);
  EXPECT_NEAR(seconds * 12.5e9, 24.5e9, 0.01 * 24.5e9);  // 1.75 x 14 GB moved
  EXPECT_NEAR(seconds, 1.96, 0.01 * 1.96);
  EXPECT_NEAR(ComputeFraction(1.0, seconds), 0.338, 0.01 * 0.338);
}

TEST(RingTest, AllGatherIsHalfAnAllReduce) {
  EXPECT_DOUBLE_EQ(RingAllGatherSeconds(8e9, 4, 1e9, 0) * 2, RingAllReduceSeconds(8e9, 4, 1e9, 0));
  EXPECT_EQ(RingAllReduceSeconds(8e9, 1, 1e9, 1), 0);
  EXPECT_DOUBLE_EQ(RingAllReduceSeconds(0, 4, 1e9, 1e-6), 6e-6);  // 2(n-1) hops
}

TEST(PipelineBubbleTest, OneFOneBAndInterleaved) {
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(8, 32, 1), 7.0 / 32);
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(8, 32, 2), 7.0 / 64);
  EXPECT_EQ(PipelineBubbleFraction(1, 32, 1), 0);
}

// Korthikanti et al. 2022, Eqs. 1-3 and Sec. 5, for a GPT (s 2048, h 6144, a 48).
TEST(ActivationTest, KorthikantiEquations) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const double s = 2048, b = 2, h = 6144, a = 48, t = 8;
  const double sbh = s * b * h;
  auto bytes = [&](int tp, bool sp, Recompute r) {
    return ActivationBytesPerLayer(model, 2, tp, sp, r, 2.0);
  };
  EXPECT_NEAR(bytes(1, false, Recompute::kNone), sbh * (34 + 5 * a * s / h), 1);  // Eq. 1
  EXPECT_NEAR(bytes(8, false, Recompute::kNone),
              sbh * (10 + 24 / t + 5 * a * s / (h * t)), 1);                     // Eq. 2
  EXPECT_NEAR(bytes(8, true, Recompute::kNone), sbh / t * (34 + 5 * a * s / h), 1);  // Eq. 3
  EXPECT_NEAR(bytes(8, true, Recompute::kSelective), 34 * sbh / t, 1);              // Sec. 5
  EXPECT_NEAR(bytes(8, false, Recompute::kSelective), sbh * (10 + 24 / t), 1);
  EXPECT_NEAR(bytes(8, false, Recompute::kFull), 2 * sbh, 1);
  EXPECT_NEAR(bytes(8, true, Recompute::kFull), 2 * sbh / t, 1);
  // fp32 activations take twice the bytes.
  EXPECT_NEAR(ActivationBytesPerLayer(model, 2, 1, false, Recompute::kFull, 4.0), 4 * sbh, 1);
}

TEST(ActivationTest, GqaStoresSmallerKeysAndValues) {
  ModelSpec mha = MegatronGpt("gpt", 2, 4096, 32);
  ModelSpec gqa = mha;
  gqa.n_kv_head = 8;
  const double sb = 2048.0;
  EXPECT_NEAR(ActivationBytesPerLayer(mha, 1, 1, false, Recompute::kSelective, 2) -
                  ActivationBytesPerLayer(gqa, 1, 1, false, Recompute::kSelective, 2),
              4 * sb * (4096 - 1024), 1);
}

}  // namespace
}  // namespace loom::planner
