// Equivalence of the partitioned GPT with the single-rank one:
// same initial weights bit for bit, and the same 10 training
// steps (losses and final parameters) under tensor and data parallelism,
// within 1e-5. Ranks are threads of this process on one HashStore, with
// real Gloo groups over loopback.
#include "worker/engine/parallel/parallel_gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/gpt.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/parallel/pipeline.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/parallel/sharded_adamw.h"
#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {
namespace {

constexpr int kSeed = 1234;
constexpr int kSteps = 10;
constexpr int kGlobalBatch = 4;

GptConfig TinyConfig() {
  GptConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 61;  // not a multiple of 2: vocabulary shards of 30 and 31 rows
  c.dropout = 0.0;
  return c;
}

// eps 1e-4 instead of the default 1e-8. AdamW divides each element's step
// by the RMS of its gradient (+ eps), so an element whose gradient is
// (nearly) zero turns fp32 rounding, which any change of summation order
// changes, into a step of up to lr: the attention key bias's true gradient
// is exactly 0 (softmax ignores a shift of the scores), and a bias summed
// over 64 tokens nearly cancels. With eps 1e-8 the key bias held 1.5e-4 of
// its magnitude of noise after 10 steps in every layout, and with eps 1e-5
// two correct single-rank implementations (Gpt, ParallelGpt on one rank)
// still differed by 2.1e-5 of a bias's magnitude. With eps 1e-4 such
// elements move by lr * noise / eps while every gradient above ~1e-4 (most
// of them) still takes Adam's normalised step, so the comparison below can
// hold parameters to the required 1e-5.
OptimizerConfig TestOptimizer() {
  OptimizerConfig o;
  o.lr = 1e-3;
  o.eps = 1e-4;
  o.weight_decay = 0.1;
  o.grad_clip = 0.5;  // low enough that clipping happens (checked below)
  return o;
}

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> MakeBatches(const GptConfig& c) {
  torch::manual_seed(99);
  std::vector<Batch> batches;
  for (int i = 0; i < kSteps; ++i) {
    const torch::Tensor tokens = torch::randint(c.vocab_size, {kGlobalBatch, c.seq_len + 1},
                                                torch::kLong);
    batches.push_back({tokens.narrow(1, 0, c.seq_len).contiguous(),
                       tokens.narrow(1, 1, c.seq_len).contiguous()});
  }
  return batches;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::map<std::string, torch::Tensor> parameters;  // full (merged) tensors
  // Gradients of the first step (averaged over replicas, before clipping);
  // empty for ZeRO runs, whose gradients live only as reduced shards.
  std::map<std::string, torch::Tensor> first_gradients;
};

RunResult TrainSingleRank(const GptConfig& config, const std::vector<Batch>& batches) {
  torch::manual_seed(kSeed);
  Gpt model(config);
  std::unique_ptr<torch::optim::AdamW> optimizer = MakeAdamW(*model, TestOptimizer());
  RunResult result;
  for (const Batch& b : batches) {
    optimizer->zero_grad();
    torch::Tensor loss = model->Loss(b.x, b.y);
    loss.backward();
    if (result.first_gradients.empty()) {
      for (const auto& item : model->named_parameters()) {
        const torch::Tensor& g = item.value().grad();
        result.first_gradients[item.key()] = (g.is_sparse() ? g.to_dense() : g).clone();
      }
    }
    result.grad_norms.push_back(ClipGradNorm(model->parameters(), TestOptimizer().grad_clip));
    optimizer->step();
    result.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) {
    result.parameters[item.key()] = item.value().detach().clone();
  }
  return result;
}

struct LayoutRun {
  ParallelLayout layout;
  int zero_stage = 0;  // 0: replicated AdamW; 1, 2: ShardedAdamW
  int micro_batch = 0;  // sequences per forward; 0 = the replica's whole slice
  // ShardedAdamW's update as LibTorch operations (its CUDA path) on the CPU.
  bool torch_ops_update = false;
};

// Trains `run.layout` (pipeline 1) with one thread per rank: each
// data-parallel replica takes its slice of every global batch in
// micro-batches; gradients are averaged over the data group (all-reduce,
// or ZeRO's reduce-scatter) and clipped by the global norm.
RunResult TrainLayout(const GptConfig& config, const LayoutRun& run_options,
                      const std::vector<Batch>& batches) {
  const ParallelLayout layout = run_options.layout;
  const int world = layout.world_size();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex init_mutex;  // the global generator is shared by the threads
  std::vector<std::map<std::string, torch::Tensor>> shards(world), first_grads(world);
  std::vector<std::vector<double>> losses(world), norms(world);
  std::vector<std::string> errors(world);
  // Groups outlive every rank's work (see layout_trainer_test.cc, Run).
  std::vector<std::optional<ParallelGroups>> kept(world);
  auto run = [&](int rank) {
    torch::set_num_threads(1);  // see trainer_test.cc, RunRanks
    try {
      ParallelGroupOptions options;
      options.timeout_seconds = 120;
      options.local_addr = "127.0.0.1";
      absl::StatusOr<ParallelGroups> created = CreateParallelGroups(store, rank, layout, options);
      if (!created.ok()) {
        errors[rank] = created.status().ToString();
        return;
      }
      kept[rank].emplace(*std::move(created));
      ParallelGroups* groups = &*kept[rank];
      const RankCoordinates me = groups->coordinates;
      GptPartition partition;
      partition.tp_rank = me.tp;
      partition.tp_size = layout.tensor;
      const std::vector<int> split = SplitLayers(config.n_layer, layout.pipeline).value();
      partition.first_block = FirstBlockOfStage(split, me.pp);
      partition.end_block = partition.first_block + split[me.pp];
      partition.embedding = me.pp == 0;
      partition.head = me.pp == layout.pipeline - 1;
      // The last stage's copy of the tied wte is counted by the first.
      const bool skip_wte = layout.pipeline > 1 && partition.head;
      ParallelGpt model(nullptr);
      {
        std::lock_guard<std::mutex> lock(init_mutex);
        torch::manual_seed(kSeed);
        model = ParallelGpt(config, partition, groups->tensor);
      }
      std::unique_ptr<torch::optim::AdamW> optimizer;
      std::unique_ptr<ShardedAdamW> sharded;
      if (run_options.zero_stage == 0) {
        optimizer = MakeAdamW(*model, TestOptimizer());
      } else {
        std::vector<ShardedParameter> parameters;
        for (const auto& item : model->named_parameters()) {
          const bool counted = !(skip_wte && item.key() == "wte.weight");
          // Both pipeline ends' copies are summed after backward.
          const bool tied = groups->embedding != nullptr && item.key() == "wte.weight";
          parameters.push_back({item.key(), item.value(), item.value().dim() >= 2, counted,
                                tied, ReplicatedSpanOf(item.key(), config, layout.tensor)});
        }
        sharded = std::make_unique<ShardedAdamW>(std::move(parameters), TestOptimizer(),
                                                 run_options.zero_stage, groups->data.get(),
                                                 groups->tensor.get(), groups->pipeline.get());
        if (run_options.torch_ops_update) sharded->set_update_path(FusedAdamWPath::kTorchOps);
      }
      const int per_replica = kGlobalBatch / layout.data;
      const int micro = run_options.micro_batch > 0 ? run_options.micro_batch : per_replica;
      const int accumulation = per_replica / micro;
      for (const Batch& b : batches) {
        if (optimizer) optimizer->zero_grad();
        torch::Tensor loss = torch::zeros({});
        if (layout.pipeline == 1) {
          for (int m = 0; m < accumulation; ++m) {
            const int64_t first = me.dp * per_replica + m * micro;
            torch::Tensor micro_loss =
                model->Loss(b.x.narrow(0, first, micro), b.y.narrow(0, first, micro)) /
                accumulation;
            micro_loss.backward();
            loss = loss + micro_loss.detach();
          }
        } else {
          std::vector<torch::Tensor> xs, ys;
          for (int m = 0; m < accumulation; ++m) {
            const int64_t first = me.dp * per_replica + m * micro;
            xs.push_back(b.x.narrow(0, first, micro));
            ys.push_back(b.y.narrow(0, first, micro));
          }
          loss = torch::tensor(RunOneFOneB(*model, groups->pipeline.get(), xs, ys),
                               torch::kFloat);
          SumTiedEmbeddingGradients(*model, groups->embedding.get());
        }
        if (sharded) {
          const ShardedStepResult step = sharded->Step(TestOptimizer().lr,
                                                       TestOptimizer().grad_clip);
          EXPECT_TRUE(step.applied);
          norms[rank].push_back(step.grad_norm);
        } else {
          {
            torch::NoGradGuard no_grad;
            for (torch::Tensor p : model->parameters()) {
              torch::Tensor g = p.mutable_grad();
              AllReduceInPlace(g, groups->data.get());
              g.div_(layout.data);
            }
          }
          if (first_grads[rank].empty()) {
            for (const auto& item : model->named_parameters()) {
              first_grads[rank][item.key()] = item.value().grad().clone();
            }
          }
          std::vector<std::string> skip;
          if (skip_wte) skip.push_back("wte.weight");
          norms[rank].push_back(ClipGradNormAcrossGroups(*model, groups->tensor.get(),
                                                         groups->pipeline.get(),
                                                         TestOptimizer().grad_clip, config, skip));
          optimizer->step();
        }
        torch::Tensor mean_loss = loss.clone();
        AllReduceInPlace(mean_loss, groups->data.get());
        losses[rank].push_back(mean_loss.item<double>() / layout.data);
      }
      for (const auto& item : model->named_parameters()) {
        shards[rank][item.key()] = item.value().detach().clone();
      }
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) threads.emplace_back(run, rank);
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(errors[rank], "") << "rank " << rank;
  }
  RunResult result;
  result.losses = losses[0];
  result.grad_norms = norms[0];
  // Every rank reports the same loss and norm.
  for (int rank = 1; rank < world; ++rank) {
    EXPECT_EQ(losses[rank], losses[0]) << "rank " << rank;
    EXPECT_EQ(norms[rank], norms[0]) << "rank " << rank;
  }
  if (::testing::Test::HasFailure()) return {};
  // Merge the tensor group of the first stage of replica 0 that holds each
  // parameter; other replicas (and the last stage's wte) must hold the same.
  for (const auto& [name, shape] : GptParameterShapes(config)) {
    std::vector<torch::Tensor> parts;
    int stage = 0;
    while (stage < layout.pipeline && shards[RankOf(layout, {0, stage, 0})].count(name) == 0) {
      ++stage;
    }
    for (int tp = 0; tp < layout.tensor && stage < layout.pipeline; ++tp) {
      const int rank = RankOf(layout, {0, stage, tp});
      if (shards[rank].count(name) == 0) break;
      parts.push_back(shards[rank][name]);
    }
    if (static_cast<int>(parts.size()) != layout.tensor) {
      ADD_FAILURE() << "no shards of " << name;
      continue;
    }
    result.parameters[name] = MergeTensorParallelShards(name, parts, config);
    if (run_options.zero_stage == 0) {
      std::vector<torch::Tensor> grad_parts;
      for (int tp = 0; tp < layout.tensor; ++tp) {
        grad_parts.push_back(first_grads[RankOf(layout, {0, stage, tp})][name]);
      }
      result.first_gradients[name] = MergeTensorParallelShards(name, grad_parts, config);
    }
    for (int rank = 0; rank < world; ++rank) {
      const RankCoordinates c = CoordinatesOf(layout, rank);
      if (shards[rank].count(name) == 0) continue;
      EXPECT_TRUE(torch::equal(shards[rank][name], shards[RankOf(layout, {0, stage, c.tp})][name]))
          << name << " differs between replicas or stages (rank " << rank << ")";
      // Every rank holds exactly its shard of the merged tensor: copied
      // key/value heads are bit-identical on every rank that holds them.
      EXPECT_TRUE(torch::equal(shards[rank][name],
                               ShardForTensorParallel(name, result.parameters[name], config,
                                                      c.tp, layout.tensor)))
          << name << " on rank " << rank << " is not its shard of the merged tensor";
    }
  }
  return result;
}

// Largest difference of each tensor of `run` from `reference`, as a fraction
// of the reference tensor's largest magnitude; the worst of them.
std::pair<double, std::string> WorstDifference(const std::map<std::string, torch::Tensor>& reference,
                                               const std::map<std::string, torch::Tensor>& run) {
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, expected] : reference) {
    auto it = run.find(name);
    if (it == run.end() || !it->second.defined()) {
      ADD_FAILURE() << "no tensor " << name;
      continue;
    }
    if (it->second.sizes() != expected.sizes()) {
      ADD_FAILURE() << name << ": " << it->second.sizes() << " vs " << expected.sizes();
      continue;
    }
    const double scale = expected.abs().max().item<double>();
    const double diff = (it->second - expected).abs().max().item<double>() / scale;
    if (diff > worst) {
      worst = diff;
      worst_name = name;
    }
  }
  return {worst, worst_name};
}

