// llama: where a Llama-family step spends its time on the CPU, against a
// GPT-2 of the same width and depth (the profile that says what to make
// fast). Both train forward + backward on the same batch, alternating rounds
// so that the machine's drift hits both; the figure is the Llama model's
// time per model FLOP (common/model_shape.h) relative to GPT-2's (1.0 =
// equally efficient). Also timed alone, on the Llama step's own tensor
// sizes, forward + backward: the attention of the fused projection with
// rotary positions and 4 key/value heads of 8, both inside the kernel (what
// the model runs) and as LibTorch ops before it (rotate, expand the K/V
// heads, re-pack: what it ran before), and RMSNorm and the SwiGLU product,
// as shares of the step.
//   loom_llama_bench [ROUNDS] [THREADS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <torch/torch.h>

#include "common/model_shape.h"
#include "worker/engine/ops/causal_attention.h"
#include "worker/engine/gpt.h"

namespace {

using loom::engine::Gpt;
using loom::engine::GptConfig;

double Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

GptConfig Base() {
  GptConfig c;
  c.n_layer = 4;
  c.n_head = 8;
  c.d_model = 256;
  c.seq_len = 256;
  c.vocab_size = 4096;
  return c;
}

GptConfig Llama() {
  GptConfig c = Base();
  c.n_kv_head = 4;
  c.ffn_hidden = 704;  // 8/3 x 256 rounded up to 64
  c.gated_mlp = true;
  c.bias = false;
  c.rms_norm = true;
  c.rotary = true;
  c.tied_embeddings = false;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  constexpr int kBatch = 8;
  const GptConfig gpt_config = Base(), llama_config = Llama();
  Gpt gpt(gpt_config), llama(llama_config);
  const torch::Tensor idx = torch::randint(0, 4096, {kBatch, 256}, torch::kLong);
  const torch::Tensor targets = torch::randint(0, 4096, {kBatch, 256}, torch::kLong);
  auto step = [&](Gpt& m) {
    m->zero_grad();
    m->Loss(idx, targets).backward();
  };
  step(gpt);
  step(llama);  // warm-up
  std::vector<double> gpt_s, llama_s;
  for (int r = 0; r < rounds; ++r) {
    gpt_s.push_back(Seconds([&] { step(gpt); }));
    llama_s.push_back(Seconds([&] { step(llama); }));
  }
  const double g = Median(gpt_s), l = Median(llama_s);
  auto g_flops_of = [&](const GptConfig& c) {
    return loom::ModelFlopsPerStep(loom::engine::ShapeOf(c), kBatch);
  };
  const double g_flops = loom::ModelFlopsPerStep(loom::engine::ShapeOf(gpt_config), kBatch);
  const double l_flops = loom::ModelFlopsPerStep(loom::engine::ShapeOf(llama_config), kBatch);

  // Ablation: GPT-2 with one Llama knob at a time, so the slowdown has an
  // address.
  struct Knob {
    const char* name;
    std::function<void(GptConfig*)> set;
  };
  const std::vector<Knob> knobs = {
      {"rms_norm", [](GptConfig* c) { c->rms_norm = true; }},
      {"no bias", [](GptConfig* c) { c->bias = false; }},
      {"rotary", [](GptConfig* c) { c->rotary = true; }},
      {"4 KV heads", [](GptConfig* c) { c->n_kv_head = 4; }},
      {"SwiGLU 704", [](GptConfig* c) { c->gated_mlp = true; c->ffn_hidden = 704; }},
      {"untied head", [](GptConfig* c) { c->tied_embeddings = false; }},
  };
  std::vector<double> knob_ratio;
  for (const Knob& k : knobs) {
    GptConfig c = Base();
    k.set(&c);
    Gpt m(c);
    step(m);
    std::vector<double> a, b;
    for (int r = 0; r < std::max(3, rounds / 2); ++r) {
      a.push_back(Seconds([&] { step(gpt); }));
      b.push_back(Seconds([&] { step(m); }));
    }
    const double flops = loom::ModelFlopsPerStep(loom::engine::ShapeOf(c), kBatch);
    knob_ratio.push_back((Median(b) / flops) / (Median(a) / g_flops_of(gpt_config)));
  }

  // The Llama extras alone, forward + backward, per step (all layers).
  const int64_t hd = 32, heads = 8, kv = 4, t = 256, d = 256, f = 704;
  torch::Tensor qkv =
      torch::randn({kBatch, t, (heads + 2 * kv) * hd}, torch::requires_grad());
  // Attention of the projection, forward + backward, the two ways.
  auto in_kernel = [&] {
    loom::engine::AttendProjection(qkv, heads, kv, hd, /*rotary=*/true, 10000, 0.0)
        .sum()
        .backward();
  };
  auto expand_first = [&] {
    loom::engine::CausalAttention(
        loom::engine::ExpandQkv(qkv, heads, kv, hd, /*rotary=*/true, 10000), heads)
        .sum()
        .backward();
  };
  loom::engine::Norm norm(llama_config);
  torch::Tensor x = torch::randn({kBatch, t, d}, torch::requires_grad());
  auto rmsnorm = [&] { norm->forward(x).sum().backward(); };
  torch::Tensor gate = torch::randn({kBatch, t, f}, torch::requires_grad());
  torch::Tensor up = torch::randn({kBatch, t, f}, torch::requires_grad());
  auto swiglu = [&] { (torch::silu(gate) * up).sum().backward(); };
  std::vector<double> fused, expanded, rms, glu;
  for (int r = 0; r < rounds; ++r) {
    fused.push_back(Seconds(in_kernel));
    expanded.push_back(Seconds(expand_first));
    rms.push_back(Seconds(rmsnorm));
    glu.push_back(Seconds(swiglu));
  }
  // Per step: every layer has one attention, two RMSNorms and one SwiGLU;
  // the final norm adds one RMSNorm.
  const int layers = llama_config.n_layer;
  const double fused_s = layers * Median(fused), expanded_s = layers * Median(expanded),
               rms_s = (2 * layers + 1) * Median(rms), glu_s = layers * Median(glu);
  std::printf("batch %d x %lld tokens, d %lld, %d layers, %d thread(s), median of %d rounds\n",
              kBatch, static_cast<long long>(t), static_cast<long long>(d), layers, threads,
              rounds);
  std::printf("gpt2:  %.1f ms/step, %.2f GFLOP/s of model FLOPs\n", 1e3 * g, g_flops / g / 1e9);
  std::printf("llama: %.1f ms/step, %.2f GFLOP/s of model FLOPs (4 KV heads of 8, SwiGLU %lld, "
              "rotary, RMSNorm, untied)\n",
              1e3 * l, l_flops / l / 1e9, static_cast<long long>(f));
  std::printf("llama attention (rotary, 4 KV heads of 8), fwd+bwd per step: in the kernel "
              "%.1f ms, rotated and expanded before it %.1f ms (%.2fx)\n",
              1e3 * fused_s, 1e3 * expanded_s, expanded_s / fused_s);
  std::printf("llama step shares: attention %.1f%%, RMSNorm %.1f%%, SwiGLU product %.1f%%\n",
              100 * fused_s / l, 100 * rms_s / l, 100 * glu_s / l);
  std::printf("GPT-2 with one Llama knob, time per model FLOP relative to GPT-2:");
  for (size_t i = 0; i < knobs.size(); ++i) std::printf(" %s %.2f;", knobs[i].name, knob_ratio[i]);
  std::printf("\n");
  const double ratio = (l / l_flops) / (g / g_flops);
  std::printf("llama: %.1f ms/step vs gpt2 %.1f ms, time per model FLOP ratio=%.3f\n", 1e3 * l,
              1e3 * g, ratio);
  return 0;
}
