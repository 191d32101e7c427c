#include "worker/engine/parallel/parallel_gpt.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/engine/activation_checkpoint.h"
#include "worker/engine/autocast.h"
#include "worker/engine/ops/causal_attention.h"
#include "worker/engine/ops/gelu.h"
#include "worker/engine/gpt.h"
#include "worker/engine/ops/swiglu.h"

namespace loom::engine {

namespace F = torch::nn::functional;

// A weight [out, in] and optional bias [out]: the parameters of one
// (sharded) linear layer, named like torch::nn::Linear's.
class ShardedLinearImpl : public torch::nn::Module {
 public:
  ShardedLinearImpl(int64_t out, int64_t in, bool bias) {
    weight = register_parameter("weight", torch::empty({out, in}));
    if (bias) this->bias = register_parameter("bias", torch::empty({out}));
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(ShardedLinear);

// Gpt's block with its attention and MLP sublayers column-parallel in
// (c_attn; c_fc and SwiGLU's c_up) and row-parallel out (c_proj, whose bias,
// if any, is replicated and added once after the sum over the group). Each
// rank runs its share of the query heads with the key/value heads they use
// (grouped-query attention; ValidateTensorParallel), copies of them when
// there are fewer key/value heads than ranks (KeyValueCopies), whose
// gradients backward sums over the copies.
class TensorParallelBlockImpl : public torch::nn::Module {
 public:
  TensorParallelBlockImpl(const GptConfig& c, int tp, c10d::ProcessGroup* group)
      : config_(c),
        group_(group),
        tp_rank_(group == nullptr ? 0 : group->getRank()),
        local_heads_(c.n_head / tp),
        local_kv_heads_(LocalKeyValueHeads(c, tp)),
        head_dim_(c.d_model / c.n_head),
        rotary_(c.rotary),
        rope_theta_(c.rope_theta),
        gated_(c.gated_mlp),
        dropout_(c.dropout) {
    const int64_t d = c.d_model, f = FfnHidden(c);
    const int64_t qkv = (local_heads_ + 2 * local_kv_heads_) * head_dim_;
    ln_1_ = register_module("ln_1", Norm(c));
    attn_ = register_module("attn", std::make_shared<torch::nn::Module>());
    c_attn_ = attn_->register_module("c_attn", ShardedLinear(qkv, d, c.bias));
    attn_proj_ = attn_->register_module("c_proj", ShardedLinear(d, d / tp, c.bias));
    ln_2_ = register_module("ln_2", Norm(c));
    mlp_ = register_module("mlp", std::make_shared<torch::nn::Module>());
    c_fc_ = mlp_->register_module("c_fc", ShardedLinear(f / tp, d, c.bias));
    if (gated_) c_up_ = mlp_->register_module("c_up", ShardedLinear(f / tp, d, c.bias));
    mlp_proj_ = mlp_->register_module("c_proj", ShardedLinear(d, f / tp, c.bias));
    resid_drop_ = register_module("resid_drop", torch::nn::Dropout(c.dropout));
  }

  torch::Tensor forward(torch::Tensor x) {
    {
      const torch::Tensor in = CopyToTensorParallelRegion(ln_1_(x), group_);
      torch::Tensor bias = c_attn_->bias;
      if (bias.defined()) {
        bias = SumKeyValueReplicaGradients(bias, "attn.c_attn.bias", config_, tp_rank_, group_);
      }
      const torch::Tensor weight = SumKeyValueReplicaGradients(
          c_attn_->weight, "attn.c_attn.weight", config_, tp_rank_, group_);
      const double dropout = is_training() ? dropout_ : 0.0;
      const torch::Tensor y =
          AttendProjection(F::linear(in, weight, bias), local_heads_, local_kv_heads_, head_dim_,
                           rotary_, rope_theta_, dropout);
      x = x + resid_drop_(RowParallelOut(y, attn_proj_));
    }
    const torch::Tensor in = CopyToTensorParallelRegion(ln_2_(x), group_);
    const torch::Tensor h =
        gated_ ? SwiGlu(F::linear(in, c_fc_->weight, c_fc_->bias),
                        F::linear(in, c_up_->weight, c_up_->bias))
               : GeluTanh(F::linear(in, c_fc_->weight, c_fc_->bias));
    return x + resid_drop_(RowParallelOut(h, mlp_proj_));
  }

 private:
  torch::Tensor RowParallelOut(const torch::Tensor& in, const ShardedLinear& proj) {
    const torch::Tensor sum = ReduceFromTensorParallelRegion(F::linear(in, proj->weight), group_);
    return proj->bias.defined() ? sum + proj->bias : sum;
  }

  GptConfig config_;
  c10d::ProcessGroup* group_;
  int tp_rank_;
  int64_t local_heads_, local_kv_heads_, head_dim_;
  bool rotary_;
  double rope_theta_;
  bool gated_;
  double dropout_;
  Norm ln_1_{nullptr}, ln_2_{nullptr};
  std::shared_ptr<torch::nn::Module> attn_, mlp_;
  ShardedLinear c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, c_up_{nullptr},
      mlp_proj_{nullptr};
  torch::nn::Dropout resid_drop_{nullptr};
};

std::vector<std::pair<std::string, std::vector<int64_t>>> GptParameterShapes(
    const GptConfig& c) {
  const int64_t v = c.vocab_size, s = c.seq_len, d = c.d_model, f = FfnHidden(c);
  const int64_t qkv = d + 2 * KvHeads(c) * (d / c.n_head);
  const bool norm_bias = !c.rms_norm && c.bias;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"wte.weight", {v, d}}};
  if (!c.rotary) shapes.push_back({"wpe.weight", {s, d}});
  // Gpt's registration order (gpt.cc): per block ln_1, attn (c_attn,
  // c_proj), ln_2, mlp (c_fc, c_up, c_proj); a weight before its bias.
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    shapes.push_back({name + ".weight", {out, in}});
    if (c.bias) shapes.push_back({name + ".bias", {out}});
  };
  auto norm = [&](const std::string& name) {
    shapes.push_back({name + ".weight", {d}});
    if (norm_bias) shapes.push_back({name + ".bias", {d}});
  };
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string h = absl::StrCat("h.", i, ".");
    norm(h + "ln_1");
    linear(h + "attn.c_attn", qkv, d);
    linear(h + "attn.c_proj", d, d);
    norm(h + "ln_2");
    linear(h + "mlp.c_fc", f, d);
    if (c.gated_mlp) linear(h + "mlp.c_up", f, d);
    linear(h + "mlp.c_proj", d, f);
  }
  norm("ln_f");
  if (!c.tied_embeddings) shapes.push_back({"lm_head.weight", {v, d}});
  return shapes;
}

