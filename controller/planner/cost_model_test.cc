#include "controller/planner/cost_model.h"

#include <algorithm>
#include <vector>

#include "controller/planner/test_models.h"
#include "gmock/gmock.h"
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

// Fewer key/value heads than tensor ranks: the layout is valid (each head
// is copied to tp / n_kv_head ranks) and each rank holds a whole head's
// key and value rows instead of 1 / tp of them.
TEST(MemoryTest, KeyValueHeadsFewerThanTensorRanksAreCopied) {
  ModelSpec model = MegatronGpt("gqa", 40, 6144, 48);
  model.n_kv_head = 2;
  const ClusterTopology topo = A100s(32, 8);
  const CostModel cost = MakeCost(model, 1024, topo);
  const ParameterCount params = CountParameters(model);
  Layout layout;
  layout.tp = 8;
  layout.pp = 4;
  layout.dp = 8;
  ASSERT_TRUE(cost.CheckLayout(layout).ok()) << cost.CheckLayout(layout);
  const double h_kv = 6144.0 * 2 / 48;
  const double kv = 2 * (h_kv * 6144 + h_kv);  // key and value weights and biases
  const double layer = static_cast<double>(params.per_layer - params.per_layer_norm) / 8 +
                       static_cast<double>(params.per_layer_norm) + kv / 2 - kv / 8;
  EXPECT_NEAR(cost.Memory(layout).parameters, 10 * layer + 51200.0 * 6144 / 8 + 2048.0 * 6144, 1);
  // Three heads under four ranks would share heads unevenly.
  model.n_kv_head = 3;
  model.n_head = 48;
  const CostModel three = MakeCost(model, 1024, topo);
  layout.tp = 4;
  layout.dp = 16;
  const absl::Status uneven = three.CheckLayout(layout);
  EXPECT_EQ(uneven.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(uneven.message()), ::testing::HasSubstr("do not divide one another"));
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
  // Outside the blocks, per micro-batch: the vocabulary-parallel
  // embedding's sum and the head input's gradient (an activation each) and
  // the cross-entropy's three per-token sums; once a step, the gradient
  // norm's.
  const double per_token = RingAllReduceSeconds(2048.0 * 4, 8, 300e9, 3e-6);
  const double outside = 2 * one + 3 * per_token;
  const double norm = RingAllReduceSeconds(8.0, 8, 300e9, 3e-6);
  const TimeBreakdown none = cost.Time(layout);
  // m = 32 micro-batches
  EXPECT_NEAR(none.tensor_parallel_comm, 32 * (40 * 4 * one + outside) + norm, 1e-9);
  layout.recompute = Recompute::kFull;
  EXPECT_NEAR(cost.Time(layout).tensor_parallel_comm, 32 * (40 * 6 * one + outside) + norm, 1e-9);
  // With stages, the first has the embedding's and the last the head's.
  layout.recompute = Recompute::kNone;
  layout.pp = 2;
  layout.dp = 16;
  const TimeBreakdown staged = cost.Time(layout);
  ASSERT_EQ(staged.bottleneck_stage, 1);
  EXPECT_NEAR(staged.tensor_parallel_comm,
              64 * (20 * 4 * one + one + 3 * per_token) + norm, 1e-9);
}

