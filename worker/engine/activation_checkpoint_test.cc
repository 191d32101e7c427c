#include "worker/engine/activation_checkpoint.h"

#include <cmath>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "worker/engine/cpu_memory_meter.h"
#include "worker/engine/gpt.h"

namespace loom::engine {
namespace {

GptConfig SmallGpt() {
  GptConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.d_model = 64;
  c.seq_len = 64;
  c.vocab_size = 128;
  c.dropout = 0.0;
  return c;
}

struct StepRun {
  double loss = 0;
  std::vector<torch::Tensor> grads;  // in named_parameters() order
  std::vector<std::string> names;
};

// Builds Gpt(config) from `init_seed`, seeds the generator with `step_seed`
// (the dropout masks), and runs one forward + backward of the fused loss.
StepRun LossAndGrads(const GptConfig& config, uint64_t init_seed = 3, uint64_t step_seed = 11) {
  torch::manual_seed(init_seed);
  Gpt model(config);
  model->train();
  torch::manual_seed(99);
  const torch::Tensor idx = torch::randint(0, config.vocab_size, {2, config.seq_len}, torch::kLong);
  const torch::Tensor targets =
      torch::randint(0, config.vocab_size, {2, config.seq_len}, torch::kLong);
  torch::manual_seed(step_seed);
  torch::Tensor loss = model->Loss(idx, targets);
  loss.backward();
  StepRun run;
  run.loss = loss.item<double>();
  for (const auto& item : model->named_parameters()) {
    run.names.push_back(item.key());
    run.grads.push_back(item.value().grad().clone());
  }
  return run;
}

// Largest |a - b| over every gradient, relative to the largest |b|.
double MaxRelativeGradDifference(const StepRun& a, const StepRun& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    diff = std::max(diff, (a.grads[i] - b.grads[i]).abs().max().item<double>());
    scale = std::max(scale, b.grads[i].abs().max().item<double>());
  }
  return diff / scale;
}

bool BitwiseEqual(const StepRun& a, const StepRun& b) {
  if (a.loss != b.loss) return false;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    if (!torch::equal(a.grads[i], b.grads[i])) return false;
  }
  return true;
}

class ActivationCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_F(ActivationCheckpointTest, SegmentSizes) {
  EXPECT_EQ(CheckpointSegmentBlocks(12, 0), 0);
  EXPECT_EQ(CheckpointSegmentBlocks(12, 1), 1);
  EXPECT_EQ(CheckpointSegmentBlocks(12, 5), 5);
  EXPECT_EQ(CheckpointSegmentBlocks(12, 40), 12);
  EXPECT_EQ(CheckpointSegmentBlocks(12, kActivationCheckpointingSqrt), 4);  // ceil(3.46)
  EXPECT_EQ(CheckpointSegmentBlocks(16, kActivationCheckpointingSqrt), 4);
  EXPECT_EQ(CheckpointSegmentBlocks(8, kActivationCheckpointingSqrt), 3);
  EXPECT_EQ(CheckpointSegmentBlocks(1, kActivationCheckpointingSqrt), 1);
}

TEST_F(ActivationCheckpointTest, FunctionGradientsMatchAndOnlyTheInputIsKept) {
  torch::manual_seed(1);
  torch::nn::Linear a(8, 16), b(16, 8);
  std::vector<torch::Tensor> params = a->parameters();
  for (const torch::Tensor& p : b->parameters()) params.push_back(p);
  auto segment = [&](const torch::Tensor& x) { return b(torch::tanh(a(x))) * x; };
  const torch::Tensor x0 = torch::randn({5, 8});

  torch::Tensor x_plain = x0.clone().requires_grad_(true);
  torch::Tensor plain = segment(x_plain);
  torch::autograd::variable_list g_plain =
      torch::autograd::grad({plain.sum()}, {x_plain, params[0], params[1], params[2], params[3]});

  torch::Tensor x_ckpt = x0.clone().requires_grad_(true);
  torch::Tensor ckpt = CheckpointedForward(segment, x_ckpt, params);
  EXPECT_TRUE(torch::equal(plain, ckpt));
  // torch::autograd::grad reaches the parameters through the checkpoint.
  torch::autograd::variable_list g_ckpt =
      torch::autograd::grad({ckpt.sum()}, {x_ckpt, params[0], params[1], params[2], params[3]});
  for (size_t i = 0; i < g_plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(g_plain[i], g_ckpt[i])) << "input " << i;
  }
  // Nothing was written to .grad by grad().
  for (const torch::Tensor& p : params) EXPECT_FALSE(p.grad().defined());

  // Without grad mode it is the plain function, and records nothing.
  torch::NoGradGuard no_grad;
  torch::Tensor value = CheckpointedForward(segment, x_ckpt, params);
  EXPECT_FALSE(value.requires_grad());
  EXPECT_TRUE(torch::equal(value, plain));
}

