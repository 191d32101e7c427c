// The one description of a decoder-only transformer's shape, and its
// parameter count and FLOPs in closed form: the planner plans with it
// (controller/planner/model.h), the engine counts its parameters with it
// (worker/engine/gpt.h) and the telemetry computes model FLOPs and MFU with
// it (worker/telemetry/telemetry.h). Plain structs and pure functions, no
// LibTorch, safe from any thread.
//
// Units: counts are plain integers; FLOPs are floating-point operations (one
// multiply-add = 2 FLOPs).
#ifndef LOOM_COMMON_MODEL_SHAPE_H_
#define LOOM_COMMON_MODEL_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace loom {

// The defaults describe GPT-2 / Megatron-LM GPT (learned positions, biases,
// LayerNorm, 4h GELU MLP, tied embeddings); a Llama-family model sets
// gated_mlp, bias = false, rms_norm, learned_position_embedding = false
// (rotary positions), tied_embeddings = false and n_kv_head.
struct ModelShape {
  std::string name;          // for reports only
  int64_t n_layer = 0;       // transformer blocks
  int64_t d_model = 0;       // residual width h
  int64_t n_head = 0;        // query heads a; must divide d_model
  int64_t n_kv_head = 0;     // key/value heads (GQA); 0 = n_head (MHA)
  double ffn_multiplier = 4.0;  // MLP hidden = round(ffn_multiplier x d_model)
  int64_t ffn_hidden = 0;    // explicit MLP hidden width; 0 = use the multiplier
  int64_t vocab_size = 0;    // V
  int64_t seq_len = 0;       // s, tokens per sequence
  bool gated_mlp = false;    // SwiGLU-style: three h x f matrices instead of two
  bool bias = true;          // linear layers carry biases
  bool rms_norm = false;     // RMSNorm (scale only) instead of LayerNorm
  bool learned_position_embedding = true;  // s x h position table (else rotary)
  bool tied_embeddings = true;  // output head shares the input embedding
};

// Checks shape invariants. Returns INVALID_ARGUMENT whose message starts with
// the field path, e.g. "model.n_head: 5 does not divide model.d_model 768".
absl::Status ValidateModelShape(const ModelShape& model);

// MLP hidden width f (ffn_hidden, or round(ffn_multiplier x d_model)).
int64_t FfnHidden(const ModelShape& model);
// Key/value heads (n_kv_head, or n_head when 0).
int64_t KvHeads(const ModelShape& model);

// Parameter count in closed form. For the GPT defaults the total is
// Narayanan et al. 2021 (Megatron-LM), Sec. 5.1 / Appendix:
//   P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))  (+ 2h for the final norm)
// and in general, per layer, with h_kv = h x n_kv_head / n_head:
//   attention  Q, O: 2h^2;  K, V: 2 h h_kv        (GQA shrinks K and V)
//   MLP        2hf (3hf gated)
//   biases     h + 2h_kv + h (attention) + f + h (MLP; gated: 2f + h)
//   norms      2 x 2h (LayerNorm weight + bias), 2 x h (RMSNorm)
struct ParameterCount {
  int64_t per_layer = 0;         // everything in one block
  int64_t per_layer_matmul = 0;  // weight matrices only (what does FLOPs)
  int64_t per_layer_norm = 0;    // norm parameters (replicated under TP)
  int64_t word_embedding = 0;    // V x h
  int64_t position_embedding = 0;  // s x h, 0 without learned positions
  int64_t output_head = 0;       // V x h when untied, else 0
  int64_t final_norm = 0;
  int64_t total = 0;
};
ParameterCount CountParameters(const ModelShape& model);

// Forward FLOPs of one sequence of seq_len tokens (Narayanan et al. 2021,
// Sec. 5.1: per layer 24 B s h^2 + 4 B s^2 h for GPT, i.e. 2 x matmul params
// per token plus 4 s h per token for QK^T and attention-times-V; the logit
// layer adds 2 s h V). Causal masking is not discounted, as in Megatron.
struct ForwardFlops {
  double per_layer = 0;        // one block, one sequence
  double attention_scores = 0; // the 4 s^2 h part of per_layer
  double logits = 0;           // output projection, one sequence
};
ForwardFlops ForwardFlopsPerSequence(const ModelShape& model);

// Model FLOPs of one training step (forward + backward = 3 x forward, no
// recompute): for GPT this is Narayanan et al. 2021, Sec. 5.1, without the
// recompute pass, 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). Used for MFU.
double ModelFlopsPerStep(const ModelShape& model, int64_t global_batch_sequences);

// The same per token: 6 x (matmul parameters + the LM head's V h) plus
// attention's 12 l s h (PaLM's MFU definition, Chowdhery et al. 2022,
// Appendix B).
double ModelFlopsPerToken(const ModelShape& model);

}  // namespace loom

#endif  // LOOM_COMMON_MODEL_SHAPE_H_