// What CPU workers measured a tensor-parallel collective to cost beyond its
// ring time is added to each one inside a node; a group that spans nodes
// does not get it.
TEST(TimeTest, MeasuredExtraPerTensorParallelCollectiveInsideANode) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  ClusterTopology topo = A100s(32, 8);
  topo.intra_node_collective_extra_seconds = 2e-4;
  const CostModel cost = MakeCost(model, 1024, topo);
  Layout layout;
  layout.tp = 8;
  layout.dp = 32;
  const double one = RingAllReduceSeconds(2048.0 * 6144 * 2, 8, 300e9, 3e-6) + 2e-4;
  const double per_token = RingAllReduceSeconds(2048.0 * 4, 8, 300e9, 3e-6) + 2e-4;
  const double norm = RingAllReduceSeconds(8.0, 8, 300e9, 3e-6) + 2e-4;
  EXPECT_NEAR(cost.Time(layout).tensor_parallel_comm,
              32 * (40 * 4 * one + 2 * one + 3 * per_token) + norm, 1e-9);
  ClusterTopology small_nodes = A100s(64, 4);
  small_nodes.intra_node_collective_extra_seconds = 2e-4;
  const CostModel across = MakeCost(model, 1024, small_nodes);
  const TimeBreakdown spanning = across.Time(layout);
  small_nodes.intra_node_collective_extra_seconds = 0;
  EXPECT_DOUBLE_EQ(spanning.tensor_parallel_comm,
                   MakeCost(model, 1024, small_nodes).Time(layout).tensor_parallel_comm);
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

// A device that measured what a layer costs beyond its FLOPs (CPU ranks:
// worker/engine/block_probe.h) pays it per layer and micro-batch: the fixed
// part plus the per-element part times the [b s, h] activation, with full
// recompute a third more of it.
TEST(TimeTest, MeasuredLayerCostsAddToComputePerLayerAndMicroBatch) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  ClusterTopology topo = A100s(32, 8);
  const CostModel flops_only = MakeCost(model, 1024, topo);
  topo.device.layer_fixed_seconds = 1e-3;
  topo.device.layer_seconds_per_activation = 1e-9;
  const CostModel measured = MakeCost(model, 1024, topo);
  Layout layout;
  layout.tp = 8;
  layout.dp = 32;
  // m = 1024 / 32 = 32 micro-batches of 1 x 2048 tokens, 40 layers.
  const double per_layer = 1e-3 + 1e-9 * 2048 * 6144;
  EXPECT_NEAR(measured.Time(layout).compute - flops_only.Time(layout).compute,
              32 * 40 * per_layer, 1e-9);
  layout.recompute = Recompute::kFull;
  const TimeBreakdown full = measured.Time(layout);
  const TimeBreakdown full_flops = flops_only.Time(layout);
  EXPECT_NEAR(full.compute - full_flops.compute, 32 * 40 * per_layer * 4 / 3, 1e-9);
  EXPECT_NEAR(full.recompute - full_flops.recompute, 32 * 40 * per_layer / 3, 1e-9);
}

// On a CPU rank the checkpoint writer's staging buffer (fp32 parameters and
// the rank's shard of the AdamW moments, kept between saves) is in the
// same memory as the model; on a GPU it is host memory and not counted.
TEST(MemoryTest, CpuRanksCountTheCheckpointStagingBuffer) {
  const ModelSpec model = MegatronGpt("gpt", 8, 1024, 16);
  LocalCpuMeasurement measured;
  measured.peak_flops_fp32 = 1e11;
  measured.memory_bytes = 64000000000;
  measured.memory_bandwidth_bytes_per_second = 1e10;
  ClusterTopology cpus;
  cpus.nodes = 1;
  cpus.devices_per_node = 4;
  cpus.device = *LocalCpuDevice(measured);
  cpus.intra_node_bandwidth_bytes_per_second = 1e10;
  TrainingSpec training;
  training.global_batch_sequences = 8;
  training.precision = Precision::kFp32;
  absl::StatusOr<CostModel> cost = CostModel::Create(model, training, cpus, CostOptions{});
  ASSERT_TRUE(cost.ok()) << cost.status();
  Layout layout;
  layout.dp = 4;
  const MemoryBreakdown zero0 = cost->Memory(layout);
  EXPECT_DOUBLE_EQ(zero0.checkpoint_staging, zero0.parameters * (4 + 8));
  layout.zero_stage = 1;
  const MemoryBreakdown zero1 = cost->Memory(layout);
  EXPECT_DOUBLE_EQ(zero1.checkpoint_staging, zero1.parameters * (4 + 8.0 / 4));
  EXPECT_GT(zero0.total(), zero0.state() + zero0.working() + zero0.reserve);
  // A GPU's host buffers are not its memory.
  const CostModel gpus = MakeCost(model, 8, A100s(1, 4));
  EXPECT_EQ(gpus.Memory(layout).checkpoint_staging, 0);
}