double LastStageExtraBlocks(const GptConfig& c) {
  return static_cast<double>(c.vocab_size) / (12.0 * c.d_model + 2.0 * c.seq_len);
}

GptPartition PartitionFor(const GptConfig& config, const ParallelLayout& layout,
                          const RankCoordinates& coordinates,
                          const std::vector<int>& stage_layers) {
  absl::StatusOr<std::vector<int>> split = stage_layers;
  if (stage_layers.empty()) {
    split = SplitLayers(config.n_layer, layout.pipeline, 0.0, LastStageExtraBlocks(config));
  } else {
    int sum = 0;
    for (int blocks : stage_layers) {
      TORCH_CHECK(blocks >= 1, "stage_layers: every stage needs a block");
      sum += blocks;
    }
    TORCH_CHECK(static_cast<int>(stage_layers.size()) == layout.pipeline && sum == config.n_layer,
                "stage_layers: ", stage_layers.size(), " stages summing to ", sum, " for ",
                layout.pipeline, " stages of ", config.n_layer, " blocks");
  }
  TORCH_CHECK(split.ok(), split.status().ToString());
  GptPartition p;
  p.tp_rank = coordinates.tp;
  p.tp_size = layout.tensor;
  p.first_block = FirstBlockOfStage(*split, coordinates.pp);
  p.end_block = p.first_block + (*split)[coordinates.pp];
  p.embedding = coordinates.pp == 0;
  p.head = coordinates.pp == layout.pipeline - 1;
  return p;
}

