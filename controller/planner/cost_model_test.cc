#include "controller/planner/cost_model.h"

#include "controller/planner/test_models.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

using test_models::Gpt7B;
using test_models::MegatronGpt;

ClusterTopology A100s(int nodes, int per_node, double network_bytes_per_second = 25e9) {
  absl::StatusOr<ClusterTopology> topo =
      MakeTopology("A100-80GB", nodes, per_node, network_bytes_per_second);
  EXPECT_TRUE(topo.ok()) << topo.status();
  return *topo;
}

CostModel MakeCost(const ModelSpec& model, int64_t batch, const ClusterTopology& topo,
                   CostOptions options = {}) {
  TrainingSpec training;
  training.global_batch_sequences = batch;
  absl::StatusOr<CostModel> cost = CostModel::Create(model, training, topo, options);
  EXPECT_TRUE(cost.ok()) << cost.status();
  return *cost;
}

// The chapter's network wall (lines 1501-1512) through the full model.
TEST(NetworkWallTest, TheCostModelChargesTheSameAllReduce) {
  // A 7B model data-parallel over 8 single-device nodes at 100 Gb/s, no
  // overlap: the exposed DP time is the ring all-reduce of its fp16 grads.
  CostOptions options;
  options.dp_overlap_fraction = 0;
  const ClusterTopology topo = A100s(8, 1, 100e9 / 8);
  const CostModel cost = MakeCost(Gpt7B(), 64, topo, options);
  Layout layout;
  layout.dp = 8;
  ASSERT_TRUE(cost.CheckLayout(layout).ok());
  const TimeBreakdown time = cost.Time(layout);
  const double grads = 2.0 * 7000031232.0;  // 14.0 GB
  EXPECT_NEAR(time.data_parallel_comm, 1.96, 0.01 * 1.96);
  EXPECT_NEAR(time.data_parallel_comm, 1.75 * grads / 12.5e9, 0.001);
  EXPECT_DOUBLE_EQ(time.data_parallel_exposed, time.data_parallel_comm);
}

TEST(MemoryTest, ZeroStagesShardOverDataParallel) {
  // Rajbhandari et al. 2020, Fig. 1: with N_d = 8 and K = 12 for mixed Adam,
  // 16 P -> 4P + 12P/8 -> 2P + 14P/8 -> 16P/8.
  const ClusterTopology topo = A100s(1, 8);
  const CostModel cost = MakeCost(Gpt7B(), 64, topo);
  Layout layout;
  layout.dp = 8;
  double state[4];
  for (int z = 0; z < 4; ++z) {
    layout.zero_stage = z;
    state[z] = cost.StateBytes(layout);
  }
  const double p = 7000031232.0;
  EXPECT_NEAR(state[0], 16 * p, 1e3);
  EXPECT_NEAR(state[1], 4 * p + 12 * p / 8, 1e3);
  EXPECT_NEAR(state[2], 2 * p + 14 * p / 8, 1e3);
  EXPECT_NEAR(state[3], 16 * p / 8, 1e3);
}

TEST(MemoryTest, TensorAndPipelineShardTheParameters) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const ClusterTopology topo = A100s(32, 8);
  const CostModel cost = MakeCost(model, 1024, topo);
  const ParameterCount params = CountParameters(model);
  Layout layout;
  layout.tp = 8;
  layout.pp = 4;
  layout.dp = 8;
  const MemoryBreakdown mem = cost.Memory(layout);
  // The most loaded stage holds 10 layers / 8 plus a vocabulary-parallel
  // embedding (first stage) or head (last stage).
  const double layer = static_cast<double>(params.per_layer - params.per_layer_norm) / 8 +
                       static_cast<double>(params.per_layer_norm);
  EXPECT_NEAR(mem.parameters, 10 * layer + 51200.0 * 6144 / 8 + 2048.0 * 6144, 1);
  EXPECT_NEAR(mem.weights, 2 * mem.parameters, 1);
  EXPECT_NEAR(mem.state(), 16 * mem.parameters, 16);
}

TEST(MemoryTest, OneFOneBHoldsPMicroBatchesOnTheFirstStage) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const CostModel cost = MakeCost(model, 1024, A100s(32, 8));
  Layout layout;
  layout.tp = 8;
  layout.pp = 4;
  layout.dp = 8;
  layout.recompute = Recompute::kFull;
  layout.sequence_parallel = true;
  const MemoryBreakdown mem = cost.Memory(layout);
  ASSERT_EQ(mem.stage, 0);
  const double per_layer = 2.0 * 2048 * 6144 / 8;  // full recompute with SP
  const double embedding_mask = 2048.0 * 6144 * 4 / 8;
  // 10 layers x 4 micro-batches in flight = all 40 layers' worth.
  EXPECT_NEAR(mem.activations, 40 * per_layer + embedding_mask, 1);
  layout.virtual_stages = 2;  // interleaved: x (1 + (p-1)/(p v))
  EXPECT_NEAR(cost.Memory(layout).activations,
              40 * per_layer * (1 + 3.0 / 8) + embedding_mask, 1);
}

