#include "controller/planner/planner.h"

#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "controller/planner/report.h"
#include "controller/planner/test_models.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

using test_models::Gpt2Small;
using test_models::Gpt2Xl;
using test_models::Gpt7B;
using test_models::kMegatronRows;
using test_models::MegatronGpt;
using test_models::MegatronRow;

PlanRequest Request(const ModelSpec& model, int64_t batch, int nodes, int per_node,
                    const char* device = "A100-80GB", double network = 25e9) {
  PlanRequest request;
  request.model = model;
  request.training.global_batch_sequences = batch;
  request.training.precision = Precision::kBf16;
  absl::StatusOr<ClusterTopology> topo = MakeTopology(device, nodes, per_node, network);
  EXPECT_TRUE(topo.ok()) << topo.status();
  request.topology = *topo;
  return request;
}

// Narayanan et al. 2021, Table 1: A100-80GB, 8 per node with NVSwitch,
// 8 x 200 Gb/s InfiniBand per node (25 GB/s per GPU), seq 2048, mixed Adam.
PlanRequest MegatronRequest(const MegatronRow& row) {
  return Request(MegatronGpt(row.name, row.layers, row.hidden, row.heads), row.batch,
                 row.gpus / 8, 8);
}

// The layout as published: Megatron-LM 2021 ran micro-batch 1, full
// activation recompute, no sequence parallelism, no ZeRO.
Layout Published(const MegatronRow& row) {
  Layout layout;
  layout.tp = row.tp;
  layout.pp = row.pp;
  layout.dp = row.dp;
  layout.micro_batch = 1;
  layout.recompute = Recompute::kFull;
  return layout;
}

class MegatronTest : public ::testing::TestWithParam<MegatronRow> {};

TEST_P(MegatronTest, PublishedLayoutIsReportedFeasible) {
  const MegatronRow& row = GetParam();
  absl::StatusOr<LayoutEvaluation> published = EvaluateLayout(MegatronRequest(row), Published(row));
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_TRUE(published->fits) << published->infeasible_reason;
}

TEST_P(MegatronTest, ChosenLayoutFitsAndIsAtLeastAsFast) {
  const MegatronRow& row = GetParam();
  const PlanRequest request = MegatronRequest(row);
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->best.fits);
  EXPECT_LE(plan->best.memory.total(), plan->best.memory.capacity);

  absl::StatusOr<LayoutEvaluation> published = EvaluateLayout(request, Published(row));
  ASSERT_TRUE(published.ok());
  EXPECT_GE(plan->best.step.tokens_per_second, published->step.tokens_per_second);

  // Also against the published degrees with Loom's best choice of the other
  // knobs (micro-batch, interleaving, recompute, ZeRO, SP).
  PlanRequest fixed = request;
  fixed.options.tp = row.tp;
  fixed.options.pp = row.pp;
  fixed.options.dp = row.dp;
  absl::StatusOr<Plan> published_best = MakePlan(fixed);
  ASSERT_TRUE(published_best.ok()) << published_best.status();
  EXPECT_GE(plan->best.step.tokens_per_second, published_best->best.step.tokens_per_second);
  // For the record: chosen next to published.
  std::printf("%s on %d GPUs: published %s -> %.0f tok/s (MFU %.1f%%); chosen %s -> %.0f tok/s "
              "(MFU %.1f%%), %.1f of %.1f GB per device\n",
              row.name, row.gpus, LayoutToString(Published(row)).c_str(),
              published->step.tokens_per_second, 100 * published->step.mfu,
              LayoutToString(plan->best.layout).c_str(), plan->best.step.tokens_per_second,
              100 * plan->best.step.mfu, plan->best.memory.total() / 1e9,
              plan->best.memory.capacity / 1e9);

  // Every TP group on one node.
  EXPECT_LE(plan->best.layout.tp, 8);
  EXPECT_EQ(plan->placement.tp_groups_within_one_node, plan->placement.tp_groups);
  EXPECT_EQ(static_cast<int>(plan->placement.ranks.size()), row.gpus);
}

INSTANTIATE_TEST_SUITE_P(Table1, MegatronTest, ::testing::ValuesIn(kMegatronRows),
                         [](const ::testing::TestParamInfo<MegatronRow>& param) {
                           return "Row" + std::to_string(param.index);
                         });