// CPU ranks: 4 on one node, fp32, measured-looking figures.
absl::StatusOr<CostModel> CpuCost(double ranks_per_core, int shared_host_cores = 1,
                                  double collective_idle_fraction = 0) {
  LocalCpuMeasurement measured;
  measured.peak_flops_fp32 = 1e11;
  measured.memory_bytes = 64000000000;
  measured.memory_bandwidth_bytes_per_second = 1e10;
  measured.ranks_per_core = ranks_per_core;
  measured.shared_host_cores = shared_host_cores;
  measured.collective_idle_fraction = collective_idle_fraction;
  absl::StatusOr<DeviceSpec> device = LocalCpuDevice(measured);
  if (!device.ok()) return device.status();
  ClusterTopology cpus;
  cpus.nodes = 1;
  cpus.devices_per_node = 4;
  cpus.device = *device;
  cpus.intra_node_bandwidth_bytes_per_second = 5e8;  // Gloo on loopback
  cpus.intra_node_latency_seconds = 2e-4;
  TrainingSpec training;
  training.global_batch_sequences = 8;
  training.precision = Precision::kFp32;
  return CostModel::Create(MegatronGpt("gpt", 4, 256, 4), training, cpus, CostOptions{});
}

// Gloo's threads compute on the ranks' cores: the planner credits no
// overlap of the data-parallel all-reduce with backward on CPU ranks.
TEST(CpuTimeTest, CollectivesOnComputeCoresHideNothing) {
  absl::StatusOr<CostModel> cpu = CpuCost(1);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  Layout layout;
  layout.dp = 4;
  const TimeBreakdown t = cpu->Time(layout);
  ASSERT_GT(t.data_parallel_comm, 0);
  EXPECT_DOUBLE_EQ(t.data_parallel_exposed, t.data_parallel_comm);
  // A GPU overlaps (dp_overlap_fraction 0.5 of it, as far as backward lasts).
  const CostModel gpus = MakeCost(MegatronGpt("gpt", 4, 256, 4), 8, A100s(1, 4));
  const TimeBreakdown g = gpus.Time(layout);
  EXPECT_LT(g.data_parallel_exposed, g.data_parallel_comm);
}

