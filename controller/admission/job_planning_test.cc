#include "controller/admission/job_planning.h"

#include <cstdio>
#include <string>
#include <vector>

#include "common/jobspec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Memory of the one slot in the long-sequence tests (below): enough for the
// training state and a recomputed pass, not for every activation.
constexpr double kLongSequenceMemoryBytes = 3.5e9;

loom::v1::JobSpec TinySpec(int workers, int ranks) {
  loom::v1::JobSpec spec;
  spec.set_name("tiny");
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_n_layer(2);
  gpt->set_n_head(2);
  gpt->set_d_model(32);
  gpt->set_seq_len(16);
  gpt->set_vocab_size(256);
  spec.mutable_data()->add_train("/data/train_*.bin");
  spec.mutable_optimizer()->mutable_adamw()->set_lr(1e-3);
  spec.mutable_schedule()->set_total_steps(10);
  spec.mutable_batch()->set_global_batch(8);
  spec.mutable_resources()->set_workers(workers);
  spec.mutable_resources()->set_ranks(ranks);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

loom::v1::WorkerInfo Worker(int slots, double memory_bytes, double gemm = 50e9,
                            double bandwidth = 12e9, int cpus = 8) {
  loom::v1::WorkerInfo w;
  w.set_alive(true);
  w.set_slots(slots);
  w.set_cpus(cpus);
  w.set_memory_bytes(static_cast<uint64_t>(memory_bytes));
  w.set_gemm_flops_per_second_per_thread(gemm);
  w.set_memory_bandwidth_bytes_per_second(bandwidth);
  return w;
}

TEST(TopologyForSpecTest, OneNodePerWorkerOneDevicePerRankFromTheSmallestWorker) {
  auto spec = TinySpec(2, 4);
  spec.mutable_resources()->set_threads_per_rank(2);
  auto live = TopologyForSpec(spec, {Worker(2, 16e9, 40e9), Worker(4, 64e9, 60e9)});
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_TRUE(live->measured);
  EXPECT_EQ(live->topology.nodes, 2);
  EXPECT_EQ(live->topology.devices_per_node, 2);
  // min(16 GB / 2 slots, 64 GB / 4 slots) = 8 GB; min(40, 60) GFLOP/s x 2 threads.
  EXPECT_EQ(live->topology.device.memory_bytes, 8000000000);
  EXPECT_DOUBLE_EQ(live->topology.device.peak_flops_fp32, 80e9);
  EXPECT_THAT(live->description, HasSubstr("2 live worker(s), measured GEMM"));
}

TEST(TopologyForSpecTest, ThreadsAreCappedByTheCoresPerSlot) {
  auto spec = TinySpec(1, 1);
  spec.mutable_resources()->set_threads_per_rank(16);
  auto live = TopologyForSpec(spec, {Worker(2, 16e9, 10e9, 12e9, /*cpus=*/8)});
  ASSERT_TRUE(live.ok());
  EXPECT_DOUBLE_EQ(live->topology.device.peak_flops_fp32, 40e9);  // 4 cores per slot
}

// Workers on one machine (same host id) share its cores and RAM: two local
// workers of 2 slots each on a 2-core, 16 GB host. A 4-rank job puts 2
// ranks per core, which time-share them (the rates stay a core's own; the
// cost model counts the sharing); every slot gets a quarter of the host's
// RAM although each worker reported all of it.
TEST(TopologyForSpecTest, WorkersOfOneHostShareItsCoresAndMemory) {
  auto co_hosted = [](const std::string& id, const std::string& host) {
    loom::v1::WorkerInfo w = Worker(2, 16e9, 50e9, 12e9, /*cpus=*/2);
    w.set_id(id);
    w.set_host_id(host);
    w.set_host_memory_bytes(16000000000);
    return w;
  };
  auto four_ranks = TinySpec(2, 4);
  auto shared = TopologyForSpec(four_ranks, {co_hosted("a", "h1"), co_hosted("b", "h1")});
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_DOUBLE_EQ(shared->topology.device.peak_flops_fp32, 50e9);
  EXPECT_DOUBLE_EQ(shared->topology.device.ranks_per_core, 2);
  EXPECT_EQ(shared->topology.device.shared_host_cores, 2);  // 4 ranks on 2 cores
  EXPECT_EQ(shared->topology.device.memory_bytes, 4000000000);
  EXPECT_THAT(shared->description, HasSubstr("up to 2 ranks per core on a shared host"));

  // Two ranks on the same two cores: no time-sharing, memory still per slot.
  auto two_ranks = TinySpec(2, 2);
  auto fits = TopologyForSpec(two_ranks, {co_hosted("a", "h1"), co_hosted("b", "h1")});
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_DOUBLE_EQ(fits->topology.device.peak_flops_fp32, 50e9);
  EXPECT_DOUBLE_EQ(fits->topology.device.ranks_per_core, 1);
  EXPECT_EQ(fits->topology.device.memory_bytes, 4000000000);
  EXPECT_THAT(fits->description, Not(HasSubstr("shared host")));

  // On two machines nothing is shared.
  auto apart = TopologyForSpec(four_ranks, {co_hosted("a", "h1"), co_hosted("b", "h2")});
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_DOUBLE_EQ(apart->topology.device.peak_flops_fp32, 50e9);
  EXPECT_EQ(apart->topology.device.memory_bytes, 8000000000);
}

// What workers measured a block to cost beyond its FLOPs, and an all-reduce
// between two of their ranks, reach the planner: the slowest worker's,
// stretched where ranks share cores.
TEST(TopologyForSpecTest, MeasuredBlockCostsReachTheDevice) {
  auto worker = [](const std::string& id, const std::string& host, double fixed) {
    loom::v1::WorkerInfo w = Worker(2, 16e9, 50e9, 12e9, /*cpus=*/2);
    w.set_id(id);
    w.set_host_id(host);
    w.set_block_fixed_seconds(fixed);
    w.set_block_seconds_per_activation(2e-7);
    w.set_allreduce_latency_seconds(1.5e-4);
    w.set_allreduce_bytes_per_second(6e8);
    w.set_tensor_collective_extra_seconds(fixed / 2);
    return w;
  };
  auto apart = TopologyForSpec(TinySpec(2, 4), {worker("a", "h1", 2e-4), worker("b", "h2", 3e-4)});
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_DOUBLE_EQ(apart->topology.device.layer_fixed_seconds, 3e-4);
  // The measured loopback all-reduce is the link between ranks of a worker.
  EXPECT_DOUBLE_EQ(apart->topology.intra_node_latency_seconds, 1.5e-4);
  EXPECT_DOUBLE_EQ(apart->topology.intra_node_bandwidth_bytes_per_second, 6e8);
  EXPECT_DOUBLE_EQ(apart->topology.intra_node_collective_extra_seconds, 1.5e-4);  // the slower's
  EXPECT_DOUBLE_EQ(apart->topology.device.layer_seconds_per_activation, 2e-7);
  // Four ranks on one 2-core host: the figures stay a core's own, and the
  // device says 2 ranks share each core (the cost model counts it).
  auto shared = TopologyForSpec(TinySpec(2, 4), {worker("a", "h1", 2e-4), worker("b", "h1", 3e-4)});
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_DOUBLE_EQ(shared->topology.device.layer_fixed_seconds, 3e-4);
  EXPECT_DOUBLE_EQ(shared->topology.device.layer_seconds_per_activation, 2e-7);
  EXPECT_DOUBLE_EQ(shared->topology.intra_node_latency_seconds, 1.5e-4);
  EXPECT_DOUBLE_EQ(shared->topology.intra_node_bandwidth_bytes_per_second, 6e8);
  EXPECT_DOUBLE_EQ(shared->topology.device.ranks_per_core, 2);
  // Workers of one host talk over its loopback: their network is the
  // measured all-reduce, not the assumed 10 Gb/s; on two hosts it is not.
  EXPECT_DOUBLE_EQ(shared->topology.inter_node_latency_seconds, 1.5e-4);
  EXPECT_DOUBLE_EQ(shared->topology.inter_node_bandwidth_bytes_per_second, 6e8);
  EXPECT_THAT(shared->description, HasSubstr("workers on one host, their network its loopback"));
  EXPECT_DOUBLE_EQ(apart->topology.inter_node_bandwidth_bytes_per_second,
                   kEstimatedNodeNetworkBytesPerSecond / 2);
  EXPECT_THAT(apart->description, HasSubstr("network assumed 10 Gb/s per worker"));
  // Not measured: FLOPs only.
  auto unmeasured = TopologyForSpec(TinySpec(1, 1), {Worker(1, 8e9)});
  ASSERT_TRUE(unmeasured.ok());
  EXPECT_EQ(unmeasured->topology.device.layer_fixed_seconds, 0);
}

// The collective figures come from one worker, the slowest by its own
// cost of a collective: not one worker's latency with another's bandwidth
// and a third's extra, which adds up to more than any of them measured.
TEST(TopologyForSpecTest, CollectiveFiguresAreTheSlowestHostsAsOneSet) {
  auto worker = [](const std::string& id, const std::string& host, double latency,
                   double bandwidth, double extra) {
    loom::v1::WorkerInfo w = Worker(2, 16e9, 50e9, 12e9, /*cpus=*/2);
    w.set_id(id);
    w.set_host_id(host);
    w.set_tensor_collective_idle_fraction(id == "a" ? 0.3 : 0.5);
    w.set_allreduce_latency_seconds(latency);
    w.set_allreduce_bytes_per_second(bandwidth);
    w.set_tensor_collective_extra_seconds(extra);
    return w;
  };
  // a: 2 x 0.67 ms + 131072 B / 2.39 GB/s + 0 = 1.40 ms;
  // b: 2 x 0.20 ms + 131072 B / 0.65 GB/s + 1.0 ms = 1.60 ms, the slower.
  // On two hosts: b's figures, together.
  auto apart = TopologyForSpec(TinySpec(2, 4), {worker("a", "h1", 6.7e-4, 2.39e9, 0),
                                                worker("b", "h2", 2.0e-4, 6.5e8, 1.0e-3)});
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_DOUBLE_EQ(apart->topology.intra_node_latency_seconds, 2.0e-4);
  EXPECT_DOUBLE_EQ(apart->topology.intra_node_bandwidth_bytes_per_second, 6.5e8);
  EXPECT_DOUBLE_EQ(apart->topology.intra_node_collective_extra_seconds, 1.0e-3);
  EXPECT_DOUBLE_EQ(apart->topology.device.collective_idle_fraction, 0.5);
  // On one host they measured one machine: the mean of their figures
  // (bandwidth as seconds per byte), 1.50 ms for 128 KiB.
  auto shared = TopologyForSpec(TinySpec(2, 4), {worker("a", "h1", 6.7e-4, 2.39e9, 0),
                                                 worker("b", "h1", 2.0e-4, 6.5e8, 1.0e-3)});
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_DOUBLE_EQ(shared->topology.intra_node_latency_seconds, (6.7e-4 + 2.0e-4) / 2);
  EXPECT_DOUBLE_EQ(shared->topology.intra_node_bandwidth_bytes_per_second,
                   2 / (1 / 2.39e9 + 1 / 6.5e8));
  EXPECT_DOUBLE_EQ(shared->topology.intra_node_collective_extra_seconds, 5.0e-4);
  EXPECT_DOUBLE_EQ(shared->topology.device.collective_idle_fraction, 0.4);  // (0.3 + 0.5) / 2
  // The loopback between these workers (for data-parallel and pipeline
  // traffic) is the slowest link any of them measured.
  EXPECT_DOUBLE_EQ(shared->topology.inter_node_latency_seconds, 6.7e-4);
  EXPECT_DOUBLE_EQ(shared->topology.inter_node_bandwidth_bytes_per_second, 6.5e8);
}

// One thread's figures were measured alone; a job that keeps several of a
// host's cores computing gets them slowed by the host's measured slowdown
// with every core busy (its workers' readings averaged), in proportion to
// the cores it keeps busy.
TEST(TopologyForSpecTest, RanksFillingAHostComputeSlowerByItsMeasuredSlowdown) {
  auto worker = [](const std::string& id, double slowdown) {
    loom::v1::WorkerInfo w = Worker(2, 16e9, 50e9, 12e9, /*cpus=*/4);
    w.set_id(id);
    w.set_host_id("h1");
    w.set_block_fixed_seconds(2e-4);
    w.set_block_seconds_per_activation(4e-8);
    w.set_concurrent_slowdown(slowdown);
    return w;
  };
  const std::vector<loom::v1::WorkerInfo> host = {worker("a", 1.1), worker("b", 1.3)};
  // 4 ranks on 4 cores: the whole 1.2.
  auto full = TopologyForSpec(TinySpec(2, 4), host);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_DOUBLE_EQ(full->topology.device.peak_flops_fp32, 50e9 / 1.2);
  EXPECT_DOUBLE_EQ(full->topology.device.layer_fixed_seconds, 2e-4 * 1.2);
  EXPECT_DOUBLE_EQ(full->topology.device.layer_seconds_per_activation, 4e-8 * 1.2);
  // 2 ranks on 4 cores: a third of it (one other core of three busy).
  auto half = TopologyForSpec(TinySpec(2, 2), host);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_DOUBLE_EQ(half->topology.device.peak_flops_fp32, 50e9 / (1 + 0.2 / 3));
  // One rank alone: none.
  auto alone = TopologyForSpec(TinySpec(1, 1), host);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_DOUBLE_EQ(alone->topology.device.peak_flops_fp32, 50e9);
  EXPECT_DOUBLE_EQ(alone->topology.device.layer_fixed_seconds, 2e-4);
}

TEST(TopologyForSpecTest, WithoutWorkersUsesTheDocumentedEstimates) {
  auto live = TopologyForSpec(TinySpec(2, 2), {});
  ASSERT_TRUE(live.ok());
  EXPECT_FALSE(live->measured);
  EXPECT_DOUBLE_EQ(live->topology.device.peak_flops_fp32, kEstimatedGemmFlopsPerThread);
  EXPECT_EQ(live->topology.device.memory_bytes, static_cast<int64_t>(kEstimatedMemoryPerSlotBytes));
  EXPECT_THAT(live->description, HasSubstr("no live workers"));
  // A worker that reported no measurement also makes the figures estimates.
  auto partly = TopologyForSpec(TinySpec(1, 1), {Worker(1, 8e9, /*gemm=*/0)});
  ASSERT_TRUE(partly.ok());
  EXPECT_FALSE(partly->measured);
}

TEST(TopologyForSpecTest, UnevenGangsCountEveryRankAsANode) {
  auto live = TopologyForSpec(TinySpec(2, 3), {Worker(2, 8e9), Worker(2, 8e9)});
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->topology.nodes, 3);
  EXPECT_EQ(live->topology.devices_per_node, 1);
}