// Tolerances (required: 1e-5 for losses and parameters). Losses relative;
// the first step's gradients, which no optimizer has touched, and the
// parameters after 10 AdamW steps each relative to their tensor's largest
// magnitude (TestOptimizer says why its eps makes that bar fair).
constexpr double kLossTolerance = 1e-5;
constexpr double kGradientTolerance = 1e-5;
constexpr double kParameterTolerance = 1e-5;

void ExpectEquivalent(const RunResult& reference, const RunResult& run, const std::string& what) {
  ASSERT_EQ(run.losses.size(), reference.losses.size()) << what;
  double worst_loss = 0;
  for (size_t i = 0; i < run.losses.size(); ++i) {
    worst_loss = std::max(worst_loss, std::abs(run.losses[i] - reference.losses[i]) /
                                          std::abs(reference.losses[i]));
  }
  const auto [worst_parameter, parameter_name] =
      WorstDifference(reference.parameters, run.parameters);
  std::string gradient_text = "not compared (sharded)";
  if (!run.first_gradients.empty()) {
    const auto [worst_gradient, gradient_name] =
        WorstDifference(reference.first_gradients, run.first_gradients);
    char text[256];
    std::snprintf(text, sizeof(text), "%.3g (%s)", worst_gradient, gradient_name.c_str());
    gradient_text = text;
    EXPECT_LE(worst_gradient, kGradientTolerance) << what << " (" << gradient_name << ")";
  }
  std::printf("%s: %d steps, worst loss difference %.3g (relative); first-step gradients %s; "
              "final parameters %.3g (%s), each of its tensor's largest magnitude\n",
              what.c_str(), static_cast<int>(run.losses.size()), worst_loss,
              gradient_text.c_str(), worst_parameter, parameter_name.c_str());
  EXPECT_LE(worst_loss, kLossTolerance) << what;
  EXPECT_LE(worst_parameter, kParameterTolerance) << what << " (" << parameter_name << ")";
}