TEST(PlannerTest, ModelThatFitsOnOneDeviceIsPureDataParallel) {
  for (const ModelSpec& model : {Gpt2Small(), Gpt2Xl()}) {
    absl::StatusOr<Plan> plan = MakePlan(Request(model, 512, 2, 8));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->best.layout.tp, 1) << model.name;
    EXPECT_EQ(plan->best.layout.pp, 1) << model.name;
    EXPECT_EQ(plan->best.layout.dp, 16) << model.name;
  }
}

TEST(PlannerTest, TensorParallelismStaysInsideANodeUnlessAllowed) {
  // 4 devices per node and a model that wants much model parallelism.
  PlanRequest request = Request(MegatronGpt("gpt", 96, 12288, 96), 64, 16, 4);
  request.options.top_k = 50;
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const LayoutEvaluation& e : plan->top) EXPECT_LE(e.layout.tp, 4);
  for (const ShapeResult& s : plan->shapes) EXPECT_LE(s.best.layout.tp, 4);
  EXPECT_EQ(plan->placement.tp_groups_within_one_node, plan->placement.tp_groups);

  Layout across;
  across.tp = 8;
  across.pp = 8;
  across.recompute = Recompute::kFull;
  absl::StatusOr<LayoutEvaluation> refused = EvaluateLayout(request, across);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "layout.tp: 8 spans 2 nodes; tensor-parallel groups stay inside one node (4 "
            "devices) unless allow_tp_across_nodes is set");

  request.options.allow_tp_across_nodes = true;
  EXPECT_TRUE(EvaluateLayout(request, across).ok());
  absl::StatusOr<Plan> allowed = MakePlan(request);
  ASSERT_TRUE(allowed.ok());
  bool saw_wide_tp = false;
  for (const ShapeResult& s : allowed->shapes) saw_wide_tp |= s.best.layout.tp > 4;
  EXPECT_TRUE(saw_wide_tp);
}

TEST(PlannerTest, InfeasibleOnOneDeviceSaysExactlyWhy) {
  absl::StatusOr<Plan> plan = MakePlan(Request(Gpt7B(), 8, 1, 1));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(plan.status().message(),
            "no layout fits in memory on 1 x A100-80GB: the least memory-hungry, tp 1 | pp 1 | "
            "dp 1 | mb 1 | v 1 | recompute full | ZeRO-0, needs 112.0 GB per device before "
            "activations, device has 85.9 GB");
}

TEST(PlannerTest, InfeasibleOnAClusterNamesTheClosestLayout) {
  // 175B on 8 x 80 GB: even fully sharded the state needs 350 GB per device.
  absl::StatusOr<Plan> plan = MakePlan(Request(MegatronGpt("gpt", 96, 12288, 96), 64, 1, 8));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find("no layout fits in memory on 8 x A100-80GB"),
            std::string::npos);
  EXPECT_NE(plan.status().message().find("GB per device before activations, device has 85.9 GB"),
            std::string::npos);
}

TEST(PlannerTest, NoValidLayoutSaysWhy) {
  // 1 layer, 12 heads, batch 3 on 8 devices: no dp above 1 divides the
  // batch, tp 8 does not divide the heads, and one layer makes one stage.
  // (With 5 layers, tp 2 x pp 4 is valid now that stages may be uneven.)
  absl::StatusOr<Plan> plan = MakePlan(Request(MegatronGpt("tiny", 1, 768, 12), 3, 1, 8));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  // Every candidate shape with its own reason: the layout's dp,
  // not a micro-batch the user never set.
  EXPECT_EQ(plan.status().message(),
            "no valid layout of 8 devices for this model and batch of 3 sequences: "
            "tp 1 x pp 1 x dp 8: dp 8 does not divide the global batch of 3 sequences; "
            "tp 2 x pp 1 x dp 4: dp 4 does not divide the global batch of 3 sequences; "
            "tp 4 x pp 1 x dp 2: dp 2 does not divide the global batch of 3 sequences; "
            "tp 8 x pp 1 x dp 1: tp 8 does not divide model.n_head 12");
}