// Ranks time-sharing cores: while one waits on a neighbour stage another
// computes, so the step is the longer of one rank's own path and the
// host's work per core, its collectives included.
// Ranks time-sharing a host's cores: a rank's own step stretched by the
// expected number of busy ranks per core while it is busy (processor
// sharing, each of the others busy with the rank's own busy fraction).
TEST(CpuTimeTest, TimeSharedCoresStretchTheStepByTheBusyRanksPerCore) {
  Layout layout;
  layout.tp = 2;
  layout.pp = 2;
  absl::StatusOr<CostModel> own = CpuCost(1);
  ASSERT_TRUE(own.ok()) << own.status();
  const TimeBreakdown alone = own->Time(layout);
  ASSERT_GT(alone.tensor_parallel_comm, 0);
  ASSERT_GT(alone.pipeline_bubble, 0);
  const double comm = alone.tensor_parallel_comm + alone.pipeline_p2p + alone.data_parallel_exposed;

  // Two ranks on one core, every collective holding it: the other is busy
  // with probability beta, doubling the rank's time then: own x (1 + beta),
  // the rank's own step plus its busy time.
  absl::StatusOr<CostModel> one_core = CpuCost(2);
  ASSERT_TRUE(one_core.ok());
  const double busy = alone.step() - alone.pipeline_bubble;
  EXPECT_NEAR(one_core->Time(layout).step(), alone.step() + busy, 1e-12);
  // Not twice the whole step: the bubble is filled by the other rank.
  EXPECT_LT(one_core->Time(layout).step(), 2 * alone.step());

  // Half of each collective spent waiting off the CPU holds no core.
  absl::StatusOr<CostModel> waits = CpuCost(2, 1, 0.5);
  ASSERT_TRUE(waits.ok());
  const double busy_less = busy - 0.5 * comm;
  EXPECT_NEAR(waits->Time(layout).step(), alone.step() + busy_less, 1e-12);

  // Four ranks on two cores (TP2 x PP2 on this project's machine).
  absl::StatusOr<CostModel> two_cores = CpuCost(2, 2, 0.5);
  ASSERT_TRUE(two_cores.ok());
  const double beta = busy_less / alone.step();
  const double q = 1 - beta;
  // 0, 1, 2 or 3 others busy: stretch 1, 1, 1.5, 2.
  const double stretch = q * q * q + 3 * beta * q * q + 3 * beta * beta * q * 1.5 +
                         beta * beta * beta * 2;
  EXPECT_NEAR(two_cores->Time(layout).step(), alone.step() * stretch, 1e-12);
  EXPECT_GT(two_cores->Time(layout).step(), 2 * busy_less);  // the host's work per core

  EXPECT_FALSE(CpuCost(0.5).ok());
  EXPECT_FALSE(CpuCost(2, 0).ok());
  EXPECT_FALSE(CpuCost(2, 2, 1.5).ok());
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
            "needs 112.0 GB per device before activations, device has 85.9 GB");
}

