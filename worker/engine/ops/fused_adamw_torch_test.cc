#include "worker/engine/ops/fused_adamw_torch.h"

#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::OptimizerParamGroup;

// The parameter shapes of a small GPT (2 layers, d 64, vocab 512, context
// 64): matrices and embeddings decay, biases and LayerNorm parameters do not.
std::vector<std::vector<int64_t>> GptShapes() {
  const int64_t d = 64, vocab = 512, context = 64;
  std::vector<std::vector<int64_t>> shapes = {{vocab, d}, {context, d}};
  const std::vector<std::vector<int64_t>> block = {
      {d},        {d},      // ln_1 gain, bias
      {3 * d, d}, {3 * d},  // attention qkv
      {d, d},     {d},      // attention output projection
      {d},        {d},      // ln_2 gain, bias
      {4 * d, d}, {4 * d},  // MLP up
      {d, 4 * d}, {d},      // MLP down
  };
  for (int layer = 0; layer < 2; ++layer) {
    shapes.insert(shapes.end(), block.begin(), block.end());
  }
  shapes.push_back({d});
  shapes.push_back({d});
  return shapes;
}

// One copy of the model's parameters, initialised from `seed`.
std::vector<torch::Tensor> MakeParams(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params;
  for (const std::vector<int64_t>& shape : GptShapes()) {
    params.push_back((0.02 * torch::randn(shape)).requires_grad_(true));
  }
  return params;
}

std::vector<torch::Tensor> CloneParams(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// MakeAdamW's grouping (optimizer.h): dim >= 2 decays, the rest does not.
std::vector<OptimizerParamGroup> Groups(const std::vector<torch::Tensor>& params,
                                        const AdamWOptions& options) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const torch::Tensor& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  AdamWOptions no_decay_options = options;
  no_decay_options.weight_decay(0.0);
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<AdamWOptions>(options));
  groups.emplace_back(no_decay, std::make_unique<AdamWOptions>(no_decay_options));
  return groups;
}

AdamWOptions Options() {
  return AdamWOptions(1e-2).betas(std::make_tuple(0.9, 0.95)).eps(1e-8).weight_decay(0.1);
}

std::unique_ptr<FusedAdamW> MakeFused(const std::vector<torch::Tensor>& params) {
  absl::StatusOr<std::unique_ptr<FusedAdamW>> fused =
      FusedAdamW::Create(Groups(params, Options()), Options());
  EXPECT_TRUE(fused.ok()) << fused.status();
  return std::move(fused).value();
}

// Gradients for step `step`: the same for every copy, scaled so that their
// global norm is about `scale` * sqrt(#elements) * 0.1.
void SetGrads(const std::vector<torch::Tensor>& params, int step, double scale = 1.0) {
  torch::manual_seed(1000 + step);
  for (const torch::Tensor& p : params) p.mutable_grad() = scale * 0.1 * torch::randn_like(p);
}

// torch.nn.utils.clip_grad_norm_ (as loom::engine::ClipGradNorm).
void ClipGrads(const std::vector<torch::Tensor>& params, double max_norm) {
  double sum_squares = 0;
  for (const torch::Tensor& p : params) {
    sum_squares += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(sum_squares);
  if (norm > max_norm) {
    for (const torch::Tensor& p : params) p.mutable_grad().mul_(max_norm / (norm + 1e-6));
  }
}

void SetLr(torch::optim::Optimizer& optimizer, double lr) {
  for (OptimizerParamGroup& group : optimizer.param_groups()) group.options().set_lr(lr);
}

// max_i |a_i - b_i| / max_i |b_i|: the error relative to the tensor's
// scale. (Element-wise relative error is meaningless for elements that pass
// near zero, such as a moment whose sign flips.)
double MaxRelativeDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor a64 = a.detach().to(torch::kDouble), b64 = b.detach().to(torch::kDouble);
  const double scale = b64.abs().max().item<double>();
  const double diff = (a64 - b64).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// Compares params and AdamW state of two optimizers over two parameter
// copies; returns the largest relative difference seen.
double CompareStates(const torch::optim::Optimizer& a, const std::vector<torch::Tensor>& pa,
                     const torch::optim::Optimizer& b, const std::vector<torch::Tensor>& pb) {
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, MaxRelativeDiff(pa[i], pb[i]));
    const AdamWParamState* sa = FindAdamWState(a, pa[i]);
    const AdamWParamState* sb = FindAdamWState(b, pb[i]);
    EXPECT_NE(sa, nullptr) << i;
    EXPECT_NE(sb, nullptr) << i;
    if (sa == nullptr || sb == nullptr) continue;
    EXPECT_EQ(sa->step(), sb->step()) << i;
    worst = std::max(worst, MaxRelativeDiff(sa->exp_avg(), sb->exp_avg()));
    worst = std::max(worst, MaxRelativeDiff(sa->exp_avg_sq(), sb->exp_avg_sq()));
  }
  return worst;
}