TEST(TimeTest, TensorParallelAllReducesPerLayer) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const ClusterTopology topo = A100s(32, 8);
  const CostModel cost = MakeCost(model, 1024, topo);
  Layout layout;
  layout.tp = 8;
  layout.dp = 32;
  const double one = RingAllReduceSeconds(2048.0 * 6144 * 2, 8, 300e9, 3e-6);
  const TimeBreakdown none = cost.Time(layout);
  EXPECT_NEAR(none.tensor_parallel_comm, 32 * 40 * 4 * one, 1e-9);  // m = 32 micro-batches
  layout.recompute = Recompute::kFull;
  EXPECT_NEAR(cost.Time(layout).tensor_parallel_comm, 32 * 40 * 6 * one, 1e-9);
}

TEST(TimeTest, RecomputeCostsTimeButNotMfu) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const CostModel cost = MakeCost(model, 1024, A100s(32, 8));
  Layout layout;
  layout.tp = 8;
  layout.dp = 32;
  const LayoutEvaluation none = cost.Evaluate(layout);
  layout.recompute = Recompute::kFull;
  const LayoutEvaluation full = cost.Evaluate(layout);
  EXPECT_GT(full.step.step_seconds, none.step.step_seconds);
  EXPECT_DOUBLE_EQ(full.step.model_flops_per_step, none.step.model_flops_per_step);
  // 96 vs 72 B s l h^2 for the layers (Narayanan et al. 2021, Sec. 5.1).
  EXPECT_GT(full.step.hardware_flops_per_step, 1.3 * none.step.model_flops_per_step);
  EXPECT_NEAR(full.step.hfu / full.step.mfu,
              full.step.hardware_flops_per_step / full.step.model_flops_per_step, 1e-12);
  EXPECT_GT(full.time.recompute, 0);
}

TEST(TimeTest, PipelineBubbleShrinksWithInterleaving) {
  const ModelSpec model = MegatronGpt("gpt", 80, 12288, 96);
  const CostModel cost = MakeCost(model, 2304, A100s(192, 8));
  Layout layout;
  layout.tp = 8;
  layout.pp = 8;
  layout.dp = 24;
  const TimeBreakdown plain = cost.Time(layout);
  layout.virtual_stages = 2;
  const TimeBreakdown interleaved = cost.Time(layout);
  EXPECT_LT(interleaved.pipeline_bubble, plain.pipeline_bubble);
  EXPECT_GT(interleaved.pipeline_p2p, plain.pipeline_p2p);  // v x the sends
  EXPECT_EQ(plain.micro_batches, 96);
}

TEST(FeasibilityTest, ReasonBeforeActivations) {
  const CostModel cost = MakeCost(Gpt7B(), 8, A100s(1, 1));
  const LayoutEvaluation eval = cost.Evaluate(Layout{});
  EXPECT_FALSE(eval.fits);
  EXPECT_EQ(eval.infeasible_reason,
            "needs 112.0 GB per device before activations, device has 80 GB");
}

TEST(FeasibilityTest, ReasonWithActivations) {
  const CostModel cost = MakeCost(test_models::Gpt2Xl(), 64, A100s(1, 1));
  Layout layout;
  layout.micro_batch = 64;  // no recompute, 64 sequences at once
  const LayoutEvaluation eval = cost.Evaluate(layout);
  EXPECT_FALSE(eval.fits);
  EXPECT_NE(eval.infeasible_reason.find("GB activations), device has 80 GB of which 5.0 GB is "
                                        "reserved"),
            std::string::npos)
      << eval.infeasible_reason;
}

TEST(CheckLayoutTest, ExplainsInvalidLayouts) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const CostModel cost = MakeCost(model, 1024, A100s(32, 8));
  Layout layout;
  layout.tp = 8;
  layout.dp = 16;
  EXPECT_EQ(cost.CheckLayout(layout).message(),
            "layout: tp x pp x dp = 128, but the cluster has 256 devices");
  layout.pp = 2;
  layout.zero_stage = 2;
  EXPECT_EQ(cost.CheckLayout(layout).message(),
            "layout.zero_stage: ZeRO-2 shards gradients that pipeline parallelism accumulates "
            "over micro-batches; use ZeRO-0 or ZeRO-1 with pp > 1");
  layout.zero_stage = 1;
  layout.micro_batch = 3;
  EXPECT_EQ(cost.CheckLayout(layout).message(),
            "layout.micro_batch: 3 does not divide the 64 sequences per replica");
  layout.micro_batch = 1;
  layout.virtual_stages = 3;
  EXPECT_EQ(cost.CheckLayout(layout).message(),
            "layout.virtual_stages: 3 does not divide the 20 layers per stage");
  layout.virtual_stages = 2;
  EXPECT_TRUE(cost.CheckLayout(layout).ok());
  layout.tp = 32;
  layout.dp = 4;
  EXPECT_EQ(cost.CheckLayout(layout).message(), "layout.tp: 32 does not divide model.n_head 48");
}

TEST(CostModelTest, RejectsAPrecisionTheDeviceLacks) {
  TrainingSpec training;
  training.global_batch_sequences = 8;
  training.precision = Precision::kBf16;
  absl::StatusOr<ClusterTopology> v100 = MakeTopology("V100", 1, 8, 0);
  ASSERT_TRUE(v100.ok());
  absl::StatusOr<CostModel> cost = CostModel::Create(Gpt7B(), training, *v100);
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cost.status().message(), "training.precision: V100 has no bf16 peak");
}

}  // namespace
}  // namespace loom::planner