TEST(ParallelGptTest, WholeModelOnOneRankStartsWithGptsWeights) {
  const GptConfig config = TinyConfig();
  torch::manual_seed(kSeed);
  Gpt reference(config);
  torch::manual_seed(kSeed);
  ParallelGpt parallel(config, GptPartition{}, nullptr);
  const auto mine = parallel->named_parameters();
  ASSERT_EQ(mine.size(), reference->named_parameters().size());
  for (const auto& item : reference->named_parameters()) {
    const torch::Tensor* p = mine.find(item.key());
    ASSERT_NE(p, nullptr) << item.key();
    EXPECT_TRUE(torch::equal(*p, item.value())) << item.key();
  }
  // And the generator is left where Gpt leaves it.
  torch::manual_seed(kSeed);
  Gpt again(config);
  const torch::Tensor after_gpt = torch::rand({4});
  torch::manual_seed(kSeed);
  ParallelGpt parallel_again(config, GptPartition{}, nullptr);
  EXPECT_TRUE(torch::equal(torch::rand({4}), after_gpt));
}

TEST(ParallelGptTest, PartitionsFollowGivenStageLayers) {
  GptConfig config = TinyConfig();
  config.n_layer = 4;
  const ParallelLayout layout{1, 1, 2};
  RankCoordinates first, last;
  first.pp = 0;
  last.pp = 1;
  // The balanced split, then one that leaves the last stage a single block.
  EXPECT_EQ(PartitionFor(config, layout, first).end_block, 2);
  const GptPartition a = PartitionFor(config, layout, first, {3, 1});
  const GptPartition b = PartitionFor(config, layout, last, {3, 1});
  EXPECT_EQ(a.first_block, 0);
  EXPECT_EQ(a.end_block, 3);
  EXPECT_TRUE(a.embedding);
  EXPECT_EQ(b.first_block, 3);
  EXPECT_EQ(b.end_block, 4);
  EXPECT_TRUE(b.head);
  EXPECT_THROW(PartitionFor(config, layout, first, {4, 0}), c10::Error);
  EXPECT_THROW(PartitionFor(config, layout, first, {2, 1}), c10::Error);
  EXPECT_THROW(PartitionFor(config, layout, first, {4}), c10::Error);
}

