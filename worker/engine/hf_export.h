// Export of a trained model in the layout Hugging Face's tools read (the
// common currency of weights): DIR/model.safetensors, DIR/config.json and
// the tokenizer, for GPT-2 (GPT2LMHeadModel) and the Llama family
// (LlamaForCausalLM).
//
// safetensors (github.com/huggingface/safetensors, the format's README):
// an 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor's name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// into the data that follows, in the order written, 8-byte aligned header),
// then the raw little-endian data. Loom writes F32.
//
// Names and layouts:
//   GPT-2: transformer.wte / wpe / h.<i>.{ln_1, attn.c_attn, attn.c_proj,
//     ln_2, mlp.c_fc, mlp.c_proj} / ln_f; Hugging Face's GPT-2 uses Conv1D,
//     whose weight is [in, out]: Loom's [out, in] linear weights are
//     transposed. The LM head is tied (no lm_head tensor).
//   Llama: model.embed_tokens, model.layers.<i>.{input_layernorm,
//     self_attn.{q,k,v,o}_proj, post_attention_layernorm,
//     mlp.{gate,up,down}_proj}, model.norm, lm_head (untied). Loom's fused
//     c_attn rows are [q | k | v]; its rotary embedding is the half-split
//     form Hugging Face's Llama uses, so no row permutation is needed.
// A model whose knobs neither architecture expresses (e.g. GPT-2 with
// RMSNorm, or Llama with biases) is FAILED_PRECONDITION.
#ifndef LOOM_WORKER_ENGINE_HF_EXPORT_H_
#define LOOM_WORKER_ENGINE_HF_EXPORT_H_

#include <map>
#include <string>

#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/config.h"

namespace loom::engine {

// "gpt2" or "llama": the Hugging Face architecture `config` maps onto;
// FAILED_PRECONDITION naming the knob otherwise.
absl::StatusOr<std::string> HfArchitecture(const GptConfig& config);

// The Hugging Face tensors of a model's parameters (Loom names, as
// Gpt::named_parameters gives them).
absl::StatusOr<std::map<std::string, torch::Tensor>> ToHfTensors(
    const GptConfig& config, const std::map<std::string, torch::Tensor>& parameters);

// Writes `tensors` (F32, contiguous copies made as needed) as a safetensors
// file, atomically (a temporary file renamed into place).
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, torch::Tensor>& tensors);

// config.json for the architecture (model_type, sizes, norms' epsilon,
// rope_theta, tie_word_embeddings, torch_dtype float32).
absl::StatusOr<std::string> HfConfigJson(const GptConfig& config);

// DIR/model.safetensors, DIR/config.json, DIR/generation_config.json and,
// from `tokenizer_dir` (the data directory), the tokenizer: a BPE
// directory's tokenizer.model with a tokenizer_config.json for
// LlamaTokenizer; for byte-level data a tokenizer_config.json saying so
// (ids are bytes). DIR is created if missing.
absl::Status ExportHf(const GptConfig& config, const std::map<std::string, torch::Tensor>& parameters,
                      const std::string& tokenizer_dir, const std::string& out_dir);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_HF_EXPORT_H_