TEST_F(ActivationCheckpointTest, GptGradientsEqualTheUncheckpointedOnes) {
  const StepRun plain = LossAndGrads(SmallGpt());
  for (int setting : {1, 2, 3, kActivationCheckpointingSqrt}) {
    GptConfig c = SmallGpt();
    c.activation_checkpointing = setting;
    const StepRun ckpt = LossAndGrads(c);
    ASSERT_EQ(ckpt.names, plain.names);
    EXPECT_EQ(ckpt.loss, plain.loss) << "setting " << setting;
    EXPECT_LE(MaxRelativeGradDifference(ckpt, plain), 1e-6) << "setting " << setting;
    EXPECT_TRUE(BitwiseEqual(ckpt, plain)) << "setting " << setting;
  }
}

// Dropout draws from the CPU generator inside the blocks; the recompute
// replays the generator state of the first run, so masks match.
TEST_F(ActivationCheckpointTest, DropoutIsReplayedInTheRecompute) {
  GptConfig c = SmallGpt();
  c.dropout = 0.2;
  const StepRun plain = LossAndGrads(c);
  // The masks do matter: another step seed gives other gradients.
  const StepRun other_masks = LossAndGrads(c, /*init_seed=*/3, /*step_seed=*/12);
  EXPECT_GT(MaxRelativeGradDifference(other_masks, plain), 1e-3);
  for (int setting : {1, kActivationCheckpointingSqrt}) {
    c.activation_checkpointing = setting;
    const StepRun ckpt = LossAndGrads(c);
    EXPECT_LE(MaxRelativeGradDifference(ckpt, plain), 1e-6) << "setting " << setting;
    EXPECT_TRUE(BitwiseEqual(ckpt, plain)) << "setting " << setting;
  }
}

// Backward puts the generator back where forward left it: the draws after a
// step are those of the uncheckpointed run.
TEST_F(ActivationCheckpointTest, GeneratorStateAfterBackwardIsUnchanged) {
  auto next_draw = [](int setting) {
    GptConfig c = SmallGpt();
    c.dropout = 0.2;
    c.activation_checkpointing = setting;
    LossAndGrads(c);
    return torch::rand({4});
  };
  EXPECT_TRUE(torch::equal(next_draw(0), next_draw(1)));
}

TEST_F(ActivationCheckpointTest, Bf16GradientsEqualTheUncheckpointedOnes) {
  GptConfig c = SmallGpt();
  c.precision = Precision::kBf16;
  const StepRun plain = LossAndGrads(c);
  c.activation_checkpointing = 1;
  const StepRun ckpt = LossAndGrads(c);
  EXPECT_EQ(ckpt.loss, plain.loss);
  EXPECT_LE(MaxRelativeGradDifference(ckpt, plain), 1e-6);
  for (const torch::Tensor& g : ckpt.grads) EXPECT_EQ(g.scalar_type(), torch::kFloat);
}

// Peak bytes of live CPU tensors during one forward + backward, counted by
// the allocator (CpuMemoryMeter), above what was alive before it.
int64_t PeakStepBytes(const GptConfig& config) {
  CpuMemoryMeter& meter = CpuMemoryMeter::Install();
  torch::manual_seed(3);
  Gpt model(config);
  const torch::Tensor idx = torch::randint(0, config.vocab_size, {4, config.seq_len}, torch::kLong);
  const torch::Tensor targets =
      torch::randint(0, config.vocab_size, {4, config.seq_len}, torch::kLong);
  const int64_t before = meter.current_bytes();
  meter.ResetPeak();
  model->Loss(idx, targets).backward();
  return meter.peak_bytes() - before;
}

TEST_F(ActivationCheckpointTest, MeterCountsLiveStorage) {
  CpuMemoryMeter& meter = CpuMemoryMeter::Install();
  const int64_t before = meter.current_bytes();
  meter.ResetPeak();
  {
    torch::Tensor t = torch::empty({1 << 20}, torch::kFloat);  // 4 MiB
    EXPECT_EQ(meter.current_bytes() - before, 4 << 20);
  }
  EXPECT_EQ(meter.current_bytes(), before);
  EXPECT_EQ(meter.peak_bytes() - before, 4 << 20);
}

TEST_F(ActivationCheckpointTest, PeakMemoryFalls) {
  GptConfig c = SmallGpt();
  c.n_layer = 8;
  c.seq_len = 128;
  const int64_t plain = PeakStepBytes(c);
  c.activation_checkpointing = 1;
  const int64_t every_block = PeakStepBytes(c);
  c.activation_checkpointing = kActivationCheckpointingSqrt;  // segments of 3
  const int64_t sqrt_placement = PeakStepBytes(c);
  std::cout << "peak bytes of one step: plain " << plain << ", every block " << every_block
            << " (" << static_cast<double>(every_block) / plain << "x), sqrt(L) segments "
            << sqrt_placement << " (" << static_cast<double>(sqrt_placement) / plain << "x)"
            << std::endl;
  // 8 blocks whose activations are ~20x their input each: keeping inputs
  // only cuts the step's peak to well under half.
  EXPECT_LT(every_block, plain / 2);
  EXPECT_LT(sqrt_placement, plain * 3 / 4);
  EXPECT_LT(every_block, sqrt_placement);
}

}  // namespace
}  // namespace loom::engine