TEST(OneFOneBScheduleTest, WarmUpSteadyStateCoolDown) {
  using P = PipelineOp;
  // Stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, then F/B pairs.
  EXPECT_EQ(OneFOneBSchedule(4, 0, 6),
            (std::vector<P>{{P::kForward, 0}, {P::kForward, 1}, {P::kForward, 2},
                            {P::kForward, 3}, {P::kBackward, 0}, {P::kForward, 4},
                            {P::kBackward, 1}, {P::kForward, 5}, {P::kBackward, 2},
                            {P::kBackward, 3}, {P::kBackward, 4}, {P::kBackward, 5}}));
  // The last stage alternates from the start.
  EXPECT_EQ(OneFOneBSchedule(4, 3, 2),
            (std::vector<P>{{P::kForward, 0}, {P::kBackward, 0}, {P::kForward, 1},
                            {P::kBackward, 1}}));
  // Fewer micro-batches than stages: all forwards, then all backwards.
  EXPECT_EQ(OneFOneBSchedule(4, 0, 2),
            (std::vector<P>{{P::kForward, 0}, {P::kForward, 1}, {P::kBackward, 0},
                            {P::kBackward, 1}}));
}

TEST(OneFOneBScheduleTest, AtMostStagesMinusStageMicroBatchesInFlight) {
  for (int stages : {1, 2, 3, 5}) {
    for (int stage = 0; stage < stages; ++stage) {
      for (int m : {1, 2, 4, 9}) {
        int in_flight = 0, most = 0, forwards = 0, backwards = 0;
        for (const PipelineOp& op : OneFOneBSchedule(stages, stage, m)) {
          if (op.kind == PipelineOp::kForward) {
            EXPECT_EQ(op.micro_batch, forwards++);
            most = std::max(most, ++in_flight);
          } else {
            EXPECT_EQ(op.micro_batch, backwards++);
            --in_flight;
          }
        }
        EXPECT_EQ(forwards, m);
        EXPECT_EQ(backwards, m);
        EXPECT_LE(most, std::min(m, stages - stage)) << stages << " " << stage << " " << m;
      }
    }
  }
}

