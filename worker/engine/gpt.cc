#include "worker/engine/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/functional/embedding.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>
#include <torch/version.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/activation_checkpoint.h"
#include "worker/engine/autocast.h"
#include "worker/engine/ops/causal_attention.h"
#include "worker/engine/ops/fused_loss.h"
#include "worker/engine/ops/gelu.h"
#include "worker/engine/ops/rms_norm.h"
#include "worker/engine/ops/swiglu.h"

namespace loom::engine {
namespace {

constexpr double kInitStd = 0.02;

// Causal multi-head self-attention (Vaswani et al. 2017, eq. 1, with the
// future positions masked to -inf before the softmax). With grouped-query
// attention the fused projection is [q (n_head heads) | k | v (n_kv_head
// heads each)] and each key/value head serves n_head / n_kv_head
// consecutive query heads; with rotary positions the queries and keys are
// rotated before the scores (ApplyRotary).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& c)
      : n_head_(c.n_head),
        n_kv_head_(KvHeads(c)),
        head_dim_(c.d_model / c.n_head),
        rotary_(c.rotary),
        rope_theta_(c.rope_theta) {
    const int64_t qkv_width = (n_head_ + 2 * n_kv_head_) * head_dim_;
    c_attn_ = register_module(
        "c_attn", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, qkv_width).bias(c.bias)));
    c_proj_ = register_module(
        "c_proj", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.d_model).bias(c.bias)));
    attn_drop_ = register_module("attn_drop", torch::nn::Dropout(c.dropout));
    resid_drop_ = register_module("resid_drop", torch::nn::Dropout(c.dropout));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const double dropout = is_training() ? attn_drop_->options.p() : 0.0;
    // SDPA on LibTorch 2.x; Loom's blocked kernel on 1.13 (causal_attention.h).
    const torch::Tensor y = AttendProjection(c_attn_(x), n_head_, n_kv_head_, head_dim_, rotary_,
                                             rope_theta_, dropout);
    return resid_drop_(c_proj_(y));
  }

  // The new positions' attention over the cached ones and themselves
  // (GptImpl::ForwardCached). `keys`/`values`: [B, n_kv_head, length, hd],
  // undefined when empty; the new positions' are appended.
  torch::Tensor ForwardCached(const torch::Tensor& x, int64_t offset, torch::Tensor* keys,
                              torch::Tensor* values) {
    const int64_t batch = x.size(0), time = x.size(1);
    const torch::Tensor qkv = c_attn_(x);
    std::vector<torch::Tensor> parts = qkv.split_with_sizes(
        {n_head_ * head_dim_, n_kv_head_ * head_dim_, n_kv_head_ * head_dim_}, -1);
    torch::Tensor q = parts[0].view({batch, time, n_head_, head_dim_});
    torch::Tensor k = parts[1].view({batch, time, n_kv_head_, head_dim_});
    torch::Tensor v = parts[2].view({batch, time, n_kv_head_, head_dim_});
    if (rotary_) {
      RotaryTables tables = MakeRotaryTables(offset + time, head_dim_, rope_theta_, q);
      tables.cos = tables.cos.narrow(0, offset, time);
      tables.sin = tables.sin.narrow(0, offset, time);
      q = ApplyRotary(q, tables);
      k = ApplyRotary(k, tables);
    }
    k = k.transpose(1, 2);  // [B, kv, t, hd]
    v = v.transpose(1, 2);
    *keys = keys->defined() ? torch::cat({*keys, k}, 2) : k.contiguous();
    *values = values->defined() ? torch::cat({*values, v}, 2) : v.contiguous();
    torch::Tensor all_k = *keys, all_v = *values;
    if (n_kv_head_ != n_head_) {
      all_k = all_k.repeat_interleave(n_head_ / n_kv_head_, /*dim=*/1);
      all_v = all_v.repeat_interleave(n_head_ / n_kv_head_, /*dim=*/1);
    }
    const int64_t total = all_k.size(2);
    torch::Tensor scores = torch::matmul(q.transpose(1, 2), all_k.transpose(-2, -1)) /
                           std::sqrt(static_cast<double>(head_dim_));  // [B, H, t, total]
    // New position i (absolute offset + i) sees keys 0 .. offset + i.
    const torch::Tensor rows = torch::arange(offset, offset + time, x.options().dtype(torch::kLong));
    const torch::Tensor cols = torch::arange(total, x.options().dtype(torch::kLong));
    const torch::Tensor future = cols.unsqueeze(0) > rows.unsqueeze(1);  // [t, total]
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    torch::Tensor y = torch::matmul(torch::softmax(scores, -1), all_v);  // [B, H, t, hd]
    y = y.transpose(1, 2).reshape({batch, time, n_head_ * head_dim_});
    return c_proj_(y);
  }

 private:
  int64_t n_head_, n_kv_head_, head_dim_;
  bool rotary_;
  double rope_theta_;
  torch::nn::Linear c_attn_{nullptr}, c_proj_{nullptr};
  torch::nn::Dropout attn_drop_{nullptr}, resid_drop_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