ParallelGptImpl::ParallelGptImpl(const GptConfig& config, const GptPartition& partition,
                                 std::shared_ptr<c10d::ProcessGroup> tensor_group)
    : config_(config), partition_(partition), tensor_group_(std::move(tensor_group)) {
  if (partition_.end_block < 0) partition_.end_block = config.n_layer;
  for (const absl::Status& s :
       {ValidateGptConfig(config), ValidateTensorParallel(config, partition_.tp_size)}) {
    TORCH_CHECK(s.ok(), s.ToString());
  }
  TORCH_CHECK(0 <= partition_.tp_rank && partition_.tp_rank < partition_.tp_size,
              "tp_rank ", partition_.tp_rank, " outside [0, ", partition_.tp_size, ")");
  TORCH_CHECK(0 <= partition_.first_block && partition_.first_block < partition_.end_block &&
                  partition_.end_block <= config.n_layer,
              "blocks [", partition_.first_block, ", ", partition_.end_block,
              ") not a non-empty range of [0, ", config.n_layer, ")");
  const int group_size = tensor_group_ ? tensor_group_->getSize() : 1;
  TORCH_CHECK(group_size == partition_.tp_size, "tensor group has ", group_size,
              " ranks, partition says ", partition_.tp_size);
  const int64_t d = config.d_model;
  vocab_ = VocabRangeOf(config.vocab_size, partition_.tp_rank, partition_.tp_size);
  if (partition_.embedding || (partition_.head && config.tied_embeddings)) {
    wte_ = register_module("wte", std::make_shared<torch::nn::Module>())
               ->register_parameter("weight", torch::empty({vocab_.end - vocab_.begin, d}));
  }
  if (partition_.embedding && !config.rotary) {
    wpe_ = register_module("wpe", std::make_shared<torch::nn::Module>())
               ->register_parameter("weight", torch::empty({config.seq_len, d}));
  }
  auto h = register_module("h", std::make_shared<torch::nn::Module>());
  for (int i = partition_.first_block; i < partition_.end_block; ++i) {
    blocks_.push_back(h->register_module(
        std::to_string(i), std::make_shared<TensorParallelBlockImpl>(
                               config, partition_.tp_size, tensor_group_.get())));
  }
  if (partition_.head) {
    ln_f_ = register_module("ln_f", Norm(config));
    if (!config.tied_embeddings) {
      lm_head_ = register_module("lm_head", std::make_shared<torch::nn::Module>())
                     ->register_parameter("weight", torch::empty({vocab_.end - vocab_.begin, d}));
    }
  }
  InitLikeGpt();
}

torch::Tensor ParallelGptImpl::Parameter(const std::string& name) const {
  const torch::OrderedDict<std::string, torch::Tensor> all = named_parameters(/*recurse=*/true);
  const torch::Tensor* p = all.find(name);
  TORCH_CHECK(p != nullptr, "ParallelGpt holds no parameter ", name);
  return *p;  // shares storage with the parameter
}

void ParallelGptImpl::InitLikeGpt() {
  torch::NoGradGuard no_grad;
  const GptConfig& c = config_;
  const int64_t d = c.d_model;
  // 1. Gpt's modules draw their default initialisation as they are built
  //    (Embedding: normal; Linear: Kaiming-uniform weight, uniform bias):
  //    build the same modules in the same order and drop them.
  const int64_t f = FfnHidden(c), qkv = d + 2 * KvHeads(c) * (d / c.n_head);
  auto linear = [&](int64_t in, int64_t out, bool bias) {
    torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  { torch::nn::Embedding(c.vocab_size, d); }
  if (!c.rotary) torch::nn::Embedding(c.seq_len, d);
  for (int i = 0; i < c.n_layer; ++i) {
    linear(d, qkv, c.bias);
    linear(d, d, c.bias);
    linear(d, f, c.bias);
    if (c.gated_mlp) linear(d, f, c.bias);
    linear(f, d, c.bias);
  }
  if (!c.tied_embeddings) linear(d, c.vocab_size, false);
  // 2. Gpt::InitWeights, over the full model's parameters in order.
  const double std_default = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * c.n_layer);
  const torch::OrderedDict<std::string, torch::Tensor> mine = named_parameters(true);
  for (const auto& [name, shape] : GptParameterShapes(c)) {
    const bool held = mine.contains(name);
    torch::Tensor full;
    if (absl::EndsWith(name, "c_proj.weight")) {
      full = torch::empty(shape).normal_(0.0, std_residual);
    } else if (absl::EndsWith(name, "bias")) {
      if (held) full = torch::zeros(shape);
    } else if (shape.size() >= 2) {
      full = torch::empty(shape).normal_(0.0, std_default);
    } else if (held) {
      full = torch::ones(shape);
    }
    if (!held) continue;
    Parameter(name).copy_(
        ShardForTensorParallel(name, full, c, partition_.tp_rank, partition_.tp_size));
  }
}