// Multi-query attention with GPT-2's biases: one key/value head, copied to
// every rank of a tensor group.
GptConfig MultiQueryConfig() {
  GptConfig c = TinyConfig();
  c.n_kv_head = 1;
  return c;
}

// The Llama family with two key/value heads: split over 2 ranks, each
// copied to two of 4.
GptConfig GroupedQueryLlamaConfig() {
  GptConfig c = TinyConfig();
  c.rms_norm = true;
  c.gated_mlp = true;
  c.ffn_hidden = 88;
  c.rotary = true;
  c.n_kv_head = 2;
  c.tied_embeddings = false;
  c.bias = false;
  return c;
}

TEST(ParallelGptTest, ShardAndMergeAreInverse) {
  for (const GptConfig& config : {TinyConfig(), MultiQueryConfig(), GroupedQueryLlamaConfig()}) {
  torch::manual_seed(kSeed);
  Gpt reference(config);
  for (int tp : {2, 4}) {
    for (const auto& item : reference->named_parameters()) {
      std::vector<torch::Tensor> shards;
      for (int r = 0; r < tp; ++r) {
        shards.push_back(ShardForTensorParallel(item.key(), item.value(), config, r, tp));
      }
      EXPECT_TRUE(torch::equal(MergeTensorParallelShards(item.key(), shards, config),
                               item.value()))
          << item.key() << " tp " << tp << " kv heads " << KvHeads(config);
      EXPECT_EQ(shards[tp - 1].sizes().vec(),
                TensorParallelShardShape(item.key(), item.value().sizes().vec(), config, tp - 1,
                                         tp))
          << item.key();
    }
  }
  }
}

