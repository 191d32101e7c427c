// Model and request fixtures shared by the planner's tests and benchmark.
#ifndef LOOM_CONTROLLER_PLANNER_TEST_MODELS_H_
#define LOOM_CONTROLLER_PLANNER_TEST_MODELS_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "controller/planner/model.h"

namespace loom::planner::test_models {

// A GPT of Megatron-LM's family (Narayanan et al. 2021, Table 1): vocabulary
// 51,200, sequence 2048, GPT defaults otherwise.
inline ModelSpec MegatronGpt(const std::string& name, int64_t layers, int64_t hidden,
                             int64_t heads) {
  ModelSpec model;
  model.name = name;
  model.n_layer = layers;
  model.d_model = hidden;
  model.n_head = heads;
  model.vocab_size = 51200;
  model.seq_len = 2048;
  return model;
}

// One row of Narayanan et al. 2021, Table 1, and its published layout.
struct MegatronRow {
  const char* name;
  int64_t layers, hidden, heads, batch;
  int gpus, tp, pp, dp;
};
inline void PrintTo(const MegatronRow& row, std::ostream* os) { *os << row.name; }
inline constexpr MegatronRow kMegatronRows[] = {
    {"GPT 18.4B", 40, 6144, 48, 1024, 256, 8, 1, 32},
    {"GPT 145.6B", 80, 12288, 96, 2304, 1536, 8, 8, 24},
    {"GPT 529.6B", 105, 20480, 128, 2520, 2520, 8, 35, 9},
    {"GPT 1008B", 128, 25600, 160, 3072, 3072, 8, 64, 6},
};

// GPT-2 XL: 48 layers, 1600 wide, 25 heads, 50,257 tokens, 1024 context.
inline ModelSpec Gpt2Xl() {
  ModelSpec model;
  model.name = "GPT-2 XL";
  model.n_layer = 48;
  model.d_model = 1600;
  model.n_head = 25;
  model.vocab_size = 50257;
  model.seq_len = 1024;
  return model;
}

// GPT-2 small (124M).
inline ModelSpec Gpt2Small() {
  ModelSpec model = Gpt2Xl();
  model.name = "GPT-2 small";
  model.n_layer = 12;
  model.d_model = 768;
  model.n_head = 12;
  return model;
}

// A GPT with 7,000,031,232 parameters (16 bytes each = 112.0 GB), for the
// chapter's "7B model" examples.
inline ModelSpec Gpt7B() {
  ModelSpec model;
  model.name = "GPT 7B";
  model.n_layer = 34;
  model.d_model = 4096;
  model.n_head = 32;
  model.vocab_size = 35332;
  model.seq_len = 2048;
  return model;
}

// Llama-2-70B: GQA with 8 KV heads, SwiGLU MLP of 28,672, RMSNorm, rotary
// positions, untied embeddings, no biases.
inline ModelSpec Llama2_70B() {
  ModelSpec model;
  model.name = "Llama-2-70B";
  model.n_layer = 80;
  model.d_model = 8192;
  model.n_head = 64;
  model.n_kv_head = 8;
  model.ffn_hidden = 28672;
  model.vocab_size = 32000;
  model.seq_len = 4096;
  model.gated_mlp = true;
  model.bias = false;
  model.rms_norm = true;
  model.learned_position_embedding = false;
  model.tied_embeddings = false;
  return model;
}

// BLOOM-176B (the BLOOM paper, BigScience Workshop 2022): 70 layers, 14,336
// wide, 112 heads, vocabulary 250,880, sequence 2048, ALiBi positions (no
// learned table), tied embeddings, GELU 4h MLP. Trained on 384 A100-80GB as
// tp 4 x pp 12 x dp 8, ZeRO-1, global batch 2048: 70 layers do not divide
// into 12 stages.
inline ModelSpec Bloom176B() {
  ModelSpec model;
  model.name = "BLOOM-176B";
  model.n_layer = 70;
  model.d_model = 14336;
  model.n_head = 112;
  model.vocab_size = 250880;
  model.seq_len = 2048;
  model.learned_position_embedding = false;
  return model;
}

// Llama-3.1-405B (Dubey et al. 2024, Table 3): 126 layers, 16,384 wide, 128
// heads with 8 KV heads, SwiGLU MLP of 53,248, vocabulary 128,256, RMSNorm,
// rotary positions, untied embeddings; pre-trained at sequence 8192 on up to
// 16,384 H100s as tp 8 x pp 16 x dp 128 with FSDP sharding over the
// data-parallel group (Sec. 3.3.2, Table 4), 126 layers on 16 stages. (Meta
// kept the parameters gathered between forward and backward; ZeRO-3 is the
// fully sharded form of that layout.)
inline ModelSpec Llama3_405B() {
  ModelSpec model;
  model.name = "Llama-3-405B";
  model.n_layer = 126;
  model.d_model = 16384;
  model.n_head = 128;
  model.n_kv_head = 8;
  model.ffn_hidden = 53248;
  model.vocab_size = 128256;
  model.seq_len = 8192;
  model.gated_mlp = true;
  model.bias = false;
  model.rms_norm = true;
  model.learned_position_embedding = false;
  model.tied_embeddings = false;
  return model;
}

}  // namespace loom::planner::test_models

#endif  // LOOM_CONTROLLER_PLANNER_TEST_MODELS_H_
