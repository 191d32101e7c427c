#include "worker/engine/hf_export.h"

#include <cstring>
#include <fstream>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::engine {
namespace {

absl::Status Unsupported(absl::string_view what, absl::string_view arch) {
  return absl::FailedPreconditionError(absl::StrCat(
      "this model cannot be exported as Hugging Face ", arch, ": ", what,
      " (GPT-2 is LayerNorm, GELU, learned positions, biases, tied embeddings, multi-head; "
      "Llama is RMSNorm, SwiGLU, rotary positions, no biases, untied embeddings)"));
}

// A tensor by Loom name, or an error naming it.
absl::StatusOr<torch::Tensor> Get(const std::map<std::string, torch::Tensor>& p,
                                  const std::string& name) {
  auto it = p.find(name);
  if (it == p.end()) return absl::FailedPreconditionError(absl::StrCat("no parameter ", name));
  return it->second.to(torch::kFloat).contiguous();
}

}  // namespace

absl::StatusOr<std::string> HfArchitecture(const GptConfig& c) {
  if (IsGpt2Shape(c)) return std::string("gpt2");
  const bool llama = c.gated_mlp && !c.bias && c.rms_norm && c.rotary && !c.tied_embeddings;
  if (llama) return std::string("llama");
  if (c.rotary || c.rms_norm || c.gated_mlp || !c.bias || !c.tied_embeddings) {
    std::vector<std::string> parts;
    if (!c.gated_mlp) parts.push_back("a GELU MLP");
    if (c.bias) parts.push_back("biases");
    if (!c.rms_norm) parts.push_back("LayerNorm");
    if (!c.rotary) parts.push_back("learned positions");
    if (c.tied_embeddings) parts.push_back("tied embeddings");
    return Unsupported(absl::StrCat("a Llama-like model with ", absl::StrJoin(parts, ", ")),
                       "Llama");
  }
  // GPT-2's knobs but another MLP width or grouped-query attention.
  return Unsupported("GPT-2 with grouped-query attention or an MLP width other than 4 x d_model",
                     "GPT-2");
}

absl::StatusOr<std::map<std::string, torch::Tensor>> ToHfTensors(
    const GptConfig& c, const std::map<std::string, torch::Tensor>& p) {
  ASSIGN_OR_RETURN(const std::string arch, HfArchitecture(c));
  std::map<std::string, torch::Tensor> out;
  if (arch == "gpt2") {
    ASSIGN_OR_RETURN(out["transformer.wte.weight"], Get(p, "wte.weight"));
    ASSIGN_OR_RETURN(out["transformer.wpe.weight"], Get(p, "wpe.weight"));
    for (int i = 0; i < c.n_layer; ++i) {
      const std::string from = absl::StrCat("h.", i, "."), to = absl::StrCat("transformer.h.", i, ".");
      for (const char* norm : {"ln_1", "ln_2"}) {
        for (const char* part : {".weight", ".bias"}) {
          ASSIGN_OR_RETURN(out[to + norm + part], Get(p, from + norm + part));
        }
      }
      // Conv1D: weight [in, out].
      for (const char* linear : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
        ASSIGN_OR_RETURN(torch::Tensor w, Get(p, from + linear + ".weight"));
        out[to + linear + ".weight"] = w.t().contiguous();
        ASSIGN_OR_RETURN(out[to + linear + ".bias"], Get(p, from + linear + ".bias"));
      }
    }
    ASSIGN_OR_RETURN(out["transformer.ln_f.weight"], Get(p, "ln_f.weight"));
    ASSIGN_OR_RETURN(out["transformer.ln_f.bias"], Get(p, "ln_f.bias"));
    return out;
  }
  const int64_t hd = c.d_model / c.n_head, q_rows = c.n_head * hd, kv_rows = KvHeads(c) * hd;
  ASSIGN_OR_RETURN(out["model.embed_tokens.weight"], Get(p, "wte.weight"));
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string from = absl::StrCat("h.", i, "."), to = absl::StrCat("model.layers.", i, ".");
    ASSIGN_OR_RETURN(out[to + "input_layernorm.weight"], Get(p, from + "ln_1.weight"));
    ASSIGN_OR_RETURN(out[to + "post_attention_layernorm.weight"], Get(p, from + "ln_2.weight"));
    ASSIGN_OR_RETURN(torch::Tensor qkv, Get(p, from + "attn.c_attn.weight"));
    out[to + "self_attn.q_proj.weight"] = qkv.narrow(0, 0, q_rows).contiguous();
    out[to + "self_attn.k_proj.weight"] = qkv.narrow(0, q_rows, kv_rows).contiguous();
    out[to + "self_attn.v_proj.weight"] = qkv.narrow(0, q_rows + kv_rows, kv_rows).contiguous();
    ASSIGN_OR_RETURN(out[to + "self_attn.o_proj.weight"], Get(p, from + "attn.c_proj.weight"));
    ASSIGN_OR_RETURN(out[to + "mlp.gate_proj.weight"], Get(p, from + "mlp.c_fc.weight"));
    ASSIGN_OR_RETURN(out[to + "mlp.up_proj.weight"], Get(p, from + "mlp.c_up.weight"));
    ASSIGN_OR_RETURN(out[to + "mlp.down_proj.weight"], Get(p, from + "mlp.c_proj.weight"));
  }
  ASSIGN_OR_RETURN(out["model.norm.weight"], Get(p, "ln_f.weight"));
  ASSIGN_OR_RETURN(out["lm_head.weight"], Get(p, "lm_head.weight"));
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, torch::Tensor>& tensors) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    const torch::Tensor t = tensor.to(torch::kFloat).contiguous().cpu();
    const size_t begin = data.size();
    data.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    absl::StrAppend(&header, ",\"", name, "\":{\"dtype\":\"F32\",\"shape\":[",
                    absl::StrJoin(t.sizes(), ","), "],\"data_offsets\":[", begin, ",",
                    data.size(), "]}");
  }
  header += "}";
  // The data starts 8-byte aligned: pad the header with spaces.
  while ((8 + header.size()) % 8 != 0) header += ' ';
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  file += header;
  file += data;
  return WriteFileAtomically(path, file);
}