TEST(FusedAdamWTorchTest, MatchesTorchAdamWWithDecayGroupsAndClipping) {
  const std::vector<torch::Tensor> torch_params = MakeParams(1);
  const std::vector<torch::Tensor> fused_params = CloneParams(torch_params);
  torch::optim::AdamW reference(Groups(torch_params, Options()), Options());
  std::unique_ptr<FusedAdamW> fused = MakeFused(fused_params);

  const double max_norm = 1.0;
  for (int step = 0; step < 6; ++step) {
    const double lr = 1e-2 * (1.0 - 0.1 * step);  // a changing schedule
    SetLr(reference, lr);
    SetLr(*fused, lr);
    // Steps 0-3 have a norm of ~40 (clipped), 4-5 of ~0.4 (not clipped).
    const double grad_scale = step < 4 ? 1.0 : 0.01;
    SetGrads(torch_params, step, grad_scale);
    SetGrads(fused_params, step, grad_scale);

    ClipGrads(torch_params, max_norm);
    reference.step();
    AdamWStepOptions options;
    options.max_grad_norm = max_norm;
    absl::StatusOr<AdamWStepResult> result = fused->Step(options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(result->applied);
    EXPECT_EQ(result->clip_coef < 1.0, step < 4) << step;

    const double worst = CompareStates(*fused, fused_params, reference, torch_params);
    EXPECT_LT(worst, 1e-6) << "step " << step;
  }
  // The parameters really moved (two optimizers that did nothing would agree).
  EXPECT_GT(MaxRelativeDiff(fused_params[0], MakeParams(1)[0]), 1e-3);
}

TEST(FusedAdamWTorchTest, StateRoundTripsThroughSerialize) {
  const std::vector<torch::Tensor> params = MakeParams(2);
  std::unique_ptr<FusedAdamW> fused = MakeFused(params);
  for (int step = 0; step < 3; ++step) {
    SetGrads(params, step);
    ASSERT_TRUE(fused->Step().ok());
  }
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive archive;
    fused->save(archive);
    archive.save_to(buffer);
  }

  // A restored copy (parameters restored separately, as a checkpoint does).
  const std::vector<torch::Tensor> restored_params = CloneParams(params);
  std::unique_ptr<FusedAdamW> restored = MakeFused(restored_params);
  {
    torch::serialize::InputArchive archive;
    archive.load_from(buffer);
    restored->load(archive);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const AdamWParamState* original = FindAdamWState(*fused, params[i]);
    const AdamWParamState* loaded = FindAdamWState(*restored, restored_params[i]);
    ASSERT_NE(loaded, nullptr) << i;
    EXPECT_EQ(loaded->step(), 3);
    EXPECT_TRUE(torch::equal(loaded->exp_avg(), original->exp_avg())) << i;
    EXPECT_TRUE(torch::equal(loaded->exp_avg_sq(), original->exp_avg_sq())) << i;
  }
  // Both continue identically.
  for (int step = 3; step < 5; ++step) {
    SetGrads(params, step);
    SetGrads(restored_params, step);
    ASSERT_TRUE(fused->Step().ok());
    ASSERT_TRUE(restored->Step().ok());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], restored_params[i])) << i;
    EXPECT_EQ(FindAdamWState(*restored, restored_params[i])->step(), 5);
  }
}

