// What is being trained: the transformer's shape and the training recipe, as
// the parallelism planner sees them. Plain structs; the controller converts
// its JobSpec proto into these (loom.v1.GptModel maps onto ModelSpec with the
// GPT defaults below).
//
// Units: counts are plain integers, bytes are bytes, FLOPs are floating-point
// operations (one multiply-add = 2 FLOPs). Everything here is a pure function
// of its arguments and safe to call from any thread.
#ifndef LOOM_CONTROLLER_PLANNER_MODEL_H_
#define LOOM_CONTROLLER_PLANNER_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "common/device_catalog.h"

namespace loom::planner {

// A decoder-only transformer. The defaults describe GPT-2 / Megatron-LM GPT
// (learned positions, biases, LayerNorm, 4h GELU MLP, tied embeddings); a
// Llama-style model sets gated_mlp, bias = false, rms_norm,
// learned_position_embedding = false, tied_embeddings = false and n_kv_head.
struct ModelSpec {
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
  bool learned_position_embedding = true;  // s x h position table
  bool tied_embeddings = true;  // output head shares the input embedding
};

// Checks shape invariants. Returns INVALID_ARGUMENT whose message starts with
// the field path, e.g. "model.n_head: 5 does not divide model.d_model 768".
absl::Status ValidateModel(const ModelSpec& model);

// MLP hidden width f (ffn_hidden, or round(ffn_multiplier x d_model)).
int64_t FfnHidden(const ModelSpec& model);
// Key/value heads (n_kv_head, or n_head when 0).
int64_t KvHeads(const ModelSpec& model);

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
ParameterCount CountParameters(const ModelSpec& model);

// Forward FLOPs of one sequence of seq_len tokens (Narayanan et al. 2021,
// Sec. 5.1: per layer 24 B s h^2 + 4 B s^2 h for GPT, i.e. 2 x matmul params
// per token plus 4 s h per token for QK^T and attention-times-V; the logit
// layer adds 2 s h V). Causal masking is not discounted, as in Megatron.
struct ForwardFlops {
  double per_layer = 0;        // one block, one sequence
  double attention_scores = 0; // the 4 s^2 h part of per_layer
  double logits = 0;           // output projection, one sequence
};
ForwardFlops ForwardFlopsPerSequence(const ModelSpec& model);

// Model FLOPs of one training step (forward + backward = 3 x forward, no
// recompute): for GPT this is Narayanan et al. 2021, Sec. 5.1, without the
// recompute pass, 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). Used for MFU.
double ModelFlopsPerStep(const ModelSpec& model, int64_t global_batch_sequences);

// Matmul precision: common/device_catalog.h (the catalog's peaks are per
// precision).
using Precision = ::loom::MatmulPrecision;
using ::loom::PrecisionName;
enum class Optimizer { kAdamW, kSgdMomentum };

absl::string_view OptimizerName(Optimizer optimizer);   // "adamw", ...

// How the model is trained.
struct TrainingSpec {
  int64_t global_batch_sequences = 0;  // sequences per optimizer step
  Precision precision = Precision::kBf16;  // matmul precision
  Optimizer optimizer = Optimizer::kAdamW;
  bool fp32_master_weights = true;  // ignored when weights are already fp32
  // Tokens to train for the iron-law estimates (time, device-hours, cost,
  // energy); 0 = report per-step figures only.
  double token_budget = 0;
};

absl::Status ValidateTraining(const TrainingSpec& training);

// Bytes of training state per parameter, before any sharding.
// Mixed-precision Adam (bf16/fp16/fp8 with fp32 master weights): 2 (weights)
// + 2 (gradients) + 4 (master) + 4 + 4 (moments) = 16; fp32 Adam: 4 + 4 + 8
// = 16 (the chapter's GPT-2 XL example, lines 362-369; Rajbhandari et al.
// 2020, ZeRO, Sec. 3.1, K = 12). SGD with momentum keeps one moment (4).
// fp8 keeps 16-bit weights and gradients (Transformer Engine style).
struct StateBytesPerParam {
  double weights = 0;
  double gradients = 0;
  double master_weights = 0;
  double optimizer_states = 0;
  double total() const {
    return weights + gradients + master_weights + optimizer_states;
  }
};
StateBytesPerParam BytesPerParam(const TrainingSpec& training);

// Bytes per stored activation element: 4 for fp32/tf32 training, else 2.
double ActivationBytesPerElement(Precision precision);

// Bytes the optimizer step reads and writes per parameter it updates: the
// chapter (lines 420-430) counts 28 for fp32 Adam (read g, theta, m, v; write
// m, v, theta); mixed Adam also reads 16-bit g and writes 16-bit weights (28);
// SGD-momentum touches three tensors (20).
double OptimizerStepBytesPerParam(const TrainingSpec& training);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_MODEL_H_
