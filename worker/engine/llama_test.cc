// The Llama-family knobs of Gpt (gpt.h: RMSNorm, SwiGLU, rotary positions,
// grouped-query attention, no biases, untied embeddings) against a plain
// reference written here from the papers with LibTorch operators: logits,
// loss and every parameter's gradient agree within 1e-5.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "worker/engine/gpt.h"
#include "worker/engine/sampler.h"

namespace loom::engine {
namespace {

GptConfig LlamaConfig() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.ffn_hidden = 48;
  c.seq_len = 16;
  c.vocab_size = 64;
  c.gated_mlp = true;
  c.bias = false;
  c.rms_norm = true;
  c.rotary = true;
  c.tied_embeddings = false;
  c.rope_theta = 10000;
  c.norm_eps = 1e-5;
  return c;
}

class LlamaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    torch::manual_seed(11);
  }
};

using Params = std::map<std::string, torch::Tensor>;

Params ParamsOf(torch::nn::Module& module) {
  Params p;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) p[item.key()] = item.value();
  return p;
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x / torch::sqrt((x * x).mean(-1, true) + eps) * w;
}

// Rotary embedding of x [B, T, H, hd] written pair by pair: dimension i and
// i + hd/2 rotate together by angle t * theta^(-2i/hd).
torch::Tensor Rotate(const torch::Tensor& x, double theta) {
  const int64_t time = x.size(1), hd = x.size(3), half = hd / 2;
  torch::Tensor out = torch::empty_like(x);
  for (int64_t i = 0; i < half; ++i) {
    const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    torch::Tensor angle = torch::arange(time, torch::kDouble).mul(freq).to(torch::kFloat);
    torch::Tensor c = angle.cos().view({1, time, 1}), s = angle.sin().view({1, time, 1});
    torch::Tensor a = x.select(3, i), b = x.select(3, i + half);
    out.select(3, i).copy_(a * c - b * s);
    out.select(3, i + half).copy_(b * c + a * s);
  }
  return out;
}

// Causal attention of head-major q, k, v [B, H, T, hd] with an explicit
// mask and softmax.
torch::Tensor Attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t time = q.size(2);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(3)));
  torch::Tensor mask = torch::ones({time, time}, torch::kBool).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
}

torch::Tensor ReferenceLogits(const GptConfig& c, Params& p, const torch::Tensor& idx) {
  const int64_t batch = idx.size(0), time = idx.size(1);
  const int64_t hd = c.d_model / c.n_head, kv = c.n_kv_head, group = c.n_head / kv;
  torch::Tensor x = p["wte.weight"].index_select(0, idx.reshape({-1})).view({batch, time, -1});
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    torch::Tensor a = RmsNorm(x, p[h + "ln_1.weight"], c.norm_eps);
    torch::Tensor qkv = torch::matmul(a, p[h + "attn.c_attn.weight"].t());
    torch::Tensor q = qkv.narrow(-1, 0, c.n_head * hd).view({batch, time, c.n_head, hd});
    torch::Tensor k = qkv.narrow(-1, c.n_head * hd, kv * hd).view({batch, time, kv, hd});
    torch::Tensor v = qkv.narrow(-1, (c.n_head + kv) * hd, kv * hd).view({batch, time, kv, hd});
    q = Rotate(q, c.rope_theta);
    k = Rotate(k, c.rope_theta);
    // Query head j reads key/value head j / group.
    std::vector<int64_t> of_head;
    for (int64_t j = 0; j < c.n_head; ++j) of_head.push_back(j / group);
    torch::Tensor heads = torch::tensor(of_head, torch::kLong);
    k = k.index_select(2, heads);
    v = v.index_select(2, heads);
    torch::Tensor y = Attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
    y = y.transpose(1, 2).reshape({batch, time, c.d_model});
    x = x + torch::matmul(y, p[h + "attn.c_proj.weight"].t());
    torch::Tensor m = RmsNorm(x, p[h + "ln_2.weight"], c.norm_eps);
    torch::Tensor gate = torch::matmul(m, p[h + "mlp.c_fc.weight"].t());
    torch::Tensor up = torch::matmul(m, p[h + "mlp.c_up.weight"].t());
    torch::Tensor silu = gate * torch::sigmoid(gate);
    x = x + torch::matmul(silu * up, p[h + "mlp.c_proj.weight"].t());
  }
  x = RmsNorm(x, p["ln_f.weight"], c.norm_eps);
  return torch::matmul(x, p["lm_head.weight"].t());
}

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-12);
  return (a - b).abs().max().item<double>() / scale;
}