loom::v1::WorkerInfo InRack(loom::v1::WorkerInfo w, const std::string& id,
                            const std::string& rack) {
  w.set_id(id);
  w.set_node(id);
  w.set_zone("z1");
  w.set_rack(rack);
  return w;
}

// Live topology: the workers' rack labels give the planner its
// racks, as the scheduler would choose the gang's workers.
TEST(TopologyForSpecTest, RackLabelsOfTheGangsWorkersGiveTheRacks) {
  auto spec = TinySpec(4, 4);
  std::vector<loom::v1::WorkerInfo> workers = {
      InRack(Worker(1, 8e9), "d", "r2"), InRack(Worker(1, 8e9), "a", "r1"),
      InRack(Worker(1, 8e9), "c", "r1"), InRack(Worker(1, 8e9), "b", "r2")};
  auto live = TopologyForSpec(spec, workers);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->topology.nodes, 4);
  EXPECT_EQ(live->topology.nodes_per_rack, 2);
  EXPECT_EQ(live->topology.racks(), 2);
  EXPECT_THAT(live->description, StartsWith("4 x 1 cpu, 2 racks of 2 worker(s), "));

  // A two-worker gang: rack r1 holds it whole, so the planner sees one rack.
  auto two = TopologyForSpec(TinySpec(2, 2), workers);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->topology.nodes_per_rack, 2);
  EXPECT_EQ(two->topology.racks(), 1);
  EXPECT_THAT(two->description, Not(HasSubstr("racks of")));

  // Racks of unequal size, or no labels at all: no rack structure.
  workers.push_back(InRack(Worker(1, 8e9), "e", "r3"));
  auto three = TopologyForSpec(TinySpec(3, 3), {workers[1], workers[2], workers[4]});
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->topology.nodes_per_rack, 0);
  auto unlabelled = TopologyForSpec(spec, {Worker(1, 8e9), Worker(1, 8e9), Worker(1, 8e9),
                                           Worker(1, 8e9)});
  ASSERT_TRUE(unlabelled.ok()) << unlabelled.status();
  EXPECT_EQ(unlabelled->topology.nodes_per_rack, 0);
  // A dead worker's rack does not count, and a PP2 x DP2 gang takes whole
  // replicas per rack: a, c in r1 and e, f in r3, not b, alone in r2 now.
  workers[0].set_alive(false);
  workers.push_back(InRack(Worker(1, 8e9), "f", "r3"));
  auto pipelined = spec;
  pipelined.mutable_parallelism()->set_data(2);
  pipelined.mutable_parallelism()->set_pipeline(2);
  auto after = TopologyForSpec(pipelined, workers);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->topology.nodes_per_rack, 2);
  // Pure data parallelism takes the first four in rack order (a, c, b, e).
  auto flat = TopologyForSpec(spec, workers);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->topology.nodes_per_rack, 0);
}

