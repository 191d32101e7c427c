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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/activation_checkpoint.h"
#include "worker/engine/autocast.h"
#include "worker/engine/causal_attention.h"
#include "worker/engine/fused_loss.h"
#include "worker/engine/gelu.h"

namespace loom::engine {
namespace {

constexpr double kInitStd = 0.02;

// Causal multi-head self-attention (Vaswani et al. 2017, eq. 1, with the
// future positions masked to -inf before the softmax).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& c)
      : n_head_(c.n_head) {
    c_attn_ = register_module("c_attn", torch::nn::Linear(c.d_model, 3 * c.d_model));
    c_proj_ = register_module("c_proj", torch::nn::Linear(c.d_model, c.d_model));
    attn_drop_ = register_module("attn_drop", torch::nn::Dropout(c.dropout));
    resid_drop_ = register_module("resid_drop", torch::nn::Dropout(c.dropout));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor qkv = c_attn_(x);  // [B, T, 3d]
    const double dropout = is_training() ? attn_drop_->options.p() : 0.0;
    // SDPA on LibTorch 2.x; Loom's blocked kernel on 1.13 (causal_attention.h).
    const torch::Tensor y = CausalAttention(qkv, n_head_, dropout);
    return resid_drop_(c_proj_(y));
  }

 private:
  int64_t n_head_;
  torch::nn::Linear c_attn_{nullptr}, c_proj_{nullptr};
  torch::nn::Dropout attn_drop_{nullptr}, resid_drop_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

// Position-wise MLP, d -> 4d -> d, with the tanh approximation of GELU
// (Hendrycks & Gimpel 2016, section 2), as in GPT-2.
class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const GptConfig& c) {
    c_fc_ = register_module("c_fc", torch::nn::Linear(c.d_model, 4 * c.d_model));
    c_proj_ = register_module("c_proj", torch::nn::Linear(4 * c.d_model, c.d_model));
    drop_ = register_module("drop", torch::nn::Dropout(c.dropout));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return drop_(c_proj_(GeluTanh(c_fc_(x))));
  }

 private:
  torch::nn::Linear c_fc_{nullptr}, c_proj_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(Mlp);

// Pre-LayerNorm residual block (GPT-2 section 2.3):
//   x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& c) {
    ln_1_ = register_module("ln_1", torch::nn::LayerNorm(LayerNormOptions(c)));
    attn_ = register_module("attn", CausalSelfAttention(c));
    ln_2_ = register_module("ln_2", torch::nn::LayerNorm(LayerNormOptions(c)));
    mlp_ = register_module("mlp", Mlp(c));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x + attn_(ln_1_(x));
    return x + mlp_(ln_2_(x));
  }

  static torch::nn::LayerNormOptions LayerNormOptions(const GptConfig& c) {
    return torch::nn::LayerNormOptions({c.d_model}).eps(1e-5);
  }

 private:
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
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

int64_t GptParameterCount(const GptConfig& c) {
  const int64_t v = c.vocab_size, s = c.seq_len, d = c.d_model, l = c.n_layer;
  return v * d + s * d + l * (12 * d * d + 13 * d) + 2 * d;
}

GptImpl::GptImpl(const GptConfig& config) : config_(config) {
  const absl::Status valid = ValidateGptConfig(config);
  TORCH_CHECK(valid.ok(), valid.ToString());
  wte_ = register_module("wte", torch::nn::Embedding(config.vocab_size, config.d_model));
  wpe_ = register_module("wpe", torch::nn::Embedding(config.seq_len, config.d_model));
  drop_ = register_module("drop", torch::nn::Dropout(config.dropout));
  blocks_ = register_module("h", torch::nn::ModuleList());
  for (int i = 0; i < config.n_layer; ++i) blocks_->push_back(Block(config));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(BlockImpl::LayerNormOptions(config)));
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

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  // Tied LM head (Press & Wolf 2017): logits = x @ wte^T.
  return torch::nn::functional::linear(Hidden(idx), wte_->weight);
}

torch::Tensor GptImpl::Loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  return FusedLinearCrossEntropy(Hidden(idx), wte_->weight, targets);
}

torch::Tensor GptImpl::Hidden(const torch::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "Gpt::forward expects idx [B, T], got ", idx.sizes());
  const int64_t time = idx.size(1);
  TORCH_CHECK(time >= 1 && time <= config_.seq_len, "sequence length ", time,
              " outside [1, ", config_.seq_len, "]");
  torch::Tensor pos = torch::arange(time, idx.options().dtype(torch::kLong));
  // The token embedding's gradient is sparse (the rows of this batch): the
  // tied LM head's dense gradient arrives first in backward, and autograd
  // adds the sparse rows into it in place, instead of zero-filling and then
  // adding a second dense [vocab, d] gradient.
  torch::Tensor tokens = torch::nn::functional::embedding(
      idx, wte_->weight, torch::nn::functional::EmbeddingFuncOptions().sparse(true));
  torch::Tensor x = drop_(tokens + wpe_(pos));  // [B,T,d] + [T,d]
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