// With fewer key/value heads than ranks, each rank holds the head its query
// heads use: ranks 0 and 1 of 4 hold head 0, ranks 2 and 3 head 1.
TEST(ParallelGptTest, CopiesKeyValueHeadsWhenFewerThanRanks) {
  const GptConfig config = GroupedQueryLlamaConfig();  // 4 query, 2 key/value heads of 8
  EXPECT_EQ(LocalKeyValueHeads(config, 4), 1);
  EXPECT_EQ(KeyValueCopies(config, 4), 2);
  EXPECT_EQ(KeyValueCopies(config, 2), 1);
  const torch::Tensor full = torch::arange(64).view({64, 1}).to(torch::kFloat);  // 32 + 2*16 rows
  const torch::Tensor rank2 = ShardForTensorParallel("h.0.attn.c_attn.weight", full, config, 2, 4);
  // Query head 2 (rows 16-23), key head 1 (rows 40-47), value head 1 (56-63).
  EXPECT_TRUE(torch::equal(rank2.view({-1}),
                           torch::cat({torch::arange(16, 24), torch::arange(40, 48),
                                       torch::arange(56, 64)})
                               .to(torch::kFloat)));
  const ReplicatedSpan span = ReplicatedSpanOf("h.0.attn.c_attn.weight", config, 4);
  EXPECT_EQ(span.begin, 8 * 32);
  EXPECT_EQ(span.end, 24 * 32);
  EXPECT_EQ(span.copies, 2);
  EXPECT_EQ(ReplicatedSpanOf("h.0.attn.c_attn.weight", config, 2).copies, 1);
  EXPECT_EQ(ReplicatedSpanOf("h.0.mlp.c_fc.weight", config, 4).copies, 1);
  // The copied rows count 1/2 on each of their two holders.
  const torch::Tensor grad = torch::ones({24, 32});
  EXPECT_DOUBLE_EQ(SquaresCountedOnce(grad, 0, span).item<double>(), 8 * 32 + 16 * 32 / 2.0);
  EXPECT_DOUBLE_EQ(SquaresCountedOnce(grad.narrow(0, 20, 4), 20 * 32, span).item<double>(),
                   4 * 32 / 2.0);
}

TEST(ParallelGptTest, RefusesLayoutsItCannotSplit) {
  GptConfig config = TinyConfig();
  EXPECT_TRUE(ValidateTensorParallel(config, 4).ok());
  const absl::Status heads = ValidateTensorParallel(config, 3);
  EXPECT_EQ(heads.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(heads.message()), ::testing::HasSubstr("model.n_head"));
  config.dropout = 0.1;
  EXPECT_EQ(ValidateTensorParallel(config, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateTensorParallel(config, 1).ok());
  // Copied key/value heads run; heads that a rank's queries would use only
  // in part do not.
  EXPECT_TRUE(ValidateTensorParallel(MultiQueryConfig(), 4).ok());
  GptConfig six = TinyConfig();
  six.n_head = 6;
  six.d_model = 48;
  six.n_kv_head = 3;
  const absl::Status kv = ValidateTensorParallel(six, 2);
  EXPECT_EQ(kv.code(), absl::StatusCode::kUnimplemented) << kv;
  EXPECT_THAT(std::string(kv.message()), ::testing::HasSubstr("model.n_kv_head"));
}

class ParallelEquivalenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    config_ = new GptConfig(TinyConfig());
    batches_ = new std::vector<Batch>(MakeBatches(*config_));
    reference_ = new RunResult(TrainSingleRank(*config_, *batches_));
    // The clip threshold is low enough to act, so clipping by the global
    // norm across shards is part of what is compared.
    ASSERT_GT(*std::max_element(reference_->grad_norms.begin(), reference_->grad_norms.end()),
              TestOptimizer().grad_clip);
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete batches_;
    delete config_;
  }
  static GptConfig* config_;
  static std::vector<Batch>* batches_;
  static RunResult* reference_;
};
GptConfig* ParallelEquivalenceTest::config_ = nullptr;
std::vector<Batch>* ParallelEquivalenceTest::batches_ = nullptr;
RunResult* ParallelEquivalenceTest::reference_ = nullptr;

// The floor: the same single-rank training through ParallelGpt (plain
// cross entropy, dense embedding gradient) instead of Gpt (fused, chunked
// loss; sparse embedding gradient).
TEST_F(ParallelEquivalenceTest, OneRank) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{1, 1, 1}}, *batches_),
                   "ParallelGpt, one rank");
}

TEST_F(ParallelEquivalenceTest, TensorParallel2) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{1, 2, 1}}, *batches_), "TP2");
}

TEST_F(ParallelEquivalenceTest, TensorParallel4) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{1, 4, 1}}, *batches_), "TP4");
}

TEST_F(ParallelEquivalenceTest, DataParallel2TimesTensorParallel2) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{2, 2, 1}}, *batches_), "DP2xTP2");
}