TEST_F(LlamaTest, ParametersAreTheLlamaLayoutAndMatchTheClosedForm) {
  const GptConfig c = LlamaConfig();
  Gpt model(c);
  Params p = ParamsOf(*model);
  EXPECT_EQ(p.count("wpe.weight"), 0u);  // rotary: no position table
  EXPECT_EQ(p.count("lm_head.weight"), 1u);
  EXPECT_EQ(p.count("h.0.ln_1.bias"), 0u);
  EXPECT_EQ(p.count("h.0.attn.c_attn.bias"), 0u);
  EXPECT_EQ(p["h.0.attn.c_attn.weight"].sizes(), (std::vector<int64_t>{(4 + 2 * 2) * 8, 32}));
  EXPECT_EQ(p["h.0.mlp.c_up.weight"].sizes(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(p["h.0.mlp.c_proj.weight"].sizes(), (std::vector<int64_t>{32, 48}));
  int64_t n = 0;
  for (const auto& [name, t] : p) n += t.numel();
  EXPECT_EQ(n, GptParameterCount(c));
  // V d (wte) + V d (head) + d (ln_f) + per layer 2d (norms) + d (q) +
  // 2 (d/2) d (k, v) + d d (o) + 3 d f (MLP).
  EXPECT_EQ(n, 64 * 32 * 2 + 32 + 2 * (2 * 32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 32 * 48));
  // The untied head is a separate tensor, not wte.
  EXPECT_FALSE(model->HeadWeight().is_same(p["wte.weight"]));
}

TEST_F(LlamaTest, ForwardAndBackwardMatchAPlainReference) {
  for (int kv : {4, 2, 1}) {  // multi-head, grouped, multi-query
    GptConfig c = LlamaConfig();
    c.n_kv_head = kv;
    Gpt model(c);
    Params p = ParamsOf(*model);
    torch::Tensor idx = torch::randint(0, c.vocab_size, {3, c.seq_len}, torch::kLong);
    torch::Tensor targets = torch::randint(0, c.vocab_size, {3, c.seq_len}, torch::kLong);

    torch::Tensor logits = model->forward(idx);
    torch::Tensor expected = ReferenceLogits(c, p, idx);
    const double logit_diff = MaxRelative(logits, expected);
    EXPECT_LT(logit_diff, 1e-5) << "n_kv_head " << kv;

    // Gradients: the fused loss path against the reference's cross entropy.
    model->zero_grad();
    model->Loss(idx, targets).backward();
    Params grads;
    for (const auto& [name, t] : p) grads[name] = t.grad().clone();
    for (auto& [name, t] : p) t.mutable_grad() = torch::Tensor();
    torch::Tensor ref_loss = LanguageModelLoss(ReferenceLogits(c, p, idx), targets);
    ref_loss.backward();
    EXPECT_NEAR(model->Loss(idx, targets).item<double>(), ref_loss.item<double>(), 1e-5);
    double worst_grad = 0;
    for (const auto& [name, t] : p) {
      ASSERT_TRUE(grads[name].defined()) << name;
      const double diff = MaxRelative(grads[name], t.grad());
      worst_grad = std::max(worst_grad, diff);
      EXPECT_LT(diff, 1e-5) << name << ", n_kv_head " << kv;
    }
    std::printf("n_kv_head %d: logits max relative difference %.2e, gradients %.2e\n", kv,
                logit_diff, worst_grad);
  }
}

TEST_F(LlamaTest, IsCausalAndPositionAware) {
  const GptConfig c = LlamaConfig();
  Gpt model(c);
  model->eval();
  torch::Tensor idx = torch::randint(0, c.vocab_size, {1, 8}, torch::kLong);
  torch::Tensor changed = idx.clone();
  changed[0][5] = (changed[0][5].item<int64_t>() + 1) % c.vocab_size;
  torch::Tensor a = model->forward(idx), b = model->forward(changed);
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 5), b.narrow(1, 0, 5)));  // the past is unchanged
  EXPECT_FALSE(torch::allclose(a.narrow(1, 5, 3), b.narrow(1, 5, 3)));
  // Rotary positions: the same two tokens in swapped order give different
  // last-position logits (attention alone would be order-blind).
  torch::Tensor ab = torch::tensor({{3, 9}}, torch::kLong), ba = torch::tensor({{9, 3}}, torch::kLong);
  torch::Tensor after_ab = model->forward(torch::cat({ab, torch::tensor({{5}}, torch::kLong)}, 1));
  torch::Tensor after_ba = model->forward(torch::cat({ba, torch::tensor({{5}}, torch::kLong)}, 1));
  EXPECT_FALSE(torch::allclose(after_ab.select(1, 2), after_ba.select(1, 2)));
}