TEST(PlannerTest, PlansOnTheMeasuredLocalCpu) {
  // examples/gpt-tiny.yaml on two CPU workers that measured 50 GFLOP/s each.
  ModelSpec tiny;
  tiny.n_layer = 4;
  tiny.d_model = 128;
  tiny.n_head = 4;
  tiny.seq_len = 128;
  tiny.vocab_size = 256;
  LocalCpuMeasurement measured{50e9, 8000000000, 20e9, 0};
  absl::StatusOr<DeviceSpec> cpu = LocalCpuDevice(measured);
  ASSERT_TRUE(cpu.ok());
  PlanRequest request;
  request.model = tiny;
  request.training.global_batch_sequences = 16;
  request.training.precision = Precision::kFp32;
  request.topology.nodes = 2;
  request.topology.devices_per_node = 1;
  request.topology.device = *cpu;
  request.topology.inter_node_bandwidth_bytes_per_second = 1.25e9;  // 10 Gb/s
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->best.layout.dp, 2);
  // The measured rate is the achieved rate: compute = FLOPs per replica / peak.
  const double flops_per_replica = ModelFlopsPerStep(tiny, 8);
  EXPECT_NEAR(plan->best.time.compute - plan->best.time.recompute, flops_per_replica / 50e9,
              1e-3 * flops_per_replica / 50e9);
}