// Position-wise MLP. GPT-2: d -> f -> d with the tanh approximation of GELU
// (Hendrycks & Gimpel 2016, section 2). Gated (SwiGLU, Shazeer 2020):
// c_proj(silu(c_fc(x)) * c_up(x)), c_fc being the gate.
class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const GptConfig& c) : gated_(c.gated_mlp) {
    const int64_t hidden = FfnHidden(c);
    c_fc_ = register_module(
        "c_fc", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, hidden).bias(c.bias)));
    if (gated_) {
      c_up_ = register_module(
          "c_up", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, hidden).bias(c.bias)));
    }
    c_proj_ = register_module(
        "c_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, c.d_model).bias(c.bias)));
    drop_ = register_module("drop", torch::nn::Dropout(c.dropout));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    if (gated_) return drop_(c_proj_(SwiGlu(c_fc_(x), c_up_(x))));  // fused on CPU fp32
    return drop_(c_proj_(GeluTanh(c_fc_(x))));
  }

 private:
  bool gated_;
  torch::nn::Linear c_fc_{nullptr}, c_up_{nullptr}, c_proj_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(Mlp);

// Pre-norm residual block (GPT-2 section 2.3; Llama the same with RMSNorm):
//   x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& c) {
    ln_1_ = register_module("ln_1", Norm(c));
    attn_ = register_module("attn", CausalSelfAttention(c));
    ln_2_ = register_module("ln_2", Norm(c));
    mlp_ = register_module("mlp", Mlp(c));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x + attn_(ln_1_(x));
    return x + mlp_(ln_2_(x));
  }

  torch::Tensor ForwardCached(torch::Tensor x, int64_t offset, torch::Tensor* keys,
                              torch::Tensor* values) {
    x = x + attn_->ForwardCached(ln_1_(x), offset, keys, values);
    return x + mlp_(ln_2_(x));
  }

 private:
  Norm ln_1_{nullptr}, ln_2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

}  // namespace

absl::Status ValidateGptConfig(const GptConfig& c) {
  auto positive = [](const char* field, int value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("model.", field, " must be > 0, got ", value));
  };
  for (absl::Status s : {positive("n_layer", c.n_layer), positive("n_head", c.n_head),
                         positive("d_model", c.d_model), positive("seq_len", c.seq_len),
                         positive("vocab_size", c.vocab_size)}) {
    if (!s.ok()) return s;
  }
  if (c.d_model % c.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.d_model (", c.d_model,
                                                   ") must be a multiple of model.n_head (",
                                                   c.n_head, ")"));
  }
  if (!(c.dropout >= 0.0 && c.dropout < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dropout must be in [0, 1), got ", c.dropout));
  }
  if (c.n_kv_head < 0 || c.n_kv_head > c.n_head ||
      (c.n_kv_head > 0 && c.n_head % c.n_kv_head != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.n_kv_head (", c.n_kv_head, ") must be 0 or divide model.n_head (", c.n_head, ")"));
  }
  if (c.ffn_hidden < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.ffn_hidden must be >= 0 (0 = 4 x d_model), got ", c.ffn_hidden));
  }
  if (c.rotary && (c.d_model / c.n_head) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rotary positions need an even head dimension, got d_model / n_head = ",
        c.d_model / c.n_head));
  }
  if (!(c.rope_theta > 0) || !(c.norm_eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("model.rope_theta (", c.rope_theta,
                                                   ") and model.norm_eps (", c.norm_eps,
                                                   ") must be > 0"));
  }
  if (c.activation_checkpointing < kActivationCheckpointingSqrt) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation_checkpointing must be 0 (off), k >= 1 (every k-th block) or ",
        kActivationCheckpointingSqrt, " (segments of ceil(sqrt(n_layer)) blocks), got ",
        c.activation_checkpointing));
  }
  switch (c.precision) {
    case Precision::kFp32:
    case Precision::kBf16:
      break;
    case Precision::kFp16:
      // fp16 needs dynamic loss scaling and fp16 kernels that CPUs run
      // slower than fp32; its only use is on GPUs.
      if (c.on_gpu) break;
      return absl::InvalidArgumentError(
          "precision: fp16 needs a GPU (fp16 autocast with dynamic loss scaling); this model "
          "runs on the CPU: use bf16 or fp32, or a CUDA device");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("precision: unknown value ", static_cast<int>(c.precision)));
  }
  return absl::OkStatus();
}

