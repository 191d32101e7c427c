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
// Their counts are for a materialized softmax (kUnfused).
TEST(ActivationTest, KorthikantiEquations) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const double s = 2048, b = 2, h = 6144, a = 48, t = 8;
  const double sbh = s * b * h;
  auto bytes = [&](int tp, bool sp, Recompute r) {
    return ActivationBytesPerLayer(model, 2, tp, sp, r, 2.0, Kernels{AttentionKernel::kUnfused});
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
  EXPECT_NEAR(ActivationBytesPerLayer(model, 2, 1, false, Recompute::kFull, 4.0,
                                      Kernels{AttentionKernel::kUnfused}),
              4 * sbh, 1);
}

// A fused attention kernel (what the engine runs) stores no s x s scores,
// only an fp32 log-sum-exp per head and token (Dao et al. 2022, Alg. 1): the
// 5as/h term of Eqs. 1-3 becomes 4as b bytes, split over the TP group.
TEST(ActivationTest, FusedAttentionKeepsNoScoreMatrix) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const double s = 2048, b = 2, h = 6144, a = 48, t = 8;
  const double sbh = s * b * h;
  auto bytes = [&](int tp, bool sp, Recompute r) {
    return ActivationBytesPerLayer(model, 2, tp, sp, r, 2.0, Kernels{AttentionKernel::kFused});
  };
  const double lse = 4 * a * s * b;
  EXPECT_NEAR(bytes(1, false, Recompute::kNone), 34 * sbh + lse, 1);
  EXPECT_NEAR(bytes(8, false, Recompute::kNone), sbh * (10 + 24 / t) + lse / t, 1);
  EXPECT_NEAR(bytes(8, true, Recompute::kNone), 34 * sbh / t + lse / t, 1);
  // Selective recompute has nothing left to drop.
  EXPECT_DOUBLE_EQ(bytes(8, true, Recompute::kSelective), bytes(8, true, Recompute::kNone));
  // Full recompute keeps only the layer input either way.
  EXPECT_NEAR(bytes(8, false, Recompute::kFull), 2 * sbh, 1);
  // The scores were most of it: at s 2048 the unfused layer is 3.4x larger.
  EXPECT_NEAR(ActivationBytesPerLayer(model, 2, 1, false, Recompute::kNone, 2.0,
                                      Kernels{AttentionKernel::kUnfused}) /
                  bytes(1, false, Recompute::kNone),
              (34 + 5 * a * s / h) / 34, 0.01);
  // The statistics stay fp32 when activations are fp32.
  EXPECT_NEAR(ActivationBytesPerLayer(model, 2, 1, false, Recompute::kNone, 4.0,
                                      Kernels{AttentionKernel::kFused}),
              2 * 34 * sbh + lse, 1);
}

TEST(ActivationTest, GqaStoresSmallerKeysAndValues) {
  ModelSpec mha = MegatronGpt("gpt", 2, 4096, 32);
  ModelSpec gqa = mha;
  gqa.n_kv_head = 8;
  const double sb = 2048.0;
  EXPECT_NEAR(ActivationBytesPerLayer(mha, 1, 1, false, Recompute::kSelective, 2,
                                      Kernels{AttentionKernel::kFused}) -
                  ActivationBytesPerLayer(gqa, 1, 1, false, Recompute::kSelective, 2,
                                          Kernels{AttentionKernel::kFused}),
              4 * sb * (4096 - 1024), 1);
}

// Llama-style training: no dropout masks, and a fused SwiGLU that recomputes
// the activation in backward keeps 3 of the gated MLP's 4 f-wide tensors.
TEST(ActivationTest, KernelsWithoutDropoutOrAStoredGatedActivationKeepLess) {
  ModelSpec model = MegatronGpt("gpt", 2, 4096, 32);
  model.gated_mlp = true;
  const double sb = 2048.0, h = 4096, f = static_cast<double>(FfnHidden(model));
  auto bytes = [&](const Kernels& k) {
    return ActivationBytesPerLayer(model, 1, 1, false, Recompute::kNone, 2.0, k);
  };
  const Kernels eager;
  Kernels no_dropout;
  no_dropout.dropout = false;
  Kernels fused_swiglu;
  fused_swiglu.gated_activation_recomputed = true;
  EXPECT_NEAR(bytes(eager) - bytes(no_dropout), 2 * sb * h, 1);
  EXPECT_NEAR(bytes(eager) - bytes(fused_swiglu), 2 * sb * f, 1);
  // A plain MLP has no gated activation to recompute.
  model.gated_mlp = false;
  EXPECT_DOUBLE_EQ(bytes(eager), bytes(fused_swiglu));
  // Unfused scores without dropout keep only the softmax output, 2as^2b.
  Kernels unfused, unfused_no_dropout;
  unfused.attention = unfused_no_dropout.attention = AttentionKernel::kUnfused;
  unfused_no_dropout.dropout = false;
  const double a = 32, s = 2048;
  EXPECT_NEAR(bytes(unfused) - bytes(unfused_no_dropout), 2 * sb * h + 3 * a * s * s, 1);
}

// The softmax and dropout passes over materialized scores: 20 bytes per
// score element for forward + backward at 16 bits, 9 more when recompute
// reruns the forward, 10 and 4 without dropout; nothing for fused attention.
TEST(ScoreTrafficTest, CountsTheElementwisePassesOverTheScores) {
  const ModelSpec model = MegatronGpt("gpt", 2, 2304, 24);
  const double elements = 24.0 * 2048 * 2048 * 16 / 2;  // a s^2 b / t
  Kernels k;
  EXPECT_EQ(UnfusedScoreTrafficBytes(model, 16, 2, Recompute::kNone, 2.0, k), 0);
  k.attention = AttentionKernel::kUnfused;
  EXPECT_NEAR(UnfusedScoreTrafficBytes(model, 16, 2, Recompute::kNone, 2.0, k), 20 * elements, 1);
  EXPECT_NEAR(UnfusedScoreTrafficBytes(model, 16, 2, Recompute::kFull, 2.0, k), 29 * elements, 1);
  EXPECT_NEAR(UnfusedScoreTrafficBytes(model, 16, 2, Recompute::kSelective, 2.0, k),
              29 * elements, 1);
  EXPECT_NEAR(UnfusedScoreTrafficBytes(model, 16, 2, Recompute::kNone, 4.0, k), 40 * elements, 1);
  k.dropout = false;
  EXPECT_NEAR(UnfusedScoreTrafficBytes(model, 16, 2, Recompute::kFull, 2.0, k), 14 * elements, 1);
}

}  // namespace
}  // namespace loom::planner