TEST(FusedAdamWTorchTest, CheckpointsAreInterchangeableWithTorchAdamW) {
  // torch::optim::AdamW -> archive -> FusedAdamW, then both take 2 steps.
  const std::vector<torch::Tensor> torch_params = MakeParams(3);
  torch::optim::AdamW reference(Groups(torch_params, Options()), Options());
  for (int step = 0; step < 3; ++step) {
    SetGrads(torch_params, step);
    reference.step();
  }
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive archive;
    reference.save(archive);
    archive.save_to(buffer);
  }
  const std::vector<torch::Tensor> fused_params = CloneParams(torch_params);
  std::unique_ptr<FusedAdamW> fused = MakeFused(fused_params);
  {
    torch::serialize::InputArchive archive;
    archive.load_from(buffer);
    fused->load(archive);
  }
  for (int step = 3; step < 5; ++step) {
    SetGrads(torch_params, step);
    SetGrads(fused_params, step);
    reference.step();
    ASSERT_TRUE(fused->Step().ok());
  }
  EXPECT_LT(CompareStates(*fused, fused_params, reference, torch_params), 1e-6);

  // And back: FusedAdamW -> archive -> torch::optim::AdamW.
  std::stringstream back;
  {
    torch::serialize::OutputArchive archive;
    fused->save(archive);
    archive.save_to(back);
  }
  const std::vector<torch::Tensor> back_params = CloneParams(fused_params);
  torch::optim::AdamW back_reference(Groups(back_params, Options()), Options());
  {
    torch::serialize::InputArchive archive;
    archive.load_from(back);
    back_reference.load(archive);
  }
  for (size_t i = 0; i < back_params.size(); ++i) {
    EXPECT_EQ(FindAdamWState(back_reference, back_params[i])->step(), 5) << i;
  }
}

TEST(FusedAdamWTorchTest, NonFiniteGradientSkipsTheStepAndChangesNothing) {
  const std::vector<torch::Tensor> params = MakeParams(4);
  std::unique_ptr<FusedAdamW> fused = MakeFused(params);

  // On the very first step: no state may be created.
  SetGrads(params, 0);
  params[5].mutable_grad().view(-1)[7] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<torch::Tensor> before = CloneParams(params);
  absl::StatusOr<AdamWStepResult> result = fused->Step();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->applied);
  EXPECT_TRUE(std::isnan(result->grad_norm));
  EXPECT_FALSE(fused->last_result().applied);
  EXPECT_TRUE(fused->state().empty());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[i])) << i;

  // After some good steps: params, moments and step counts all unchanged.
  for (int step = 1; step < 3; ++step) {
    SetGrads(params, step);
    ASSERT_TRUE(fused->Step().ok());
  }
  std::vector<torch::Tensor> params_before = CloneParams(params), m_before, v_before;
  for (const torch::Tensor& p : params) {
    m_before.push_back(FindAdamWState(*fused, p)->exp_avg().clone());
    v_before.push_back(FindAdamWState(*fused, p)->exp_avg_sq().clone());
  }
  SetGrads(params, 3);
  params.back().mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
  fused->step();  // the torch interface reports through last_result()
  EXPECT_FALSE(fused->last_result().applied);
  for (size_t i = 0; i < params.size(); ++i) {
    const AdamWParamState* state = FindAdamWState(*fused, params[i]);
    EXPECT_EQ(state->step(), 2) << i;
    EXPECT_TRUE(torch::equal(params[i], params_before[i])) << i;
    EXPECT_TRUE(torch::equal(state->exp_avg(), m_before[i])) << i;
    EXPECT_TRUE(torch::equal(state->exp_avg_sq(), v_before[i])) << i;
  }
}

TEST(FusedAdamWTorchTest, ParametersWithoutGradientKeepTheirState) {
  const std::vector<torch::Tensor> params = MakeParams(5);
  std::unique_ptr<FusedAdamW> fused = MakeFused(params);
  SetGrads(params, 0);
  params[1].mutable_grad() = torch::Tensor();
  const torch::Tensor untouched = params[1].detach().clone();
  ASSERT_TRUE(fused->Step().ok());
  EXPECT_EQ(FindAdamWState(*fused, params[1]), nullptr);
  EXPECT_TRUE(torch::equal(params[1], untouched));
  EXPECT_EQ(FindAdamWState(*fused, params[0])->step(), 1);
}