c10::ScalarType HeadMatmulDtype(const GptConfig& config, bool on_cuda) {
  const bool lower = config.head_precision == HeadPrecision::kBlocks ||
                     (config.head_precision == HeadPrecision::kAuto && on_cuda);
  if (!lower) return torch::kFloat;
  switch (config.precision) {
    case Precision::kBf16:
      return torch::kBFloat16;
    case Precision::kFp16:
      return torch::kHalf;
    case Precision::kFp32:
      break;
  }
  return torch::kFloat;
}

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "unknown";
}

NormImpl::NormImpl(const GptConfig& c)
    : d_model_(c.d_model), rms_(c.rms_norm), eps_(c.norm_eps) {
  weight_ = register_parameter("weight", torch::ones({c.d_model}));
  if (!rms_ && c.bias) bias_ = register_parameter("bias", torch::zeros({c.d_model}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  // What torch::nn::LayerNorm computes, to the bit.
  if (!rms_) return torch::layer_norm(x, {d_model_}, weight_, bias_, eps_);
  return RmsNorm(x, weight_, eps_);  // fused on CPU fp32 (rms_norm.h)
}

ModelShape ShapeOf(const GptConfig& c) {
  ModelShape shape;
  shape.n_layer = c.n_layer;
  shape.d_model = c.d_model;
  shape.n_head = c.n_head;
  shape.n_kv_head = KvHeads(c);
  shape.ffn_hidden = FfnHidden(c);
  shape.vocab_size = c.vocab_size;
  shape.seq_len = c.seq_len;
  shape.gated_mlp = c.gated_mlp;
  shape.bias = c.bias;
  shape.rms_norm = c.rms_norm;
  shape.learned_position_embedding = !c.rotary;
  shape.tied_embeddings = c.tied_embeddings;
  return shape;
}

int64_t GptParameterCount(const GptConfig& c) { return CountParameters(ShapeOf(c)).total; }

RotaryTables MakeRotaryTables(int64_t time, int64_t head_dim, double theta,
                              const torch::Tensor& like) {
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat).device(like.device());
  // inv_freq[i] = theta^(-2i / hd), i < hd / 2, computed in double as the
  // reference implementations do, then rounded once.
  const torch::Tensor inv_freq =
      torch::pow(theta, -torch::arange(0, head_dim, 2, fp32.dtype(torch::kDouble)) /
                            static_cast<double>(head_dim))
          .to(fp32);
  const torch::Tensor freqs = torch::outer(torch::arange(time, fp32), inv_freq);  // [T, hd/2]
  const torch::Tensor angles = torch::cat({freqs, freqs}, -1).view({time, 1, head_dim});
  return {angles.cos().to(like.scalar_type()), angles.sin().to(like.scalar_type())};
}

torch::Tensor ExpandQkv(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                        int64_t head_dim, bool rotary, double rope_theta) {
  if (!rotary && n_kv_head == n_head) return qkv;
  const int64_t batch = qkv.size(0), time = qkv.size(1);
  std::vector<torch::Tensor> parts =
      qkv.split_with_sizes({n_head * head_dim, n_kv_head * head_dim, n_kv_head * head_dim}, -1);
  torch::Tensor q = parts[0].view({batch, time, n_head, head_dim});
  torch::Tensor k = parts[1].view({batch, time, n_kv_head, head_dim});
  torch::Tensor v = parts[2].view({batch, time, n_kv_head, head_dim});
  if (rotary) {
    const RotaryTables tables = MakeRotaryTables(time, head_dim, rope_theta, q);
    q = ApplyRotary(q, tables);
    k = ApplyRotary(k, tables);
  }
  if (n_kv_head != n_head) {
    k = k.repeat_interleave(n_head / n_kv_head, /*dim=*/2);
    v = v.repeat_interleave(n_head / n_kv_head, /*dim=*/2);
  }
  // Back to the fused layout the attention kernel reads in place.
  return torch::cat(
      {q.reshape({batch, time, -1}), k.reshape({batch, time, -1}), v.reshape({batch, time, -1})},
      -1);
}

torch::Tensor AttendProjection(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                               int64_t head_dim, bool rotary, double rope_theta,
                               double dropout) {
#if TORCH_VERSION_MAJOR < 2
  if (dropout == 0.0) {
    torch::Tensor cos, sin;
    if (rotary) {
      const RotaryTables tables = MakeRotaryTables(qkv.size(1), head_dim, rope_theta, qkv);
      cos = tables.cos;
      sin = tables.sin;
    }
    if (GroupedCausalSelfAttentionSupports(qkv, n_head, n_kv_head, cos, sin)) {
      return GroupedCausalSelfAttention(qkv, n_head, n_kv_head, cos, sin);
    }
  }
#endif
  return CausalAttention(ExpandQkv(qkv, n_head, n_kv_head, head_dim, rotary, rope_theta), n_head,
                         dropout);
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const RotaryTables& tables) {
  const int64_t half = x.size(-1) / 2;
  // rotate_half: [x1, x2] -> [-x2, x1] over the two halves of the head.
  const torch::Tensor rotated =
      torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * tables.cos + rotated * tables.sin;
}

GptImpl::GptImpl(const GptConfig& config) : config_(config) {
  const absl::Status valid = ValidateGptConfig(config);
  TORCH_CHECK(valid.ok(), valid.ToString());
  wte_ = register_module("wte", torch::nn::Embedding(config.vocab_size, config.d_model));
  if (!config.rotary) {
    wpe_ = register_module("wpe", torch::nn::Embedding(config.seq_len, config.d_model));
  }
  drop_ = register_module("drop", torch::nn::Dropout(config.dropout));
  blocks_ = register_module("h", torch::nn::ModuleList());
  for (int i = 0; i < config.n_layer; ++i) blocks_->push_back(Block(config));
  ln_f_ = register_module("ln_f", Norm(config));
  if (!config.tied_embeddings) {
    lm_head_ = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(config.d_model, config.vocab_size)
                                         .bias(false)));
  }
  InitWeights();
}