// A utilisation above 100% is never predicted: over models from GPT-2 small
// to the 1T Megatron row, on CPUs, A100s and H100s, every layout the plan
// reports (the best, the top ones, the best per shape, each what-if) has
// 0 < MFU <= HFU <= 1 (recompute adds hardware FLOPs, never model FLOPs).
TEST(PlannerTest, NoPlanPredictsAUtilisationAboveOne) {
  std::vector<PlanRequest> requests;
  for (const char* device : {"A100-80GB", "H100-SXM", "H100-PCIe"}) {
    requests.push_back(Request(Gpt2Small(), 64, 1, 8, device));
    requests.push_back(Request(Gpt7B(), 512, 4, 8, device));
    requests.push_back(MegatronRequest(kMegatronRows[0]));
  }
  requests.push_back(MegatronRequest(kMegatronRows[std::size(kMegatronRows) - 1]));
  absl::StatusOr<DeviceSpec> cpu = LocalCpuDevice({50e9, 8000000000, 20e9, 0});
  ASSERT_TRUE(cpu.ok());
  PlanRequest on_cpu = Request(Gpt2Small(), 16, 2, 1);
  on_cpu.model.n_layer = 4;
  on_cpu.model.d_model = 128;
  on_cpu.model.n_head = 4;
  on_cpu.model.seq_len = 128;
  on_cpu.training.precision = Precision::kFp32;
  on_cpu.topology.device = *cpu;
  requests.push_back(on_cpu);
  int checked = 0;
  for (const PlanRequest& request : requests) {
    absl::StatusOr<Plan> plan = MakePlan(request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<const LayoutEvaluation*> all = {&plan->best};
    for (const LayoutEvaluation& e : plan->top) all.push_back(&e);
    for (const ShapeResult& s : plan->shapes) {
      if (s.fits) all.push_back(&s.best);
    }
    for (const WhatIf& w : plan->what_if) {
      if (w.valid && w.evaluation.fits) all.push_back(&w.evaluation);
    }
    for (const LayoutEvaluation* e : all) {
      SCOPED_TRACE(LayoutToString(e->layout));
      EXPECT_GT(e->step.mfu, 0);
      EXPECT_LE(e->step.mfu, e->step.hfu + 1e-12);
      EXPECT_LE(e->step.hfu, 1.0);
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(PlannerTest, PruningDoesNotChangeTheAnswer) {
  PlanRequest request = MegatronRequest(kMegatronRows[1]);
  absl::StatusOr<Plan> pruned = MakePlan(request);
  request.options.prune = false;
  absl::StatusOr<Plan> exhaustive = MakePlan(request);
  ASSERT_TRUE(pruned.ok() && exhaustive.ok());
  EXPECT_EQ(pruned->best.layout, exhaustive->best.layout);
  EXPECT_DOUBLE_EQ(pruned->best.step.step_seconds, exhaustive->best.step.step_seconds);
  ASSERT_EQ(pruned->top.size(), exhaustive->top.size());
  for (size_t i = 0; i < pruned->top.size(); ++i) {
    EXPECT_EQ(pruned->top[i].layout, exhaustive->top[i].layout) << i;
  }
  EXPECT_EQ(pruned->stats.candidates, exhaustive->stats.candidates);
  EXPECT_EQ(pruned->stats.feasible, exhaustive->stats.feasible);
  EXPECT_LT(pruned->stats.fully_evaluated, exhaustive->stats.fully_evaluated);
}

TEST(PlannerTest, TopKIsSortedAndFits) {
  PlanRequest request = MegatronRequest(kMegatronRows[0]);
  request.options.top_k = 7;
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->top.size(), 7u);
  EXPECT_EQ(plan->top[0].layout, plan->best.layout);
  for (size_t i = 1; i < plan->top.size(); ++i) {
    EXPECT_LE(plan->top[i - 1].step.step_seconds, plan->top[i].step.step_seconds);
    EXPECT_TRUE(plan->top[i].fits);
  }
  EXPECT_FALSE(plan->what_if.empty());
  EXPECT_GT(plan->stats.candidates, plan->stats.feasible);
}

TEST(PlannerTest, ConstraintsFixDimensions) {
  PlanRequest request = MegatronRequest(kMegatronRows[0]);
  request.options.tp = 4;
  request.options.recompute = {Recompute::kFull};
  request.options.zero_stages = {0};
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok());
  for (const LayoutEvaluation& e : plan->top) {
    EXPECT_EQ(e.layout.tp, 4);
    EXPECT_EQ(e.layout.recompute, Recompute::kFull);
    EXPECT_EQ(e.layout.zero_stage, 0);
  }
}

TEST(PlannerTest, IronLawEstimatesFollowTheStepTime) {
  PlanRequest request = MegatronRequest(kMegatronRows[0]);
  request.training.token_budget = 300e9;
  request.topology.price_per_device_hour_usd = 2.0;
  request.topology.host_power_watts = 2500;
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok());
  const LayoutEvaluation& best = plan->best;
  const double steps = 300e9 / (1024.0 * 2048);
  EXPECT_NEAR(best.run.train_seconds, steps * best.step.step_seconds, 1e-6 * best.run.train_seconds);
  EXPECT_NEAR(best.run.device_hours, best.run.train_seconds * 256 / 3600, 1e-6 * best.run.device_hours);
  EXPECT_NEAR(best.run.cost_usd, 2.0 * best.run.device_hours, 1e-6 * best.run.cost_usd);
  EXPECT_NEAR(best.run.fleet_power_watts, 256 * 400 + 32 * 2500, 1e-9);
  EXPECT_NEAR(best.run.energy_joules, best.run.fleet_power_watts * best.run.train_seconds,
              1e-6 * best.run.energy_joules);
}

TEST(PlannerTest, ExplicitLayoutThatDoesNotFitIsRejectedWithTheReason) {
  const MegatronRow& row = kMegatronRows[3];
  Layout layout = Published(row);
  layout.recompute = Recompute::kNone;
  absl::StatusOr<LayoutEvaluation> eval = EvaluateLayout(MegatronRequest(row), layout);
  ASSERT_TRUE(eval.ok());
  EXPECT_FALSE(eval->fits);
  EXPECT_NE(eval->infeasible_reason.find("GB activations), device has 85.9 GB"), std::string::npos)
      << eval->infeasible_reason;
}

// BLOOM-176B's 70 layers on 384 A100s returned "no valid layout"
// while pipeline stages had to divide the layers.
TEST(PlannerTest, Bloom176BOn384A100sGetsALayoutWithUnevenStagesAllowed) {
  const PlanRequest request = Request(test_models::Bloom176B(), 2048, 48, 8);
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->best.fits);
  EXPECT_GT(plan->best.step.mfu, 0.3);
  EXPECT_LT(plan->best.step.mfu, 0.7);
  // BigScience's published layout: tp 4, pp 12 (70 layers: 11 stages of 6
  // and one of 4), dp 8, micro-batch 2, ZeRO-1, full recompute.
  Layout published;
  published.tp = 4;
  published.pp = 12;
  published.dp = 8;
  published.micro_batch = 2;
  published.zero_stage = 1;
  published.recompute = Recompute::kFull;
  absl::StatusOr<LayoutEvaluation> eval = EvaluateLayout(request, published);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_TRUE(eval->fits) << eval->infeasible_reason;
  EXPECT_EQ(eval->time.bottleneck_layers, 6);
  EXPECT_GE(plan->best.step.tokens_per_second, eval->step.tokens_per_second);
  bool uneven_shape = false;
  for (const ShapeResult& shape : plan->shapes) {
    uneven_shape |= request.model.n_layer % shape.best.layout.pp != 0;
  }
  EXPECT_TRUE(uneven_shape);
  std::printf("BLOOM-176B on 384 A100-80GB: published %s -> %.0f tok/s (MFU %.1f%%); chosen %s "
              "-> %.0f tok/s (MFU %.1f%%), %.1f of %.1f GB per device\n",
              LayoutToString(published).c_str(), eval->step.tokens_per_second,
              100 * eval->step.mfu, LayoutToString(plan->best.layout).c_str(),
              plan->best.step.tokens_per_second, 100 * plan->best.step.mfu,
              plan->best.memory.total() / 1e9, plan->best.memory.capacity / 1e9);
}