// No worker measures its network: the figure is the documented assumption
// and the description says so, even when every device figure is measured.
TEST(TopologyForSpecTest, TheNetworkIsAnAssumptionAndSaysSo) {
  auto live = TopologyForSpec(TinySpec(2, 4), {Worker(2, 16e9), Worker(2, 16e9)});
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_TRUE(live->measured);
  EXPECT_DOUBLE_EQ(live->topology.inter_node_bandwidth_bytes_per_second,
                   kEstimatedNodeNetworkBytesPerSecond / 2);
  EXPECT_THAT(live->description, HasSubstr("network assumed 10 Gb/s per worker, not measured"));
}

TEST(PlanAtSubmitTest, AutoChoosesAnExecutableLayoutAndRecordsTheDegrees) {
  auto spec = TinySpec(2, 2);
  spec.mutable_parallelism()->set_auto_(true);
  spec.mutable_parallelism()->clear_data();
  auto live = TopologyForSpec(spec, {Worker(1, 8e9), Worker(1, 8e9)});
  ASSERT_TRUE(live.ok());
  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->auto_());
  EXPECT_TRUE(plan->layout().fits());
  EXPECT_EQ(plan->layout().tensor(), 1);
  EXPECT_EQ(plan->layout().pipeline(), 1);
  EXPECT_EQ(plan->layout().data(), 2);
  EXPECT_LE(plan->layout().zero_stage(), 2);  // ZeRO-3 is not executed
  EXPECT_EQ(spec.parallelism().zero_stage(), plan->layout().zero_stage());
  EXPECT_EQ(plan->layout().recompute(), "none");
  EXPECT_EQ(plan->layout().micro_batch(), 4);  // the spec's (8 / 2 ranks)
  EXPECT_GT(plan->layout().step_seconds(), 0);
  EXPECT_GT(plan->layout().tokens_per_second(), 0);
  EXPECT_GT(plan->layout().weights_bytes(), 0);
  EXPECT_EQ(spec.parallelism().data(), 2);
  EXPECT_EQ(spec.parallelism().tensor(), 1);
  EXPECT_EQ(spec.parallelism().pipeline(), 1);
  EXPECT_TRUE(spec.parallelism().auto_());
  EXPECT_THAT(FormatJobPlan(*plan), HasSubstr("chosen (parallelism.auto)"));
}