TEST(FusedAdamWTorchTest, UnscaleMatchesUnscaledGradients) {
  const std::vector<torch::Tensor> a = MakeParams(6);
  const std::vector<torch::Tensor> b = CloneParams(a);
  std::unique_ptr<FusedAdamW> fa = MakeFused(a), fb = MakeFused(b);
  SetGrads(a, 0);
  SetGrads(b, 0, /*scale=*/65536.0);  // a loss scale of 2^16
  AdamWStepOptions options;
  options.max_grad_norm = 1.0;
  absl::StatusOr<AdamWStepResult> ra = fa->Step(options);
  options.inv_scale = 1.0 / 65536;
  absl::StatusOr<AdamWStepResult> rb = fb->Step(options);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_NEAR(rb->grad_norm, ra->grad_norm, 1e-6 * ra->grad_norm);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(MaxRelativeDiff(b[i], a[i]), 1e-6) << i;
}

TEST(FusedAdamWTorchTest, RejectsWhatTheKernelCannotRun) {
  std::vector<torch::Tensor> doubles = {torch::zeros({4}, torch::kDouble).requires_grad_(true)};
  absl::StatusOr<std::unique_ptr<FusedAdamW>> made =
      FusedAdamW::Create({OptimizerParamGroup(doubles)}, Options());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(made.status().message()),
              testing::HasSubstr("param_groups[0].params[0]"));

  std::vector<torch::Tensor> floats = {torch::zeros({4}).requires_grad_(true)};
  made = FusedAdamW::Create({OptimizerParamGroup(floats)}, AdamWOptions(1e-3).amsgrad(true));
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);

  made = FusedAdamW::Create({OptimizerParamGroup(floats)}, Options());
  ASSERT_TRUE(made.ok());
  floats[0].mutable_grad() = torch::zeros({4}, torch::kDouble);
  absl::StatusOr<AdamWStepResult> result = (*made)->Step();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              testing::HasSubstr("param_groups[0].params[0].grad"));
  EXPECT_THROW((*made)->step(), c10::Error);
}

// The LibTorch-operations path (what CUDA parameters take in a build without
// the CUDA kernel), run on CPU tensors: the same steps as torch::optim::AdamW
// and as the CPU kernel, with clipping, a changing learning rate and decay
// groups.
TEST(FusedAdamWTorchOpsTest, MatchesTorchAdamWAndTheCpuKernel) {
  const std::vector<torch::Tensor> torch_params = MakeParams(11);
  const std::vector<torch::Tensor> kernel_params = CloneParams(torch_params);
  const std::vector<torch::Tensor> ops_params = CloneParams(torch_params);
  torch::optim::AdamW reference(Groups(torch_params, Options()), Options());
  std::unique_ptr<FusedAdamW> kernel = MakeFused(kernel_params);
  std::unique_ptr<FusedAdamW> ops = MakeFused(ops_params);
  ops->set_path(FusedAdamWPath::kTorchOps);
  EXPECT_STREQ(kernel->ImplementationFor(torch::kCPU), "cpu-kernel");
  EXPECT_STREQ(ops->ImplementationFor(torch::kCPU), "torch-ops");

  const double max_norm = 1.0;
  for (int step = 0; step < 6; ++step) {
    const double lr = 1e-2 * (1.0 - 0.1 * step);
    SetLr(reference, lr);
    SetLr(*kernel, lr);
    SetLr(*ops, lr);
    const double grad_scale = step < 4 ? 1.0 : 0.01;  // clipped, then not
    SetGrads(torch_params, step, grad_scale);
    SetGrads(kernel_params, step, grad_scale);
    SetGrads(ops_params, step, grad_scale);
    ClipGrads(torch_params, max_norm);
    reference.step();
    AdamWStepOptions options;
    options.max_grad_norm = max_norm;
    absl::StatusOr<AdamWStepResult> by_kernel = kernel->Step(options);
    absl::StatusOr<AdamWStepResult> by_ops = ops->Step(options);
    ASSERT_TRUE(by_kernel.ok() && by_ops.ok()) << by_ops.status();
    EXPECT_TRUE(by_ops->applied);
    EXPECT_NEAR(by_ops->grad_norm, by_kernel->grad_norm, 1e-9 * by_kernel->grad_norm) << step;
    EXPECT_EQ(by_ops->clip_coef < 1.0, step < 4) << step;
    EXPECT_LT(CompareStates(*ops, ops_params, reference, torch_params), 1e-6) << "step " << step;
    EXPECT_LT(CompareStates(*ops, ops_params, *kernel, kernel_params), 1e-6) << "step " << step;
  }
  EXPECT_GT(MaxRelativeDiff(ops_params[0], MakeParams(11)[0]), 1e-3);
}

