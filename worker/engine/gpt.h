// Decoder-only transformers as a LibTorch module: GPT-2 (Radford et al.
// 2019, "Language Models are Unsupervised Multitask Learners", section 2.3)
// and the Llama family (Touvron et al. 2023: RMSNorm, SwiGLU, rotary
// positions, grouped-query attention, no biases, untied embeddings), one
// module whose GptConfig knobs select the parts.
//
// Layout follows nanoGPT/llm.c so parameter names read the same:
//   wte [V,d], wpe [s,d] (learned positions only), h.<i>.{ln_1,
//   attn.c_attn [(n_head + 2 n_kv_head) hd, d], attn.c_proj, ln_2,
//   mlp.c_fc, mlp.c_up (gated only; c_fc is then the gate), mlp.c_proj},
//   ln_f; the LM head reuses wte.weight (tied) or is lm_head.weight [V, d].
// Norms are <name>.weight (and <name>.bias for LayerNorm with biases).
#ifndef LOOM_WORKER_ENGINE_GPT_H_
#define LOOM_WORKER_ENGINE_GPT_H_

#include <cstdint>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "common/model_shape.h"
#include "worker/engine/config.h"

namespace loom::engine {

// OK if `config` describes a buildable model; INVALID_ARGUMENT naming the
// offending field otherwise (non-positive sizes, d_model % n_head != 0,
// dropout outside [0, 1), activation_checkpointing below -1, and precision
// fp16 unless config.on_gpu: "precision: fp16 needs a GPU ...").
absl::Status ValidateGptConfig(const GptConfig& config);

// "fp32", "bf16" or "fp16" (the spelling of StepMetrics.precision).
const char* PrecisionName(Precision precision);

// The dtype of the LM head's matrix products for a model whose hidden states
// are on a CUDA device (on_cuda) or not: kFloat under fp32 precision or
// where config.head_precision keeps the head in fp32 (kFp32, or kAuto off
// the GPU); otherwise the blocks' dtype, kBFloat16 or kHalf.
c10::ScalarType HeadMatmulDtype(const GptConfig& config, bool on_cuda);

// The model's shape in the description the planner and the telemetry share
// (common/model_shape.h).
ModelShape ShapeOf(const GptConfig& config);

// Number of trainable parameters of Gpt(config), in closed form
// (CountParameters(ShapeOf(config)).total). For GPT-2:
//   V*d + s*d + L*(12*d^2 + 13*d) + 2*d
// with V = vocab_size, s = seq_len, d = d_model, L = n_layer. Per block:
// ln_1 and ln_2 (2d each), c_attn (3d^2 + 3d), attn.c_proj (d^2 + d), c_fc
// (4d^2 + 4d), mlp.c_proj (4d^2 + d); ln_f adds 2d; the tied LM head adds
// nothing. (Same count as nanoGPT's GPT.get_num_params with the position
// embedding included.)
int64_t GptParameterCount(const GptConfig& config);

// Rotary position embedding (Su et al. 2021) in the half-split form of
// Hugging Face's Llama: head dimension i < hd/2 pairs with i + hd/2, rotated
// by position t times theta^(-2i/hd). Tables for positions 0..time-1, shaped
// [time, 1, hd] to broadcast over [B, time, heads, hd], in `like`'s dtype
// and device.
struct RotaryTables {
  torch::Tensor cos, sin;
};
RotaryTables MakeRotaryTables(int64_t time, int64_t head_dim, double theta,
                              const torch::Tensor& like);
// x [B, T, heads, hd] rotated: x * cos + rotate_half(x) * sin.
// The fused attention projection [B, T, (n_head + 2 n_kv_head) head_dim]
// made ready for CausalAttention's [B, T, 3 n_head head_dim]: queries and
// keys rotated (rotary), each key/value head repeated for the n_head /
// n_kv_head query heads it serves (grouped-query attention). `qkv` itself
// when neither applies. Used by Gpt and by each tensor-parallel rank on its
// share of the heads.
torch::Tensor ExpandQkv(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                        int64_t head_dim, bool rotary, double rope_theta);
torch::Tensor ApplyRotary(const torch::Tensor& x, const RotaryTables& tables);

// Causal attention of the fused projection qkv [B, T, (n_head + 2 n_kv_head)
// head_dim] -> y [B, T, n_head head_dim], what Gpt and each tensor-parallel
// rank run: on LibTorch 1.13 with CPU fp32 and no dropout, Loom's kernel
// with the rotation and the shared key/value heads inside it
// (GroupedCausalSelfAttention, causal_attention.h); otherwise ExpandQkv,
// then CausalAttention (SDPA on LibTorch 2.x, on any device).
torch::Tensor AttendProjection(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                               int64_t head_dim, bool rotary, double rope_theta,
                               double dropout);

// The pre-sublayer norm of a block (and ln_f): LayerNorm (Ba et al. 2016;
// parameters weight and, with biases, bias: the numerics of
// torch::nn::LayerNorm to the bit) or RMSNorm (Zhang & Sennrich 2019:
// x / sqrt(mean(x^2) + eps) * weight, computed in fp32, returned in x's
// dtype).
class NormImpl : public torch::nn::Module {
 public:
  explicit NormImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t d_model_;
  bool rms_;
  double eps_;
  torch::Tensor weight_, bias_;
};
TORCH_MODULE(Norm);

// Keys and values of the positions decoded so far, per block, for
// incremental decoding (GptImpl::ForwardCached): [B, n_kv_head, length, hd]
// each, after rotary embedding, before grouped heads are expanded.
struct KvCache {
  std::vector<torch::Tensor> keys, values;  // one per block; empty before the first call
  int64_t length = 0;                       // positions held
};

// The model. Construct only from a config that ValidateGptConfig accepts
// (otherwise the constructor throws c10::Error). Initialisation (GPT-2,
// nanoGPT's _init_weights): every weight matrix and embedding ~ N(0, 0.02),
// the two residual output projections per block (attn.c_proj, mlp.c_proj)
// ~ N(0, 0.02 / sqrt(2 * n_layer)), biases 0, LayerNorm gains 1. Draws come
// from the global LibTorch generator, so seeding it first (torch::manual_seed)
// makes the weights reproducible.
//
// Execution (GptConfig::precision, ::activation_checkpointing): with bf16
// the blocks run under CPU autocast to bf16 (matrix products and attention in
// bf16; LayerNorm, softmax statistics and the residual stream in fp32, as
// autocast's op lists and type promotion give), while the embeddings, ln_f,
// the LM head and the loss stay fp32; parameters and their gradients are
// fp32 either way. With checkpointing, Hidden() under grad mode runs the
// blocks in checkpointed segments (activation_checkpoint.h): the values and
// gradients are those of the plain forward (the recompute replays dropout),
// for one extra forward of the blocks per step.
//
// Thread-compatible, like any torch::nn::Module.
class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptConfig& config);

  // idx: [B, T] int64 token ids in [0, vocab_size), 1 <= T <= seq_len.
  // Returns logits [B, T, vocab_size] (float32). Position t only sees tokens
  // 0..t (causal). Named `forward` (not Forward) because torch::nn's module
  // holders dispatch operator() to it.
  torch::Tensor forward(const torch::Tensor& idx);

  // The final hidden states [B, T, d] (after ln_f), before the LM head;
  // float32 in every precision.
  torch::Tensor Hidden(const torch::Tensor& idx);

  // Mean next-token cross entropy of idx [B, T] against targets [B, T]
  // (nats per token): the LM head and the loss fused and chunked
  // (fused_loss.h), so the [B·T, V] logits are never held whole. The head's
  // products run in HeadMatmulDtype (fp32 accumulation); the loss is fp32.
  // With fp32 products, equal to LanguageModelLoss(forward(idx), targets)
  // within 1e-5.
  torch::Tensor Loss(const torch::Tensor& idx, const torch::Tensor& targets);

  const GptConfig& config() const { return config_; }

  // Logits [B, t, V] (float32) of the t tokens `idx` [B, t] that follow the
  // cache->length positions `cache` holds, whose keys and values it appends:
  // equal to forward() of all cache->length + t tokens at the last t
  // positions, within float rounding. For sampling: no autograd, no
  // autocast, no dropout, no activation checkpointing (callers put the
  // module in eval mode). Throws c10::Error when cache->length + t exceeds
  // seq_len.
  torch::Tensor ForwardCached(const torch::Tensor& idx, KvCache* cache);

  // The LM head's weight [V, d]: wte's (tied) or lm_head's.
  const torch::Tensor& HeadWeight() const;

 private:
  void InitWeights();

  GptConfig config_;
  torch::nn::Embedding wte_{nullptr};  // token embedding; also the LM head when tied
  torch::nn::Embedding wpe_{nullptr};  // learned position embedding (null when rotary)
  torch::nn::Dropout drop_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};  // of Block (see gpt.cc)
  Norm ln_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};  // untied only
};
TORCH_MODULE(Gpt);

// Mean next-token cross entropy (nats per token) of logits [B, T, V] against
// targets [B, T] int64.
torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_GPT_H_