// When the training state of a replica does not fit a rank's
// memory, parallelism.auto now plans a layout that splits it (tensor,
// pipeline or ZeRO) instead of refusing, and records it in the spec.
TEST(PlanAtSubmitTest, AutoSplitsTheModelWhenPureDataParallelismDoesNotFit) {
  auto spec = TinySpec(2, 4);
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_n_layer(8);
  gpt->set_n_head(16);
  gpt->set_d_model(1024);
  gpt->set_seq_len(128);
  gpt->set_vocab_size(32000);  // ~134M parameters: ~2.1 GB of fp32 AdamW state
  spec.mutable_parallelism()->set_auto_(true);
  spec.mutable_parallelism()->clear_data();
  spec.mutable_batch()->set_micro_batch(1);
  auto live = TopologyForSpec(spec, {Worker(2, 2 * 3.0e9), Worker(2, 2 * 3.0e9)});
  ASSERT_TRUE(live.ok()) << live.status();
  // Pure data parallelism, evaluated as the spec's own layout, does not fit.
  auto dp_only = spec;
  dp_only.mutable_parallelism()->set_auto_(false);
  dp_only.mutable_parallelism()->set_data(4);
  dp_only.mutable_parallelism()->set_tensor(1);
  dp_only.mutable_parallelism()->set_pipeline(1);
  EXPECT_EQ(PlanAtSubmit(&dp_only, *live).status().code(), absl::StatusCode::kInvalidArgument);

  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->layout().fits()) << plan->layout().summary();
  const auto& par = spec.parallelism();
  EXPECT_TRUE(par.tensor() > 1 || par.pipeline() > 1 || par.zero_stage() > 0)
      << plan->layout().summary();
  EXPECT_EQ(par.data() * par.tensor() * par.pipeline(), 4);
  EXPECT_EQ(par.zero_stage(), plan->layout().zero_stage());
  EXPECT_LE(par.tensor(), 2) << "a TP group must fit in one worker (2 slots)";
  EXPECT_FALSE(plan->layout().sequence_parallel());
  EXPECT_EQ(plan->layout().virtual_stages(), 1);
  std::printf("auto plan: %s\n", plan->layout().summary().c_str());
}