// A published Llama-3 405B layout, ZeRO-3 with pipeline
// parallelism, could not be expressed. It now evaluates as fitting, with the
// gathered layer in its memory breakdown.
TEST(PlannerTest, Llama3_405BLayoutWithZeroThreeAndPipelineFits) {
  const PlanRequest request =
      Request(test_models::Llama3_405B(), 2048, 2048, 8, "H100 SXM5 80GB", 50e9);
  Layout layout;
  layout.tp = 8;
  layout.pp = 16;
  layout.dp = 128;
  layout.micro_batch = 1;
  layout.zero_stage = 3;
  layout.sequence_parallel = true;
  layout.recompute = Recompute::kFull;
  absl::StatusOr<LayoutEvaluation> eval = EvaluateLayout(request, layout);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_TRUE(eval->fits) << eval->infeasible_reason;
  // One block's TP shard, (2 h^2 + 2 h h_kv + 3 h f) / 8 + norms, in bf16.
  const double h = 16384, h_kv = 1024, f = 53248;
  const double block = (2 * h * h + 2 * h * h_kv + 3 * h * f) / 8 + 2 * h;
  EXPECT_NEAR(eval->memory.gathered_parameters, 2 * block, 1);
  // Fully sharded, every one of the 16 micro-batches gathers its stage's
  // weights twice over the 400 Gb/s network: a low MFU, which is why Meta
  // kept them gathered between forward and backward.
  EXPECT_GT(eval->step.mfu, 0.1);
  EXPECT_GT(eval->time.data_parallel_exposed, 0.5 * eval->time.compute);
  EXPECT_EQ(eval->time.micro_batches, 16);
  const std::string text = FormatEvaluationText(request, *eval);
  EXPECT_NE(text.find("ZeRO-3 gathered layer"), std::string::npos) << text;
  std::printf("Llama-3-405B on 16,384 H100: %s -> MFU %.1f%%, %.1f GB per device (%.2f GB "
              "gathered layer)\n",
              LayoutToString(layout).c_str(), 100 * eval->step.mfu, eval->memory.total() / 1e9,
              eval->memory.gathered_parameters / 1e9);
}

TEST(PlannerTest, ZeroTwoAndThreeAreSearchedWithPipelines) {
  PlanRequest request = MegatronRequest(kMegatronRows[1]);
  request.options.zero_stages = {3};
  request.options.pp = 8;
  absl::StatusOr<Plan> plan = MakePlan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->best.layout.zero_stage, 3);
  EXPECT_EQ(plan->best.layout.pp, 8);
  EXPECT_GT(plan->best.memory.gathered_parameters, 0);
}

TEST(PlannerTest, RejectsBadOptions) {
  PlanRequest request = Request(Gpt2Small(), 8, 1, 8);
  request.options.top_k = 0;
  EXPECT_EQ(MakePlan(request).status().message(), "options.top_k: must be >= 1");
  request.options.top_k = 3;
  request.options.zero_stages = {4};
  EXPECT_EQ(MakePlan(request).status().message(), "options.zero_stages: stages are 0..3");
}

}  // namespace
}  // namespace loom::planner