TEST(FeasibilityTest, ReasonWithActivations) {
  const CostModel cost = MakeCost(test_models::Gpt2Xl(), 64, A100s(1, 1));
  Layout layout;
  layout.micro_batch = 64;  // no recompute, 64 sequences at once
  const LayoutEvaluation eval = cost.Evaluate(layout);
  EXPECT_FALSE(eval.fits);
  EXPECT_NE(eval.infeasible_reason.find("GB activations), device has 85.9 GB of which 5.3 GB is "
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
  layout.zero_stage = 3;  // ZeRO-2/3 with pipeline parallelism is a layout
  EXPECT_TRUE(cost.CheckLayout(layout).ok());
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
  // Stages may be uneven (40 layers on 64), but each needs a layer.
  layout.tp = 1;
  layout.pp = 64;
  layout.dp = 4;
  layout.virtual_stages = 1;
  EXPECT_EQ(cost.CheckLayout(layout).message(),
            "layout.pp: 64 exceeds model.n_layer 40: every stage needs at least one layer");
  layout.pp = 32;
  layout.dp = 8;
  EXPECT_TRUE(cost.CheckLayout(layout).ok());
  layout.virtual_stages = 2;
  EXPECT_EQ(std::string(cost.CheckLayout(layout).message()),
            "layout.virtual_stages: interleaving needs equal stages, but 32 pipeline stages do "
            "not divide the 40 layers");
}

// A model whose LM head costs less than a block (V < 12h + 2s): 3 layers on
// 2 stages split 2 + 1, as the engine splits them, and the pipeline runs at
// the pace of the 2-layer stage.
ModelSpec ThreeLayers() {
  ModelSpec model = MegatronGpt("three", 3, 1024, 16);
  model.vocab_size = 4096;
  model.seq_len = 1024;
  return model;
}

TEST(UnevenStagesTest, ThreeLayersOnTwoStagesAreCostedByTheTwoLayerStage) {
  const ModelSpec model = ThreeLayers();
  const CostModel cost = MakeCost(model, 8, A100s(1, 2));
  EXPECT_EQ(cost.StageLayers(2), (std::vector<int>{2, 1}));
  Layout layout;
  layout.pp = 2;
  ASSERT_TRUE(cost.CheckLayout(layout).ok());
  const TimeBreakdown time = cost.Time(layout);
  EXPECT_EQ(time.bottleneck_stage, 0);
  EXPECT_EQ(time.bottleneck_layers, 2);
  // m = 8 micro-batches of one sequence, each 3 x forward of 2 blocks and no
  // LM head (it is on the other stage).
  const ForwardFlops forward = ForwardFlopsPerSequence(model);
  const double rate = cost.peak_flops() * time.gemm_efficiency;
  EXPECT_NEAR(time.compute, 8 * 3 * 2 * forward.per_layer / rate, 1e-12);
  // The same stage holds the most memory: 2 layers x 2 micro-batches in flight.
  const MemoryBreakdown memory = cost.Memory(layout);
  EXPECT_EQ(memory.stage, 0);
  EXPECT_EQ(memory.layers, 2);
  const double per_layer = ActivationBytesPerLayer(model, 1, 1, false, Recompute::kNone, 2.0,
                                                   Kernels{AttentionKernel::kFused});
  EXPECT_NEAR(memory.activations, 2 * 2 * per_layer + 1024.0 * 1024 * 2, 1);

  // Costed like the 2-layer stage of an even 4-layer model, less its head.
  ModelSpec four = model;
  four.n_layer = 4;
  const TimeBreakdown even = MakeCost(four, 8, A100s(1, 2)).Time(layout);
  EXPECT_EQ(even.bottleneck_stage, 1);  // equal stages: the head decides
  EXPECT_NEAR(even.compute - time.compute, 8 * 3 * forward.logits / rate, 1e-12);
}

TEST(UnevenStagesTest, TheHeadMovesLayersOffTheLastStage) {
  // Bloom-176B's 70 layers on 12 stages, its head worth 1.4 blocks.
  ModelSpec bloom = MegatronGpt("bloom", 70, 14336, 112);
  bloom.vocab_size = 250880;
  bloom.learned_position_embedding = false;
  const CostModel cost = MakeCost(bloom, 2048, A100s(48, 8));
  EXPECT_EQ(cost.StageLayers(12), (std::vector<int>{6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 4}));
  Layout layout;
  layout.tp = 4;
  layout.pp = 12;
  layout.dp = 8;
  layout.recompute = Recompute::kFull;
  ASSERT_TRUE(cost.CheckLayout(layout).ok());
  const TimeBreakdown time = cost.Time(layout);
  EXPECT_EQ(time.bottleneck_layers, 6);
  EXPECT_LT(time.bottleneck_stage, 11);
}

// Megatron-LM's counts (Korthikanti et al. 2022) charge 5as^2b per layer for
// the attention scores; the engine's fused attention stores none, and the
// cost model follows the engine unless told otherwise.
TEST(MemoryTest, FusedAttentionIsTheDefault) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  CostOptions unfused_options;
  unfused_options.kernels.attention = AttentionKernel::kUnfused;
  const CostModel fused = MakeCost(model, 1024, A100s(32, 8));
  const CostModel unfused = MakeCost(model, 1024, A100s(32, 8), unfused_options);
  Layout layout;
  layout.tp = 8;
  layout.pp = 4;
  layout.dp = 8;
  const double s = 2048, a = 48, t = 8;
  // 10 layers x 4 micro-batches in flight on the first stage.
  EXPECT_NEAR(unfused.Memory(layout).activations - fused.Memory(layout).activations,
              40 * (5 * a * s * s / t - 4 * a * s / t), 1e3);
}

// Unfused attention also costs time: its score passes run at device-memory
// bandwidth, on every layer of the bottleneck stage, every micro-batch.
TEST(TimeTest, UnfusedAttentionChargesItsScorePassesAgainstMemoryBandwidth) {
  const ModelSpec model = MegatronGpt("gpt", 24, 2304, 24);
  CostOptions unfused_options;
  unfused_options.kernels.attention = AttentionKernel::kUnfused;
  const CostModel fused = MakeCost(model, 512, A100s(4, 8));
  const CostModel unfused = MakeCost(model, 512, A100s(4, 8), unfused_options);
  Layout layout;
  layout.dp = 32;
  layout.micro_batch = 16;
  layout.recompute = Recompute::kFull;
  const double per_layer = UnfusedScoreTrafficBytes(model, 16, 1, Recompute::kFull, 2.0,
                                                    unfused_options.kernels);
  const double passes = 24 * per_layer / A100s(4, 8).device.hbm_bandwidth_bytes_per_second;
  const TimeBreakdown before = fused.Time(layout), after = unfused.Time(layout);
  EXPECT_EQ(after.micro_batches, 1);
  EXPECT_NEAR(after.compute - before.compute, passes, 1e-9);
  // A third of the passes (the rerun forward: 9 of 29 bytes) is recompute.
  EXPECT_NEAR(after.recompute - before.recompute, passes * 9 / 29, 1e-9);
}

// Without Megatron-LM's scatter/gather every TP rank sends the whole
// activation between stages (DeepSpeed's pipeline engine); sequence
// parallelism splits it anyway.
TEST(TimeTest, PipelineSendsWithoutScatterGatherCarryTheWholeActivation) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  CostOptions whole_options;
  whole_options.pipeline_scatter_gather = false;
  const CostModel split = MakeCost(model, 1024, A100s(32, 8));
  const CostModel whole = MakeCost(model, 1024, A100s(32, 8), whole_options);
  Layout layout;
  layout.tp = 8;
  layout.pp = 4;
  layout.dp = 8;
  layout.recompute = Recompute::kFull;
  const TimeBreakdown a = split.Time(layout), b = whole.Time(layout);
  EXPECT_GT(b.pipeline_p2p, 4 * a.pipeline_p2p);
  EXPECT_DOUBLE_EQ(b.compute, a.compute);
  layout.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(whole.Time(layout).pipeline_p2p, split.Time(layout).pipeline_p2p);
}