// A long-sequence model on one rank: its training state fits, its
// activations at the spec's micro-batch do not. Nothing but recompute can
// help (one rank: no tensor, pipeline or ZeRO), so parallelism.auto chooses
// full recompute and turns on the engine's activation checkpointing of
// every block; a spec that pins it is evaluated with it.
loom::v1::JobSpec LongSequenceSpec() {
  auto spec = TinySpec(1, 1);
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_n_layer(8);
  gpt->set_n_head(8);
  gpt->set_d_model(512);
  gpt->set_seq_len(2048);
  gpt->set_vocab_size(256);  // ~25M parameters: 0.4 GB of fp32 AdamW state
  spec.mutable_batch()->set_global_batch(8);
  spec.mutable_batch()->set_micro_batch(8);
  return spec;
}

TEST(PlanAtSubmitTest, AutoTurnsOnActivationCheckpointingWhenOnlyRecomputeFits) {
  auto spec = LongSequenceSpec();
  auto live = TopologyForSpec(spec, {Worker(1, kLongSequenceMemoryBytes)});
  ASSERT_TRUE(live.ok()) << live.status();
  // Without recompute the spec's own layout does not fit.
  auto pinned_off = spec;
  EXPECT_EQ(PlanAtSubmit(&pinned_off, *live).status().code(),
            absl::StatusCode::kInvalidArgument);

  spec.mutable_parallelism()->set_auto_(true);
  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->layout().fits()) << plan->layout().summary();
  EXPECT_EQ(plan->layout().recompute(), "full");
  EXPECT_EQ(spec.activation_checkpointing(), 1);

  // Pinned: activation_checkpointing set by hand is the layout's recompute.
  auto pinned_on = LongSequenceSpec();
  pinned_on.set_activation_checkpointing(1);
  auto evaluated = PlanAtSubmit(&pinned_on, *live);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  EXPECT_TRUE(evaluated->layout().fits());
  EXPECT_EQ(evaluated->layout().recompute(), "full");
}

TEST(PlanAtSubmitTest, AutoLeavesActivationCheckpointingOffWhenEverythingFits) {
  auto spec = LongSequenceSpec();
  spec.mutable_parallelism()->set_auto_(true);
  auto live = TopologyForSpec(spec, {Worker(1, 64e9)});
  ASSERT_TRUE(live.ok()) << live.status();
  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layout().recompute(), "none");
  EXPECT_EQ(spec.activation_checkpointing(), 0);
}

// A 7B-parameter model (Llama-2-7B shape, GPT-style here) needs ~112 GB of
// training state per replica: it does not fit in 8 GB per rank.
loom::v1::JobSpec BigSpec() {
  auto spec = TinySpec(1, 1);
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_n_layer(32);
  gpt->set_n_head(32);
  gpt->set_d_model(4096);
  gpt->set_seq_len(2048);
  gpt->set_vocab_size(32000);
  return spec;
}

TEST(PlanAtSubmitTest, ExplicitLayoutThatDoesNotFitIsRejectedWithTheFieldAndReason) {
  auto spec = BigSpec();
  auto live = TopologyForSpec(spec, {Worker(1, 8e9)});
  ASSERT_TRUE(live.ok());
  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_THAT(Msg(plan.status()), StartsWith("parallelism.data: layout tp 1 | pp 1 | dp 1"));
  EXPECT_THAT(Msg(plan.status()), HasSubstr("GB per device before activations, device has 8"));
  // Sharding executes now: the hint says to use it.
  EXPECT_THAT(Msg(plan.status()),
              HasSubstr("shard it with tensor or pipeline parallelism or ZeRO-1/2 over more ranks"));
  EXPECT_THAT(Msg(plan.status()), Not(HasSubstr("does not execute yet")));
}

