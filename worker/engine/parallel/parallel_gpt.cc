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
#include "worker/engine/causal_attention.h"
#include "worker/engine/gelu.h"
#include "worker/engine/gpt.h"

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

// Gpt's attention or MLP sublayer, column-parallel in (`in`: c_attn or
// c_fc), row-parallel out (`out`: c_proj, whose bias is replicated and added
// once after the sum over the group).
class TensorParallelBlockImpl : public torch::nn::Module {
 public:
  TensorParallelBlockImpl(const GptConfig& c, int tp, c10d::ProcessGroup* group)
      : group_(group), local_heads_(c.n_head / tp), dropout_(c.dropout) {
    const int64_t d = c.d_model;
    auto norm = torch::nn::LayerNormOptions({d}).eps(1e-5);
    ln_1_ = register_module("ln_1", torch::nn::LayerNorm(norm));
    attn_ = register_module("attn", std::make_shared<torch::nn::Module>());
    c_attn_ = attn_->register_module("c_attn", ShardedLinear(3 * d / tp, d, true));
    attn_proj_ = attn_->register_module("c_proj", ShardedLinear(d, d / tp, true));
    ln_2_ = register_module("ln_2", torch::nn::LayerNorm(norm));
    mlp_ = register_module("mlp", std::make_shared<torch::nn::Module>());
    c_fc_ = mlp_->register_module("c_fc", ShardedLinear(4 * d / tp, d, true));
    mlp_proj_ = mlp_->register_module("c_proj", ShardedLinear(d, 4 * d / tp, true));
    resid_drop_ = register_module("resid_drop", torch::nn::Dropout(c.dropout));
  }

  torch::Tensor forward(torch::Tensor x) {
    {
      const torch::Tensor in = CopyToTensorParallelRegion(ln_1_(x), group_);
      const torch::Tensor qkv = F::linear(in, c_attn_->weight, c_attn_->bias);
      const double dropout = is_training() ? dropout_ : 0.0;
      const torch::Tensor y = CausalAttention(qkv, local_heads_, dropout);
      const torch::Tensor out =
          ReduceFromTensorParallelRegion(F::linear(y, attn_proj_->weight), group_) +
          attn_proj_->bias;
      x = x + resid_drop_(out);
    }
    const torch::Tensor in = CopyToTensorParallelRegion(ln_2_(x), group_);
    const torch::Tensor h = GeluTanh(F::linear(in, c_fc_->weight, c_fc_->bias));
    const torch::Tensor out =
        ReduceFromTensorParallelRegion(F::linear(h, mlp_proj_->weight), group_) +
        mlp_proj_->bias;
    return x + resid_drop_(out);
  }

 private:
  c10d::ProcessGroup* group_;
  int64_t local_heads_;
  double dropout_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  std::shared_ptr<torch::nn::Module> attn_, mlp_;
  ShardedLinear c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, mlp_proj_{nullptr};
  torch::nn::Dropout resid_drop_{nullptr};
};

std::vector<std::pair<std::string, std::vector<int64_t>>> GptParameterShapes(
    const GptConfig& c) {
  const int64_t v = c.vocab_size, s = c.seq_len, d = c.d_model;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"wte.weight", {v, d}},
                                                                      {"wpe.weight", {s, d}}};
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string h = absl::StrCat("h.", i, ".");
    for (auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln_1.weight", {d}},
             {"ln_1.bias", {d}},
             {"attn.c_attn.weight", {3 * d, d}},
             {"attn.c_attn.bias", {3 * d}},
             {"attn.c_proj.weight", {d, d}},
             {"attn.c_proj.bias", {d}},
             {"ln_2.weight", {d}},
             {"ln_2.bias", {d}},
             {"mlp.c_fc.weight", {4 * d, d}},
             {"mlp.c_fc.bias", {4 * d}},
             {"mlp.c_proj.weight", {d, 4 * d}},
             {"mlp.c_proj.bias", {d}}}) {
      shapes.emplace_back(h + name, shape);
    }
  }
  shapes.push_back({"ln_f.weight", {d}});
  shapes.push_back({"ln_f.bias", {d}});
  return shapes;
}

double LastStageExtraBlocks(const GptConfig& c) {
  return static_cast<double>(c.vocab_size) / (12.0 * c.d_model + 2.0 * c.seq_len);
}

GptPartition PartitionFor(const GptConfig& config, const ParallelLayout& layout,
                          const RankCoordinates& coordinates) {
  const absl::StatusOr<std::vector<int>> split =
      SplitLayers(config.n_layer, layout.pipeline, 0.0, LastStageExtraBlocks(config));
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
  if (partition_.embedding || partition_.head) {
    wte_ = register_module("wte", std::make_shared<torch::nn::Module>())
               ->register_parameter("weight", torch::empty({vocab_.end - vocab_.begin, d}));
  }
  if (partition_.embedding) {
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
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(1e-5)));
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
  { torch::nn::Embedding(c.vocab_size, d); }
  { torch::nn::Embedding(c.seq_len, d); }
  for (int i = 0; i < c.n_layer; ++i) {
    { torch::nn::Linear(d, 3 * d); }
    { torch::nn::Linear(d, d); }
    { torch::nn::Linear(d, 4 * d); }
    { torch::nn::Linear(4 * d, d); }
  }
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
  const torch::Tensor pos = torch::arange(time, idx.options().dtype(torch::kLong));
  const torch::Tensor x =
      VocabParallelEmbedding(idx, wte_, vocab_, tensor_group_.get()) + F::embedding(pos, wpe_);
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
  return VocabParallelCrossEntropy(h.reshape({-1, config_.d_model}), wte_, targets.reshape({-1}),
                                   vocab_, tensor_group_.get());
}

torch::Tensor ParallelGptImpl::Loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  TORCH_CHECK(partition_.embedding && partition_.head, "Loss needs the whole model on one stage");
  return HeadLoss(Blocks(Embed(idx)), targets);
}

}  // namespace loom::engine