// ZeRO-3 with pipeline parallelism: parameters sharded over the DP group,
// one layer gathered at a time, and 1.5x ZeRO-2's communication.
TEST(ZeroThreeTest, GathersOneLayerAndCostsHalfAgainAReduceScatterAndAllGather) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  CostOptions options;
  options.dp_overlap_fraction = 0;
  // 8 sequences over dp 8: one micro-batch of one sequence per replica.
  const CostModel cost = MakeCost(model, 8, A100s(32, 8), options);
  Layout layout;
  layout.tp = 8;
  layout.pp = 4;
  layout.dp = 8;
  layout.recompute = Recompute::kFull;
  layout.zero_stage = 2;
  ASSERT_TRUE(cost.CheckLayout(layout).ok());
  const MemoryBreakdown two = cost.Memory(layout);
  layout.zero_stage = 1;
  const TimeBreakdown one_time = cost.Time(layout);
  layout.zero_stage = 2;
  EXPECT_EQ(two.gathered_parameters, 0);
  EXPECT_NEAR(two.weights, 2 * two.parameters, 1);
  layout.zero_stage = 3;
  ASSERT_TRUE(cost.CheckLayout(layout).ok());
  const MemoryBreakdown three = cost.Memory(layout);
  const TimeBreakdown three_time = cost.Time(layout);
  EXPECT_NEAR(three.weights, 2 * three.parameters / 8, 1);
  // The largest unit gathered is a block's TP shard (12 h^2 / 8 + biases:
  // 56.6M, more than the 51.9M of the embedding shard with positions or
  // the 39.3M of the head's), in bf16.
  const ParameterCount params = CountParameters(model);
  const double block = static_cast<double>(params.per_layer - params.per_layer_norm) / 8 +
                       static_cast<double>(params.per_layer_norm);
  EXPECT_GT(block, 51200.0 * 6144 / 8 + 2048.0 * 6144);
  EXPECT_NEAR(three.gathered_parameters, 2 * block, 1);
  EXPECT_NEAR(three.total(),
              three.state() + three.activations + three.recompute_workspace + three.logits +
                  three.gathered_parameters + three.reserve,
              1);
  // ZeRO-3 all-gathers the bf16 weights in forward and backward and
  // reduce-scatters the bf16 gradients, 3 x (d-1)/d, against the
  // 2 x (d-1)/d of a reduce-scatter and an all-gather (Rajbhandari et al.
  // 2020, Sec. 7.2.2; ZeRO-1 here, as ZeRO-2 reduces to owners instead).
  ASSERT_EQ(three_time.micro_batches, 1);
  // Both also sum the loss and the gradient norm over the DP group once a
  // step (8 bytes each, across nodes here).
  const double sums = 2 * RingAllReduceSeconds(8.0, 8, A100s(32, 8).inter_node_bandwidth_bytes_per_second,
                                               A100s(32, 8).inter_node_latency_seconds);
  EXPECT_NEAR((three_time.data_parallel_comm - sums) / (one_time.data_parallel_comm - sums), 1.5,
              1e-3);
  // Without data parallelism there is nothing to gather.
  const CostModel alone = MakeCost(model, 8, A100s(4, 8), options);
  layout.dp = 1;
  EXPECT_EQ(alone.Memory(layout).gathered_parameters, 0);
}