TEST_F(LlamaTest, RotaryTablesRotatePairsByPositionTimesFrequency) {
  torch::Tensor x = torch::randn({1, 5, 1, 8});
  const RotaryTables tables = MakeRotaryTables(5, 8, 10000, x);
  torch::Tensor y = ApplyRotary(x, tables);
  // A rotation keeps each pair's length, and position 0 is not rotated.
  torch::Tensor pair_norm_x = x.narrow(3, 0, 4).pow(2) + x.narrow(3, 4, 4).pow(2);
  torch::Tensor pair_norm_y = y.narrow(3, 0, 4).pow(2) + y.narrow(3, 4, 4).pow(2);
  EXPECT_TRUE(torch::allclose(pair_norm_x, pair_norm_y, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(x.select(1, 0), y.select(1, 0)));
  EXPECT_LT(MaxRelative(y, Rotate(x, 10000)), 1e-6);
}

TEST_F(LlamaTest, TrainsAndBf16StaysClose) {
  GptConfig c = LlamaConfig();
  Gpt model(c);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  // One fixed batch: the loss must fall well below log(V) = 4.16.
  torch::Tensor idx = torch::randint(0, c.vocab_size, {4, c.seq_len}, torch::kLong);
  torch::Tensor targets = torch::roll(idx, -1, 1);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    torch::Tensor loss = model->Loss(idx, targets);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(64.0), 0.3);
  EXPECT_LT(last, 0.5 * first);
  GptConfig bf16 = c;
  bf16.precision = Precision::kBf16;
  Gpt low(bf16);
  torch::NoGradGuard no_grad;
  const auto trained = model->named_parameters();  // held: find() points into it
  for (auto& item : low->named_parameters()) item.value().copy_(*trained.find(item.key()));
  const double fp32_loss = model->Loss(idx, targets).item<double>();
  const double bf16_loss = low->Loss(idx, targets).item<double>();
  EXPECT_NEAR(bf16_loss, fp32_loss, 0.05 * fp32_loss + 0.02);
}

TEST_F(LlamaTest, ValidatesTheFamilyKnobs) {
  GptConfig c = LlamaConfig();
  c.n_kv_head = 3;  // does not divide 4
  EXPECT_FALSE(ValidateGptConfig(c).ok());
  c = LlamaConfig();
  c.n_head = 8;
  c.n_kv_head = 8;
  c.d_model = 24;  // head dim 3: rotary needs it even
  EXPECT_FALSE(ValidateGptConfig(c).ok());
  c = LlamaConfig();
  c.rope_theta = 0;
  EXPECT_FALSE(ValidateGptConfig(c).ok());
  EXPECT_TRUE(ValidateGptConfig(LlamaConfig()).ok());
  EXPECT_FALSE(IsGpt2Shape(LlamaConfig()));
  EXPECT_TRUE(IsGpt2Shape(GptConfig{}));
}

// Incremental decoding with the key/value cache gives the logits of the
// full forward at every position, for GPT-2 and for the Llama family.
TEST_F(LlamaTest, CachedDecodingMatchesTheFullForward) {
  GptConfig gpt2;
  gpt2.n_layer = 2;
  gpt2.n_head = 2;
  gpt2.d_model = 32;
  gpt2.seq_len = 16;
  gpt2.vocab_size = 64;
  for (const GptConfig& c : {gpt2, LlamaConfig()}) {
    Gpt model(c);
    model->eval();
    torch::Tensor idx = torch::randint(0, c.vocab_size, {2, 12}, torch::kLong);
    torch::Tensor full = model->forward(idx);
    KvCache cache;
    // A prefill of 5, then one token at a time.
    torch::Tensor got = model->ForwardCached(idx.narrow(1, 0, 5), &cache);
    EXPECT_LT(MaxRelative(got, full.narrow(1, 0, 5)), 1e-5);
    for (int64_t t = 5; t < 12; ++t) {
      got = model->ForwardCached(idx.narrow(1, t, 1), &cache);
      EXPECT_LT(MaxRelative(got.select(1, 0), full.select(1, t)), 1e-5)
          << (c.rotary ? "llama" : "gpt2") << " position " << t;
    }
    EXPECT_EQ(cache.length, 12);
    EXPECT_THROW(model->ForwardCached(idx.narrow(1, 0, 5), &cache), c10::Error);  // past seq_len
  }
}

TEST_F(LlamaTest, GenerationIsSeededGreedyFollowsArgmaxAndSlidesPastTheWindow) {
  const GptConfig c = LlamaConfig();
  Gpt model(c);
  SampleOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 3;
  const std::vector<int> prompt = {1, 2, 3, 4};
  auto out = Generate(model, prompt, greedy);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  // Greedy: each token is the argmax of the full forward over what came before.
  std::vector<int64_t> context(prompt.begin(), prompt.end());
  for (int token : *out) {
    torch::Tensor logits = model->forward(
        torch::tensor(context, torch::kLong).view({1, static_cast<int64_t>(context.size())}));
    EXPECT_EQ(token, logits.select(1, logits.size(1) - 1).argmax().item<int64_t>());
    context.push_back(token);
  }
  SampleOptions sampled;
  sampled.max_new_tokens = 40;  // 4 + 40 > seq_len 16: the window slides
  sampled.seed = 3;
  auto a = Generate(model, prompt, sampled), b = Generate(model, prompt, sampled);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b) << "same seed, same tokens";
  EXPECT_EQ(a->size(), 40u);
  sampled.seed = 4;
  EXPECT_NE(*Generate(model, prompt, sampled), *a);
  for (int id : *a) EXPECT_TRUE(id >= 0 && id < c.vocab_size);
  EXPECT_FALSE(Generate(model, {}, sampled).ok());
  EXPECT_FALSE(Generate(model, {64}, sampled).ok());
}

}  // namespace
}  // namespace loom::engine