torch::Tensor ParallelGptImpl::Embed(const torch::Tensor& idx) {
  TORCH_CHECK(partition_.embedding, "Embed on a stage without the embedding");
  TORCH_CHECK(idx.dim() == 2, "Embed expects idx [B, T], got ", idx.sizes());
  const int64_t time = idx.size(1);
  TORCH_CHECK(time >= 1 && time <= config_.seq_len, "sequence length ", time, " outside [1, ",
              config_.seq_len, "]");
  torch::Tensor x = VocabParallelEmbedding(idx, wte_, vocab_, tensor_group_.get());
  if (!config_.rotary) {
    x = x + F::embedding(torch::arange(time, idx.options().dtype(torch::kLong)), wpe_);
  }
  return F::dropout(x, F::DropoutFuncOptions().p(config_.dropout).training(is_training()));
}

torch::Tensor ParallelGptImpl::Blocks(const torch::Tensor& input) {
  std::optional<AutocastGuard> autocast;
  if (config_.precision == Precision::kBf16) {
    autocast.emplace(input.is_cuda() ? c10::kCUDA : c10::kCPU,
                     AutocastState{true, torch::kBFloat16});
  }
  const int n = static_cast<int>(blocks_.size());
  const int segment_blocks = torch::GradMode::is_enabled()
                                 ? CheckpointSegmentBlocks(n, config_.activation_checkpointing)
                                 : 0;
  auto run = [this](int begin, int end, torch::Tensor h) {
    for (int i = begin; i < end; ++i) h = blocks_[i]->forward(h);
    return h;
  };
  torch::Tensor x = input;
  if (segment_blocks == 0) {
    x = run(0, n, x);
  } else {
    for (int begin = 0; begin < n; begin += segment_blocks) {
      const int end = std::min(n, begin + segment_blocks);
      std::vector<torch::Tensor> parameters;
      for (int i = begin; i < end; ++i) {
        for (const torch::Tensor& p : blocks_[i]->parameters()) parameters.push_back(p);
      }
      // The recompute replays the blocks' collectives in backward, in the
      // same order on every rank of the group.
      x = CheckpointedForward([run, begin, end](const torch::Tensor& h) { return run(begin, end, h); },
                              x, parameters);
    }
  }
  return x.to(torch::kFloat);
}

torch::Tensor ParallelGptImpl::HeadLoss(const torch::Tensor& x, const torch::Tensor& targets) {
  TORCH_CHECK(partition_.head, "HeadLoss on a stage without the LM head");
  const torch::Tensor h = ln_f_(x.to(torch::kFloat));
  return VocabParallelCrossEntropy(h.reshape({-1, config_.d_model}),
                                   config_.tied_embeddings ? wte_ : lm_head_,
                                   targets.reshape({-1}), vocab_, tensor_group_.get(),
                                   HeadMatmulDtype(config_, h.is_cuda()));
}

torch::Tensor ParallelGptImpl::Loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  TORCH_CHECK(partition_.embedding && partition_.head, "Loss needs the whole model on one stage");
  return HeadLoss(Blocks(Embed(idx)), targets);
}

}  // namespace loom::engine