// ZeRO-2 holds its gradient shard plus the buckets in flight to their
// owners (three of 25 MiB), never more than the unsharded gradients; ZeRO-1
// holds them all.
TEST(ZeroTwoTest, GradientsAreTheShardPlusBucketsInFlight) {
  const ModelSpec model = MegatronGpt("gpt", 40, 6144, 48);
  const CostModel cost = MakeCost(model, 8, A100s(32, 8));
  Layout layout;
  layout.tp = 8;
  layout.pp = 4;
  layout.dp = 8;
  layout.recompute = Recompute::kFull;
  layout.zero_stage = 1;
  ASSERT_TRUE(cost.CheckLayout(layout).ok());
  const MemoryBreakdown one = cost.Memory(layout);
  layout.zero_stage = 2;
  const MemoryBreakdown two = cost.Memory(layout);
  ASSERT_GT(one.gradients, 0);
  EXPECT_NEAR(two.gradients, one.gradients / 8 + 3 * 25.0 * (1 << 20), 1);
  // A tiny model: the buckets would be larger than its gradients.
  const CostModel tiny = MakeCost(MegatronGpt("tiny", 2, 64, 2), 8, A100s(1, 8));
  Layout small;
  small.dp = 8;
  small.zero_stage = 1;
  const double whole = tiny.Memory(small).gradients;
  small.zero_stage = 2;
  EXPECT_NEAR(tiny.Memory(small).gradients, whole, 1e-6 * whole);
}

// A layout that does not fit cannot run: the evaluation says why and has no
// step time, throughput or MFU.
TEST(FeasibilityTest, InfeasibleLayoutsHaveNoEstimates) {
  const CostModel cost = MakeCost(Gpt7B(), 8, A100s(1, 1));
  const LayoutEvaluation eval = cost.Evaluate(Layout{});
  ASSERT_FALSE(eval.fits);
  EXPECT_FALSE(eval.infeasible_reason.empty());
  EXPECT_GT(eval.memory.total(), eval.memory.capacity);
  EXPECT_EQ(eval.step.step_seconds, 0);
  EXPECT_EQ(eval.step.tokens_per_second, 0);
  EXPECT_EQ(eval.step.mfu, 0);
  EXPECT_EQ(eval.time.step(), 0);
  EXPECT_EQ(eval.run.train_seconds, 0);
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