// A layout that does not fit has no throughput or MFU: the stored plan
// leaves them unset and `loomctl status` shows the reason instead.
TEST(PlanAtSubmitTest, LayoutThatDoesNotFitCarriesNoThroughputOrMfu) {
  auto spec = BigSpec();
  auto live = TopologyForSpec(spec, {});  // estimates: the plan is kept, with a note
  ASSERT_TRUE(live.ok());
  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& l = plan->layout();
  ASSERT_FALSE(l.fits());
  EXPECT_FALSE(l.infeasible_reason().empty());
  EXPECT_GT(l.total_bytes(), l.device_memory_bytes());
  EXPECT_EQ(l.step_seconds(), 0);
  EXPECT_EQ(l.tokens_per_second(), 0);
  EXPECT_EQ(l.mfu(), 0);
  EXPECT_EQ(l.train_seconds(), 0);
  EXPECT_EQ(l.compute_seconds(), 0);
  const std::string text = FormatJobPlan(*plan);
  EXPECT_THAT(text, HasSubstr("DOES NOT FIT"));
  EXPECT_THAT(text, HasSubstr(l.infeasible_reason()));
  EXPECT_THAT(text, Not(HasSubstr("tok/s")));
  EXPECT_THAT(text, Not(HasSubstr("MFU")));
  EXPECT_THAT(text, Not(HasSubstr("step: compute")));
  EXPECT_THAT(text, HasSubstr("memory/device: weights"));
}

TEST(PlanAtSubmitTest, AutoWithNothingThatFitsIsRejected) {
  auto spec = BigSpec();
  spec.mutable_parallelism()->set_auto_(true);
  auto live = TopologyForSpec(spec, {Worker(1, 8e9)});
  ASSERT_TRUE(live.ok());
  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_THAT(Msg(plan.status()), StartsWith("parallelism.auto: no executable layout fits"));
}

TEST(PlanAtSubmitTest, EstimatedFiguresDoNotRejectButSaySo) {
  auto spec = BigSpec();
  auto live = TopologyForSpec(spec, {});
  ASSERT_TRUE(live.ok());
  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->topology_measured());
  EXPECT_FALSE(plan->layout().fits());
  ASSERT_GE(plan->notes_size(), 1);
  EXPECT_THAT(plan->notes(0), HasSubstr("does not fit the estimated figures"));
}

TEST(ExplainUnexecutableLayoutTest, TensorLayoutThatWouldNotFitSaysWhy) {
  auto spec = BigSpec();
  spec.mutable_resources()->set_ranks(2);
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_parallelism()->set_data(1);
  auto live = TopologyForSpec(spec, {Worker(2, 16e9)});
  ASSERT_TRUE(live.ok());
  absl::Status unimplemented = absl::UnimplementedError("parallelism.tensor: not yet");
  absl::Status s = ExplainUnexecutableLayout(spec, *live, unimplemented);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), StartsWith("parallelism.tensor: layout tp 2 | pp 1 | dp 1"));
  // Tensor parallelism executes; what does not is what `unimplemented` says.
  EXPECT_THAT(Msg(s), HasSubstr("(and, as asked, it cannot run yet: parallelism.tensor: not yet)"));
  EXPECT_THAT(Msg(s), Not(HasSubstr("tensor/pipeline parallelism does not execute")));
  // A tiny model with tp 2 would fit: the UNIMPLEMENTED answer stands.
  auto tiny = TinySpec(1, 2);
  tiny.mutable_parallelism()->set_tensor(2);
  tiny.mutable_parallelism()->set_data(1);
  EXPECT_EQ(ExplainUnexecutableLayout(tiny, *live, unimplemented), unimplemented);
}

TEST(PlanSpecTest, FullSearchReturnsAlternativesWithBreakdownsAndAReport) {
  auto spec = TinySpec(1, 4);
  spec.mutable_parallelism()->set_auto_(true);
  auto live = TopologyForSpec(spec, {Worker(4, 32e9)});
  ASSERT_TRUE(live.ok());
  auto resp = PlanSpec(spec, *live, 3, /*executable_only=*/false);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_TRUE(resp->chosen().fits());
  ASSERT_GE(resp->alternatives_size(), 1);
  EXPECT_LE(resp->alternatives_size(), 3);
  EXPECT_EQ(resp->alternatives(0).summary(), resp->chosen().summary());
  EXPECT_EQ(resp->chosen().tensor() * resp->chosen().pipeline() * resp->chosen().data(), 4);
  EXPECT_THAT(resp->report(), HasSubstr("Cluster: 1 x 4 cpu"));
  EXPECT_FALSE(resp->has_spec_layout());
  // How many of the 4 slots pay: 1, 2 and 4 are planned, one is recommended.
  ASSERT_EQ(resp->device_counts_size(), 3);
  EXPECT_EQ(resp->device_counts(0).devices(), 1);
  EXPECT_EQ(resp->device_counts(2).devices(), 4);
  EXPECT_EQ(resp->device_counts(2).best().summary(), resp->chosen().summary());
  EXPECT_GT(resp->device_counts(2).device_hours(), 0);
  EXPECT_TRUE(resp->recommended_devices() == 1 || resp->recommended_devices() == 2 ||
              resp->recommended_devices() == 4);
  EXPECT_THAT(resp->device_count_rule(), HasSubstr("device-hours are at most 2x"));
  EXPECT_THAT(resp->report(), HasSubstr("Device counts (the same request on fewer devices)"));
  for (const auto& a : resp->alternatives()) {
    EXPECT_GT(a.step_seconds(), 0);
    EXPECT_GT(a.total_bytes(), 0);
    EXPECT_NEAR(a.step_seconds(),
                a.compute_seconds() + a.tensor_parallel_comm_seconds() + a.pipeline_p2p_seconds() +
                    a.pipeline_bubble_seconds() + a.data_parallel_exposed_seconds() +
                    a.optimizer_seconds(),
                1e-9 + 1e-6 * a.step_seconds());
  }
}