TEST_F(ParallelEquivalenceTest, PipelineParallel2UnevenSplitFourMicroBatches) {
  // 3 blocks on 2 stages (2 + 1), m = 4 micro-batches of one sequence.
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{1, 1, 2}, 0, 1}, *batches_),
                   "PP2 (m 4, 3 blocks as 2 + 1)");
}

TEST_F(ParallelEquivalenceTest, PipelineParallel3) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{1, 1, 3}, 0, 1}, *batches_),
                   "PP3 (m 4)");
}

TEST_F(ParallelEquivalenceTest, TensorParallel2TimesPipelineParallel2) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{1, 2, 2}, 0, 1}, *batches_),
                   "TP2xPP2 (m 4)");
}

TEST_F(ParallelEquivalenceTest, DataParallel2WithMicroBatches) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{2, 1, 1}, 0, 1}, *batches_),
                   "DP2 (2 micro-batches)");
}

TEST_F(ParallelEquivalenceTest, Zero1DataParallel2) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{2, 1, 1}, 1, 1}, *batches_),
                   "ZeRO-1 DP2");
}

// The update CUDA ranks run (LibTorch operations over the flat buffers),
// here on the CPU, trains like one rank too.
TEST_F(ParallelEquivalenceTest, Zero1DataParallel2WithTheTorchOpsUpdate) {
  LayoutRun run{{2, 1, 1}, 1, 1};
  run.torch_ops_update = true;
  ExpectEquivalent(*reference_, TrainLayout(*config_, run, *batches_),
                   "ZeRO-1 DP2, torch-ops update");
}

TEST_F(ParallelEquivalenceTest, Zero2DataParallel2) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{2, 1, 1}, 2, 1}, *batches_),
                   "ZeRO-2 DP2");
}

TEST_F(ParallelEquivalenceTest, Zero1DataParallel2TimesTensorParallel2) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{2, 2, 1}, 1, 1}, *batches_),
                   "ZeRO-1 DP2xTP2");
}

TEST_F(ParallelEquivalenceTest, Zero2DataParallel2TimesTensorParallel2) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{2, 2, 1}, 2, 1}, *batches_),
                   "ZeRO-2 DP2xTP2");
}

TEST_F(ParallelEquivalenceTest, Zero2DataParallel2TimesPipelineParallel2) {
  ExpectEquivalent(*reference_, TrainLayout(*config_, {{2, 1, 2}, 2, 1}, *batches_),
                   "ZeRO-2 DP2xPP2");
}

// Fewer key/value heads than tensor ranks: the copies on a tensor group
// train as the one head does on one rank (their gradients summed over the
// copies in backward, counted once in the norm, and bit-identical at the
// end: TrainLayout checks every rank's shard against the merged tensor).
class KeyValueCopiesEquivalenceTest : public ::testing::TestWithParam<int> {
 protected:
  GptConfig Config() const {
    return GetParam() == 0 ? MultiQueryConfig() : GroupedQueryLlamaConfig();
  }
  std::string Name() const { return GetParam() == 0 ? "multi-query" : "Llama, 2 kv heads"; }
};

TEST_P(KeyValueCopiesEquivalenceTest, TrainsLikeOneRank) {
  const GptConfig config = Config();
  const std::vector<Batch> batches = MakeBatches(config);
  const RunResult reference = TrainSingleRank(config, batches);
  // {data, tensor, pipeline}, ZeRO stage, micro-batch.
  const std::vector<std::pair<LayoutRun, std::string>> multi_query = {
      {{{1, 4, 1}}, "TP4"},
      {{{2, 2, 1}}, "DP2xTP2"},
      {{{2, 2, 1}, 1, 1}, "ZeRO-1 DP2xTP2"},
      {{{2, 2, 1}, 2, 1}, "ZeRO-2 DP2xTP2"},
      {{{1, 2, 2}, 0, 1}, "TP2xPP2 (m 4)"}};
  // Two heads: copied under 4 ranks (under 2 they are split).
  const std::vector<std::pair<LayoutRun, std::string>> llama = {
      {{{1, 4, 1}}, "TP4"}, {{{2, 4, 1}, 2, 1}, "ZeRO-2 DP2xTP4"}};
  for (const auto& [run, name] : GetParam() == 0 ? multi_query : llama) {
    ExpectEquivalent(reference, TrainLayout(config, run, batches), Name() + " " + name);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KeyValueCopiesEquivalenceTest, ::testing::Values(0, 1));

}  // namespace
}  // namespace loom::engine