// The flat-buffer update the sharded optimizer runs on CUDA: the torch-ops
// path of AdamWUpdateOn, run here on the CPU, against the CPU kernel.
TEST(FusedAdamWTorchOpsTest, AdamWUpdateOnAsTorchOpsMatchesTheCpuKernel) {
  torch::manual_seed(7);
  const int64_t n = 1000;
  auto arrays = [&]() {
    std::vector<torch::Tensor> a = {torch::randn({n}), torch::randn({n}), torch::randn({n}) * 0.1,
                                    torch::rand({n}) * 0.01};
    return a;
  };
  const std::vector<torch::Tensor> kernel = arrays();
  std::vector<torch::Tensor> ops;
  for (const torch::Tensor& t : kernel) ops.push_back(t.clone());
  auto group_over = [n](const std::vector<torch::Tensor>& a, int64_t step) {
    AdamWGroup group;
    group.hyperparams.lr = 3e-3;
    group.hyperparams.beta1 = 0.9;
    group.hyperparams.beta2 = 0.95;
    group.hyperparams.eps = 1e-8;
    for (int half = 0; half < 2; ++half) {  // two tensors: with and without decay
      AdamWTensor t;
      t.param = a[0].data_ptr<float>() + half * n / 2;
      t.grad = a[1].data_ptr<float>() + half * n / 2;
      t.exp_avg = a[2].data_ptr<float>() + half * n / 2;
      t.exp_avg_sq = a[3].data_ptr<float>() + half * n / 2;
      t.size = n / 2;
      t.weight_decay = half == 0 ? 0.1 : 0.0;
      t.step = step;
      group.tensors.push_back(t);
    }
    return group;
  };
  for (int64_t step = 1; step <= 3; ++step) {
    const AdamWGroup by_kernel = group_over(kernel, step), by_ops = group_over(ops, step);
    AdamWUpdateOn(torch::kCPU, absl::MakeConstSpan(&by_kernel, 1), 0.7);
    AdamWUpdateOn(torch::kCPU, absl::MakeConstSpan(&by_ops, 1), 0.7, FusedAdamWPath::kTorchOps);
    for (int i : {0, 2, 3}) {
      EXPECT_LT(MaxRelativeDiff(ops[i], kernel[i]), 1e-6) << "array " << i << " step " << step;
    }
  }
  EXPECT_EQ(torch::equal(ops[1], kernel[1]), true);  // gradients are only read
}

TEST(FusedAdamWTorchOpsTest, NonFiniteGradientSkipsTheStepAndChangesNothing) {
  const std::vector<torch::Tensor> params = MakeParams(12);
  std::unique_ptr<FusedAdamW> fused = MakeFused(params);
  fused->set_path(FusedAdamWPath::kTorchOps);
  SetGrads(params, 0);
  params[3].mutable_grad().view(-1)[2] = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<AdamWStepResult> result = fused->Step();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->applied);
  EXPECT_TRUE(std::isnan(result->grad_norm));
  EXPECT_TRUE(fused->state().empty());

  for (int step = 1; step < 3; ++step) {
    SetGrads(params, step);
    ASSERT_TRUE(fused->Step().ok());
  }
  const std::vector<torch::Tensor> params_before = CloneParams(params);
  std::vector<torch::Tensor> m_before;
  for (const torch::Tensor& p : params) m_before.push_back(FindAdamWState(*fused, p)->exp_avg().clone());
  SetGrads(params, 3);
  params[0].mutable_grad().view(-1)[0] = -std::numeric_limits<float>::infinity();
  result = fused->Step();
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->applied);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(FindAdamWState(*fused, params[i])->step(), 2) << i;
    EXPECT_TRUE(torch::equal(params[i], params_before[i])) << i;
    EXPECT_TRUE(torch::equal(FindAdamWState(*fused, params[i])->exp_avg(), m_before[i])) << i;
  }
}

