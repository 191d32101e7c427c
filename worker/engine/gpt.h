// GPT-2-style decoder-only transformer (Radford et al. 2019, "Language Models
// are Unsupervised Multitask Learners", section 2.3), as a LibTorch module.
//
// Layout follows nanoGPT/llm.c so parameter names read the same:
//   wte [V,d], wpe [s,d], h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2,
//   mlp.c_fc, mlp.c_proj}, ln_f; the LM head reuses wte.weight (tied).
#ifndef LOOM_WORKER_ENGINE_GPT_H_
#define LOOM_WORKER_ENGINE_GPT_H_

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "worker/engine/config.h"

namespace loom::engine {

// OK if `config` describes a buildable model; INVALID_ARGUMENT naming the
// offending field otherwise (non-positive sizes, d_model % n_head != 0,
// dropout outside [0, 1), activation_checkpointing below -1, and precision
// fp16 unless config.on_gpu: "precision: fp16 needs a GPU ...").
absl::Status ValidateGptConfig(const GptConfig& config);

// "fp32", "bf16" or "fp16" (the spelling of StepMetrics.precision).
const char* PrecisionName(Precision precision);

// Number of trainable parameters of Gpt(config), in closed form:
//   V*d + s*d + L*(12*d^2 + 13*d) + 2*d
// with V = vocab_size, s = seq_len, d = d_model, L = n_layer. Per block:
// ln_1 and ln_2 (2d each), c_attn (3d^2 + 3d), attn.c_proj (d^2 + d), c_fc
// (4d^2 + 4d), mlp.c_proj (4d^2 + d); ln_f adds 2d; the tied LM head adds
// nothing. (Same count as nanoGPT's GPT.get_num_params with the position
// embedding included.)
int64_t GptParameterCount(const GptConfig& config);

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
  // (fused_loss.h), so the [B·T, V] logits are never held whole. Equal to
  // LanguageModelLoss(forward(idx), targets) within 1e-5.
  torch::Tensor Loss(const torch::Tensor& idx, const torch::Tensor& targets);

  const GptConfig& config() const { return config_; }

 private:
  void InitWeights();

  GptConfig config_;
  torch::nn::Embedding wte_{nullptr};  // token embedding; also the LM head
  torch::nn::Embedding wpe_{nullptr};  // learned position embedding
  torch::nn::Dropout drop_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};  // of Block (see gpt.cc)
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Gpt);

// Mean next-token cross entropy (nats per token) of logits [B, T, V] against
// targets [B, T] int64.
torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_GPT_H_