void GptImpl::InitWeights() {
  torch::NoGradGuard no_grad;
  // GPT-2 section 2.3: scale the weights of residual layers by 1/sqrt(N),
  // N = number of residual layers = 2 per block.
  const double residual_std = kInitStd / std::sqrt(2.0 * config_.n_layer);
  // named_parameters() is in registration order, so the draws (and hence the
  // weights) depend only on the seed and the config.
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    torch::Tensor p = item.value();
    if (absl::EndsWith(name, "c_proj.weight")) {
      torch::nn::init::normal_(p, 0.0, residual_std);
    } else if (absl::EndsWith(name, "bias")) {
      torch::nn::init::zeros_(p);
    } else if (p.dim() >= 2) {
      torch::nn::init::normal_(p, 0.0, kInitStd);
    } else {
      torch::nn::init::ones_(p);  // LayerNorm gains
    }
  }
}

const torch::Tensor& GptImpl::HeadWeight() const {
  // Tied LM head (Press & Wolf 2017): logits = x @ wte^T.
  return config_.tied_embeddings ? wte_->weight : lm_head_->weight;
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  return torch::nn::functional::linear(Hidden(idx), HeadWeight());
}

torch::Tensor GptImpl::ForwardCached(const torch::Tensor& idx, KvCache* cache) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(idx.dim() == 2, "Gpt::ForwardCached expects idx [B, T], got ", idx.sizes());
  const int64_t offset = cache->length, time = idx.size(1);
  TORCH_CHECK(time >= 1 && offset + time <= config_.seq_len, "positions ", offset, "..",
              offset + time, " exceed seq_len ", config_.seq_len);
  const int n_layer = static_cast<int>(blocks_->size());
  if (cache->keys.empty()) {
    cache->keys.resize(n_layer);
    cache->values.resize(n_layer);
  }
  torch::Tensor x = torch::nn::functional::embedding(idx, wte_->weight);
  if (!config_.rotary) {
    x = x + wpe_(torch::arange(offset, offset + time, idx.options().dtype(torch::kLong)));
  }
  for (int i = 0; i < n_layer; ++i) {
    x = (*blocks_)[i]->as<BlockImpl>()->ForwardCached(x, offset, &cache->keys[i],
                                                      &cache->values[i]);
  }
  cache->length += time;
  return torch::nn::functional::linear(ln_f_(x.to(torch::kFloat)), HeadWeight());
}