TEST(PlanSpecTest, ExplicitSpecLayoutIsEvaluatedToo) {
  auto spec = TinySpec(1, 2);
  auto live = TopologyForSpec(spec, {Worker(2, 32e9)});
  ASSERT_TRUE(live.ok());
  auto resp = PlanSpec(spec, *live, 5, /*executable_only=*/true);
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_TRUE(resp->has_spec_layout());
  EXPECT_EQ(resp->spec_layout().data(), 2);
  EXPECT_TRUE(resp->spec_layout().fits());
  EXPECT_THAT(resp->report(), HasSubstr("Search restricted to layouts Loom executes (tensor parallelism inside a worker"));
  EXPECT_THAT(resp->report(), HasSubstr("The spec's own layout"));
}

// Model families: the job spec's GptModel fields reach the
// planner's ModelSpec; the GPT-2 defaults stay the planner's defaults.
TEST(SpecToPlanRequestTest, CopiesTheModelFamilyIntoThePlannersModelSpec) {
  auto spec = TinySpec(1, 1);
  auto live = TopologyForSpec(spec, {Worker(1, 32e9)});
  ASSERT_TRUE(live.ok());
  auto gpt2 = SpecToPlanRequest(spec, live->topology, 1);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  // GPT-2's defaults, written out (common/jobspec.h EffectiveDecoder).
  EXPECT_EQ(gpt2->model.n_kv_head, 2);
  EXPECT_EQ(gpt2->model.ffn_hidden, 4 * 32);
  EXPECT_TRUE(gpt2->model.bias);
  EXPECT_TRUE(gpt2->model.learned_position_embedding);
  EXPECT_FALSE(gpt2->model.gated_mlp);
  EXPECT_FALSE(gpt2->model.rms_norm);
  EXPECT_TRUE(gpt2->model.tied_embeddings);

  auto* g = spec.mutable_model()->mutable_gpt();
  g->set_n_kv_head(1);
  g->mutable_mlp()->set_gated(true);
  g->mutable_mlp()->set_hidden(88);
  g->set_norm(loom::v1::GptModel::RMSNORM);
  g->set_untied_embeddings(true);
  // Submit takes this model under data parallelism.
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  auto llama = SpecToPlanRequest(spec, live->topology, 1);
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->model.n_kv_head, 1);
  EXPECT_EQ(llama->model.ffn_hidden, 88);
  EXPECT_TRUE(llama->model.gated_mlp);
  EXPECT_TRUE(llama->model.rms_norm);
  EXPECT_FALSE(llama->model.tied_embeddings);
  // The planner counts what the fields say, per layer with h = 32, one KV
  // head of 16: Q, O 2h^2; K, V 2 h 16; three h x 88 gated matrices.
  const planner::ParameterCount p = planner::CountParameters(llama->model);
  EXPECT_EQ(p.per_layer_matmul, 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 88);
  EXPECT_EQ(p.output_head, 256 * 32);
  EXPECT_EQ(p.per_layer_norm, 2 * 32);  // two RMSNorm scales
  auto resp = PlanSpec(spec, *live, 1, /*executable_only=*/false);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_THAT(resp->report(), HasSubstr("(1 KV), MLP 88"));
}

