// Configuration of the model, the optimizer and the schedule of one training
// rank, and the data-batch ranges the trainer skips: plain structs, no
// LibTorch, so that the model (gpt.h), the optimizer (optimizer.h), the
// checkpoint format (checkpoint.h) and tools can use them without the
// training loop (trainer.h, whose TrainerConfig gathers them).
#ifndef LOOM_WORKER_ENGINE_CONFIG_H_
#define LOOM_WORKER_ENGINE_CONFIG_H_

#include <cstdint>

#include "common/formats/batch_range.h"

namespace loom::engine {

// Arithmetic of the transformer blocks. Master weights, gradients and
// optimizer state are fp32 in every mode, and so is the loss: the
// log-sum-exp and cross-entropy run on fp32 logits. The LM head's matrix
// products follow HeadPrecision below.
enum class Precision {
  kFp32,
  // bf16 autocast over the blocks' forward (and so their backward): matrix
  // products in bf16, reductions and the residual stream in fp32.
  kBf16,
  // fp16 autocast with dynamic loss scaling (loss_scaler.h). Needs a GPU
  // (TrainerConfig::device "cuda..."); refused on the CPU
  // (ValidateGptConfig, GptConfig::on_gpu).
  kFp16,
};

// The dtype of the LM head's matrix products (hidden @ W^T and its two
// gradient products) under bf16 or fp16 training; under fp32 they are fp32
// whatever this says. On a GPU the head is the largest single GEMM of a
// step (2·N·V·d FLOPs three times over, V ≈ 50k): in fp32 it would cost
// more than every block together in bf16 and cap the step's MFU.
enum class HeadPrecision {
  // The blocks' precision on a GPU; fp32 on the CPU, where bf16 products
  // run no faster than fp32 ones and the numbers are kept as they were.
  kAuto,
  // fp32 on every device.
  kFp32,
  // The blocks' precision on every device (tests of the GPU's arithmetic
  // on the CPU).
  kBlocks,
};

// Value of GptConfig::activation_checkpointing that asks for Chen et al.'s
// placement: segments of ceil(sqrt(n_layer)) blocks.
inline constexpr int kActivationCheckpointingSqrt = -1;

// The decoder's shape. The defaults of the family knobs below are GPT-2's;
// a Llama-family model (Touvron et al. 2023) sets n_kv_head, ffn_hidden,
// gated_mlp, bias = false, rms_norm, rotary and tied_embeddings = false.
struct GptConfig {
  int n_layer = 2;
  int n_head = 2;
  int d_model = 64;
  int seq_len = 64;
  int vocab_size = 256;
  double dropout = 0.0;
  // Key/value heads (grouped-query attention, Ainslie et al. 2023): each
  // serves n_head / n_kv_head query heads. 0 = n_head.
  int n_kv_head = 0;
  // MLP hidden width; 0 = 4 x d_model.
  int ffn_hidden = 0;
  // SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x)), three matrices,
  // instead of GPT-2's down(gelu(up(x))).
  bool gated_mlp = false;
  // Biases on every linear layer and LayerNorm (GPT-2); none (Llama).
  bool bias = true;
  // RMSNorm (Zhang & Sennrich 2019; a scale, no bias, no centering) instead
  // of LayerNorm.
  bool rms_norm = false;
  // Rotary position embeddings of queries and keys (Su et al. 2021, in the
  // half-split form of Hugging Face's Llama) instead of a learned table.
  bool rotary = false;
  // The LM head reuses the token embedding (GPT-2), or has its own matrix.
  bool tied_embeddings = true;
  double rope_theta = 10000.0;  // rotary base frequency
  double norm_eps = 1e-5;       // LayerNorm / RMSNorm epsilon
  // How the model runs; neither changes its parameters, so a checkpoint
  // resumes under any setting of them.
  Precision precision = Precision::kFp32;
  HeadPrecision head_precision = HeadPrecision::kAuto;
  // Activation checkpointing (activation_checkpoint.h): 0 = off; k >= 1 =
  // keep the block input only at every k-th block, i.e. run the blocks in
  // segments of k that store just their input and are recomputed in
  // backward; kActivationCheckpointingSqrt = segments of ceil(sqrt(n_layer)).
  int activation_checkpointing = 0;
  // Whether the model runs on a GPU. The trainer sets it from
  // TrainerConfig::device; only ValidateGptConfig reads it (fp16 needs a
  // GPU). The model is built on the CPU either way, and its owner moves it.
  bool on_gpu = false;
};

// Key/value heads (n_kv_head, or n_head when 0) and the MLP's hidden width
// (ffn_hidden, or 4 x d_model when 0).
inline int64_t KvHeads(const GptConfig& c) { return c.n_kv_head > 0 ? c.n_kv_head : c.n_head; }
inline int64_t FfnHidden(const GptConfig& c) {
  return c.ffn_hidden > 0 ? c.ffn_hidden : 4 * int64_t{c.d_model};
}

// True for GPT-2's shape: what the tensor/pipeline/ZeRO engine
// (parallel/parallel_gpt.h) builds, and the model whose checkpoint
// fingerprint names only its sizes.
inline bool IsGpt2Shape(const GptConfig& c) {
  return KvHeads(c) == c.n_head && FfnHidden(c) == 4 * int64_t{c.d_model} && !c.gated_mlp &&
         c.bias && !c.rms_norm && !c.rotary && c.tied_embeddings && c.norm_eps == 1e-5;
}

struct OptimizerConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables
};

struct ScheduleConfig {
  int64_t total_steps = 100;
  int64_t warmup_steps = 10;
  double min_lr_ratio = 0.1;
};

// BatchRange (data batch ranges to skip): common/formats/batch_range.h.

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CONFIG_H_