TEST(FusedAdamWTorchOpsTest, UnscaleMatchesUnscaledGradients) {
  const std::vector<torch::Tensor> a = MakeParams(13);
  const std::vector<torch::Tensor> b = CloneParams(a);
  std::unique_ptr<FusedAdamW> fa = MakeFused(a), fb = MakeFused(b);
  fb->set_path(FusedAdamWPath::kTorchOps);
  SetGrads(a, 0);
  SetGrads(b, 0, /*scale=*/1024.0);
  AdamWStepOptions options;
  options.max_grad_norm = 1.0;
  absl::StatusOr<AdamWStepResult> ra = fa->Step(options);
  options.inv_scale = 1.0 / 1024;
  absl::StatusOr<AdamWStepResult> rb = fb->Step(options);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_NEAR(rb->grad_norm, ra->grad_norm, 1e-6 * ra->grad_norm);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(MaxRelativeDiff(b[i], a[i]), 1e-6) << i;
}

TEST(FusedAdamWDeviceTest, ChoosesTheImplementationByDevice) {
  std::vector<torch::Tensor> floats = {torch::zeros({4}).requires_grad_(true)};
  absl::StatusOr<std::unique_ptr<FusedAdamW>> made =
      FusedAdamW::Create({OptimizerParamGroup(floats)}, Options());
  ASSERT_TRUE(made.ok());
  const torch::Device cuda(torch::kCUDA, 0);
  EXPECT_STREQ((*made)->ImplementationFor(cuda),
               FusedAdamW::HasCudaKernel() ? "cuda-kernel" : "torch-ops");
  (*made)->set_path(FusedAdamWPath::kTorchOps);
  EXPECT_STREQ((*made)->ImplementationFor(cuda), "torch-ops");
  EXPECT_STREQ((*made)->ImplementationFor(torch::kCPU), "torch-ops");
}

TEST(FusedAdamWDeviceTest, RejectsOtherDevicesAndMixedDevices) {
  std::vector<torch::Tensor> meta = {
      torch::zeros({4}, torch::TensorOptions().device(torch::kMeta)).requires_grad_(true)};
  absl::StatusOr<std::unique_ptr<FusedAdamW>> made =
      FusedAdamW::Create({OptimizerParamGroup(meta)}, Options());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(made.status().message()), testing::HasSubstr("CPU or CUDA, not meta"));

  std::vector<torch::Tensor> mixed = {
      torch::zeros({4}).requires_grad_(true),
      torch::zeros({4}, torch::TensorOptions().device(torch::kMeta)).requires_grad_(true)};
  made = FusedAdamW::Create({OptimizerParamGroup(mixed)}, Options());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(made.status().message()),
              testing::HasSubstr("param_groups[0].params[1]: FusedAdamW needs a contiguous dense "
                                 "fp32 tensor on cpu"));
}

TEST(FusedAdamWTorchTest, MakeFusedAdamWGroupsLikeMakeAdamW) {
  torch::nn::Linear linear(8, 4);
  absl::StatusOr<std::unique_ptr<FusedAdamW>> made = MakeFusedAdamW(*linear, Options());
  ASSERT_TRUE(made.ok()) << made.status();
  const auto& groups = (*made)->param_groups();
  ASSERT_EQ(groups.size(), 2u);
  ASSERT_EQ(groups[0].params().size(), 1u);  // weight
  ASSERT_EQ(groups[1].params().size(), 1u);  // bias
  EXPECT_EQ(groups[0].params()[0].dim(), 2);
  EXPECT_EQ(static_cast<const AdamWOptions&>(groups[0].options()).weight_decay(), 0.1);
  EXPECT_EQ(static_cast<const AdamWOptions&>(groups[1].options()).weight_decay(), 0.0);
}

}  // namespace
}  // namespace loom::engine