// A Llama-family model runs under every layout, with key/value heads split
// across a tensor group or copied when fewer than its ranks:
// parallelism.auto searches only tensor degrees that divide the MLP width
// and divide or are divided by the key/value heads, and model.llama
// reaches the planner with its defaults (rotary: no position table; no
// biases; untied).
TEST(PlanAtSubmitTest, AutoPlansALlamaModelWithTensorDegreesThatSplitItsHeads) {
  auto spec = TinySpec(2, 4);
  v1::GptModel llama = spec.model().gpt();
  llama.set_n_head(4);
  llama.set_n_kv_head(2);
  *spec.mutable_model()->mutable_llama() = llama;
  ApplyJobSpecDefaults(&spec);
  spec.mutable_parallelism()->set_auto_(true);
  spec.mutable_parallelism()->clear_data();
  auto live = TopologyForSpec(spec, {Worker(2, 16e9), Worker(2, 16e9)});
  ASSERT_TRUE(live.ok()) << live.status();
  auto request = SpecToPlanRequest(spec, live->topology, 1);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_FALSE(request->model.learned_position_embedding);
  EXPECT_FALSE(request->model.bias);
  EXPECT_FALSE(request->model.tied_embeddings);
  EXPECT_TRUE(request->model.gated_mlp);
  EXPECT_EQ(request->model.ffn_hidden, 128);  // 8/3 x 32 = 85, rounded up to a multiple of 64
  auto plan = PlanAtSubmit(&spec, *live);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t kv = KvHeads(request->model), tp = spec.parallelism().tensor();
  EXPECT_TRUE(kv % tp == 0 || tp % kv == 0) << kv << " " << tp;
  EXPECT_EQ(spec.parallelism().data() * spec.parallelism().tensor() *
                std::max(1, spec.parallelism().pipeline()),
            4);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  // One key/value head: copied to every rank of a tensor group.
  auto single = TinySpec(2, 4);
  v1::GptModel mqa = single.model().gpt();
  mqa.set_n_head(4);
  mqa.set_n_kv_head(1);
  *single.mutable_model()->mutable_llama() = mqa;
  ApplyJobSpecDefaults(&single);
  single.mutable_parallelism()->set_auto_(true);
  single.mutable_parallelism()->clear_data();
  auto single_live = TopologyForSpec(single, {Worker(2, 16e9), Worker(2, 16e9)});
  ASSERT_TRUE(single_live.ok());
  ASSERT_TRUE(PlanAtSubmit(&single, *single_live).ok());
  EXPECT_TRUE(ValidateJobSpec(single).ok()) << ValidateJobSpec(single);
  // Three key/value heads of six: a tensor degree of 2 or 4 would share
  // heads unevenly, so auto keeps to 1 (or 3, 6, which 4 ranks cannot be).
  auto uneven = TinySpec(2, 4);
  v1::GptModel six = uneven.model().gpt();
  six.set_n_head(6);
  six.set_d_model(48);
  six.set_n_kv_head(3);
  *uneven.mutable_model()->mutable_llama() = six;
  ApplyJobSpecDefaults(&uneven);
  uneven.mutable_parallelism()->set_auto_(true);
  uneven.mutable_parallelism()->clear_data();
  auto uneven_live = TopologyForSpec(uneven, {Worker(2, 16e9), Worker(2, 16e9)});
  ASSERT_TRUE(uneven_live.ok());
  ASSERT_TRUE(PlanAtSubmit(&uneven, *uneven_live).ok());
  EXPECT_EQ(uneven.parallelism().tensor(), 1);
  EXPECT_TRUE(ValidateJobSpec(uneven).ok()) << ValidateJobSpec(uneven);
}

// A pinned layout may fix every knob: the spec's interleaving and
// sequence parallelism are evaluated (submit refuses them), while the
// executable search still never chooses them.
TEST(SpecLayoutTest, CarriesInterleavingAndSequenceParallelism) {
  auto spec = TinySpec(1, 4);
  spec.mutable_model()->mutable_gpt()->set_n_layer(4);
  auto* par = spec.mutable_parallelism();
  par->set_data(1);
  par->set_tensor(2);
  par->set_pipeline(2);
  spec.mutable_batch()->set_micro_batch(2);  // 4 micro-batches, a multiple of 2 stages
  planner::Layout plain = SpecLayout(spec);
  EXPECT_EQ(plain.virtual_stages, 1);
  EXPECT_FALSE(plain.sequence_parallel);
  par->set_virtual_stages(2);
  par->set_sequence_parallel(true);
  const absl::Status valid = ValidateJobSpec(spec);
  EXPECT_EQ(valid.code(), absl::StatusCode::kUnimplemented) << valid;
  EXPECT_THAT(Msg(valid), StartsWith("parallelism.sequence_parallel: "));
  const planner::Layout pinned = SpecLayout(spec);
  EXPECT_EQ(pinned.virtual_stages, 2);
  EXPECT_TRUE(pinned.sequence_parallel);

  auto live = TopologyForSpec(spec, {Worker(4, 32e9)});
  ASSERT_TRUE(live.ok());
  auto resp = PlanSpec(spec, *live, 3, /*executable_only=*/false);
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_TRUE(resp->has_spec_layout());
  EXPECT_EQ(resp->spec_layout().virtual_stages(), 2);
  EXPECT_TRUE(resp->spec_layout().sequence_parallel());
  EXPECT_THAT(resp->spec_layout().summary(), HasSubstr("v 2"));
  EXPECT_THAT(resp->spec_layout().summary(), HasSubstr("SP"));
  // Interleaving halves the bubble, (p - 1) / v x a micro-batch's time
  // (Narayanan et al. 2021, Sec. 2.2.2).
  auto req = SpecToPlanRequest(spec, live->topology, 1);
  ASSERT_TRUE(req.ok());
  auto interleaved = planner::EvaluateLayout(*req, pinned);
  auto not_interleaved = planner::EvaluateLayout(*req, plain);
  ASSERT_TRUE(interleaved.ok() && not_interleaved.ok());
  EXPECT_LT(interleaved->time.pipeline_bubble, not_interleaved->time.pipeline_bubble);

  planner::PlannerOptions options;
  RestrictToExecutable(spec, &options);
  EXPECT_EQ(options.virtual_stages, 1);
  EXPECT_FALSE(options.sequence_parallel);
}

}  // namespace
}  // namespace loom::controller