absl::StatusOr<std::string> HfConfigJson(const GptConfig& c) {
  ASSIGN_OR_RETURN(const std::string arch, HfArchitecture(c));
  if (arch == "gpt2") {
    return absl::StrFormat(
        "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
        "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n"
        "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
        "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": %g,\n"
        "  \"resid_pdrop\": %g,\n  \"embd_pdrop\": %g,\n  \"attn_pdrop\": %g,\n"
        "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n",
        c.vocab_size, c.seq_len, c.seq_len, c.d_model, c.n_layer, c.n_head, c.norm_eps, c.dropout,
        c.dropout, c.dropout);
  }
  return absl::StrFormat(
      "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
      "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
      "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
      "  \"num_key_value_heads\": %d,\n  \"max_position_embeddings\": %d,\n"
      "  \"hidden_act\": \"silu\",\n  \"rms_norm_eps\": %g,\n  \"rope_theta\": %g,\n"
      "  \"attention_bias\": false,\n  \"tie_word_embeddings\": false,\n"
      "  \"torch_dtype\": \"float32\"\n}\n",
      c.vocab_size, c.d_model, FfnHidden(c), c.n_layer, c.n_head, KvHeads(c), c.seq_len,
      c.norm_eps, c.rope_theta);
}

absl::Status ExportHf(const GptConfig& config, const std::map<std::string, torch::Tensor>& parameters,
                      const std::string& tokenizer_dir, const std::string& out_dir) {
  ASSIGN_OR_RETURN(const std::string arch, HfArchitecture(config));
  ASSIGN_OR_RETURN(auto tensors, ToHfTensors(config, parameters));
  ASSIGN_OR_RETURN(const std::string config_json, HfConfigJson(config));
  RETURN_IF_ERROR(MakeDirs(out_dir));
  RETURN_IF_ERROR(WriteSafetensors(out_dir + "/model.safetensors", tensors));
  RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/config.json", config_json));
  RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/generation_config.json",
                                      "{\n  \"do_sample\": true,\n  \"temperature\": 0.8,\n"
                                      "  \"top_k\": 40\n}\n"));
  const std::string model = tokenizer_dir + "/tokenizer.model";
  if (std::ifstream(model).good()) {
    absl::StatusOr<std::string> bytes = ReadFile(model);
    if (!bytes.ok()) return bytes.status();
    RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/tokenizer.model", *bytes));
    // LlamaTokenizer reads tokenizer.model (SentencePiece). Loom's model has
    // no BOS/EOS pieces and no dummy prefix.
    RETURN_IF_ERROR(WriteFileAtomically(
        out_dir + "/tokenizer_config.json",
        "{\n  \"tokenizer_class\": \"LlamaTokenizer\",\n  \"add_bos_token\": false,\n"
        "  \"add_eos_token\": false,\n  \"legacy\": false,\n  \"add_prefix_space\": false,\n"
        "  \"model_max_length\": " +
            std::to_string(config.seq_len) + "\n}\n"));
  } else {
    RETURN_IF_ERROR(WriteFileAtomically(
        out_dir + "/tokenizer_config.json",
        "{\n  \"tokenizer_class\": \"loom-bytes\",\n  \"comment\": \"byte-level: token id = "
        "byte value (0-255); decode with bytes(ids)\",\n  \"model_max_length\": " +
            std::to_string(config.seq_len) + "\n}\n"));
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