torch::Tensor GptImpl::Loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  FusedLossOptions options;
  options.matmul_dtype = HeadMatmulDtype(config_, idx.is_cuda());
  return FusedLinearCrossEntropy(Hidden(idx), HeadWeight(), targets, options);
}

torch::Tensor GptImpl::Hidden(const torch::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "Gpt::forward expects idx [B, T], got ", idx.sizes());
  const int64_t time = idx.size(1);
  TORCH_CHECK(time >= 1 && time <= config_.seq_len, "sequence length ", time,
              " outside [1, ", config_.seq_len, "]");
  // Tied: the token embedding's gradient is sparse (the rows of this
  // batch): the LM head's dense gradient arrives first in backward, and
  // autograd adds the sparse rows into it in place, instead of zero-filling
  // and then adding a second dense [vocab, d] gradient. Untied, nothing
  // dense precedes it, so it is dense (the optimizer takes dense gradients).
  torch::Tensor tokens = torch::nn::functional::embedding(
      idx, wte_->weight,
      torch::nn::functional::EmbeddingFuncOptions().sparse(config_.tied_embeddings));
  torch::Tensor x = tokens;
  if (!config_.rotary) {
    torch::Tensor pos = torch::arange(time, idx.options().dtype(torch::kLong));
    x = x + wpe_(pos);  // [B,T,d] + [T,d]
  }
  x = drop_(x);
  {
    // Only the blocks run in lower precision; the residual stream they add
    // to stays fp32 (fp32 + bf16 promotes to fp32), so x is fp32 after each.
    std::optional<AutocastGuard> autocast;
    if (config_.precision == Precision::kBf16) {
      autocast.emplace(idx.is_cuda() ? c10::kCUDA : c10::kCPU,
                       AutocastState{true, torch::kBFloat16});
    }
    const int n_layer = static_cast<int>(blocks_->size());
    const int segment_blocks =
        torch::GradMode::is_enabled()
            ? CheckpointSegmentBlocks(n_layer, config_.activation_checkpointing)
            : 0;
    auto run_blocks = [this](int begin, int end, torch::Tensor h) {
      for (int i = begin; i < end; ++i) h = (*blocks_)[i]->as<BlockImpl>()->forward(h);
      return h;
    };
    if (segment_blocks == 0) {
      x = run_blocks(0, n_layer, x);
    } else {
      for (int begin = 0; begin < n_layer; begin += segment_blocks) {
        const int end = std::min(n_layer, begin + segment_blocks);
        std::vector<torch::Tensor> parameters;
        for (int i = begin; i < end; ++i) {
          for (const torch::Tensor& p : (*blocks_)[i]->parameters()) parameters.push_back(p);
        }
        // The segment holds `this`; the graph it is kept in lives no longer
        // than the caller keeps the loss, which must not outlive the model.
        x = CheckpointedForward(
            [run_blocks, begin, end](const torch::Tensor& h) { return run_blocks(begin, end, h); },
            x, parameters);
      }
    }
  }
  return ln_f_(x.to(torch::kFloat));
}

torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t vocab = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}),
                                              targets.reshape({-1}));
}

}  // namespace loom::engine
