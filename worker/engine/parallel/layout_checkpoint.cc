#include "worker/engine/parallel/layout_checkpoint.h"

#include <array>
#include <map>
#include <string>
#include <vector>

#include <torch/optim/adamw.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/engine/fused_adamw_torch.h"
#include "worker/engine/optimizer_state_key.h"
#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {
namespace {

constexpr int kGatherTag = 0x12c;

// Whether the rank holding `partition` holds the full-model parameter `name`.
bool Holds(const GptPartition& partition, const std::string& name) {
  if (name == "wte.weight") return partition.embedding || partition.head;
  if (absl::StartsWith(name, "wpe.")) return partition.embedding;
  if (absl::StartsWith(name, "ln_f.")) return partition.head;
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  int block = -1;
  if (parts.size() > 1 && parts[0] == "h" && absl::SimpleAtoi(parts[1], &block)) {
    return block >= partition.first_block && block < partition.end_block;
  }
  return false;
}

}  // namespace

void GatherFullState(ParallelGptImpl& model, const ShardedAdamW& optimizer,
                     const ParallelGroups& groups, torch::nn::Module* full_model,
                     torch::optim::Optimizer* full_optimizer) {
  torch::NoGradGuard no_grad;
  const GptConfig& config = model.config();
  const ParallelLayout& layout = groups.layout;
  const int me = groups.rank;
  TORCH_CHECK((me == 0) == (full_model != nullptr && full_optimizer != nullptr),
              "GatherFullState: world rank 0, and only it, passes the whole model");
  torch::Tensor exp_avg, exp_avg_sq;
  optimizer.GatherMoments(&exp_avg, &exp_avg_sq);
  std::map<std::string, std::array<torch::Tensor, 3>> local;
  const std::vector<ShardedParameter>& parameters = optimizer.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const torch::Tensor& p = parameters[i].tensor;
    const int64_t offset = optimizer.offset_of(i);
    local[parameters[i].name] = {p.detach(),
                                 exp_avg.narrow(0, offset, p.numel()).view(p.sizes()),
                                 exp_avg_sq.narrow(0, offset, p.numel()).view(p.sizes())};
  }
  std::vector<GptPartition> stages;
  for (int s = 0; s < layout.pipeline; ++s) {
    stages.push_back(PartitionFor(config, layout, {0, s, 0}));
  }
  torch::OrderedDict<std::string, torch::Tensor> full_parameters;
  if (full_model != nullptr) full_parameters = full_model->named_parameters();
  const int64_t step = optimizer.step_count();

  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  std::vector<torch::Tensor> in_flight;  // kept alive until the sends finish
  for (const auto& [name, shape] : GptParameterShapes(config)) {
    int owner = 0;
    while (owner < layout.pipeline && !Holds(stages[owner], name)) ++owner;
    TORCH_CHECK(owner < layout.pipeline, "no stage holds ", name);
    std::vector<std::array<torch::Tensor, 3>> parts(layout.tensor);
    for (int tp = 0; tp < layout.tensor; ++tp) {
      const int source = RankOf(layout, {0, owner, tp});
      if (source == me && me != 0) {
        for (const torch::Tensor& t : local.at(name)) {
          std::vector<torch::Tensor> message = {t.contiguous()};
          in_flight.push_back(message[0]);
          sends.push_back(groups.world->send(message, 0, kGatherTag));
        }
      } else if (me == 0) {
        if (source == 0) {
          parts[tp] = local.at(name);
          continue;
        }
        const std::vector<int64_t> part_shape =
            TensorParallelShardShape(name, shape, tp, layout.tensor);
        for (torch::Tensor& t : parts[tp]) {
          std::vector<torch::Tensor> message = {torch::empty(part_shape)};
          groups.world->recv(message, source, kGatherTag)->wait();
          t = message[0];
        }
      }
    }
    if (me != 0) continue;
    std::array<torch::Tensor, 3> merged;
    for (int k = 0; k < 3; ++k) {
      std::vector<torch::Tensor> shards;
      for (const auto& part : parts) shards.push_back(part[k]);
      merged[k] = MergeTensorParallelShards(name, shards, config);
    }
    torch::Tensor* target = full_parameters.find(name);
    TORCH_CHECK(target != nullptr, "the whole model has no parameter ", name);
    target->copy_(merged[0]);
    if (step > 0) {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(step);
      state->exp_avg(merged[1].clone());
      state->exp_avg_sq(merged[2].clone());
      full_optimizer->state()[StateKeyOf(*target)] = std::move(state);
    } else {
      full_optimizer->state().erase(StateKeyOf(*target));
    }
  }
  for (auto& work : sends) work->wait();
}

void ScatterFullState(const torch::nn::Module& full_model,
                      const torch::optim::Optimizer& full_optimizer, ParallelGptImpl& model,
                      ShardedAdamW& optimizer) {
  torch::NoGradGuard no_grad;
  const GptConfig& config = model.config();
  const GptPartition& partition = model.partition();
  const torch::OrderedDict<std::string, torch::Tensor> full = full_model.named_parameters();
  auto shard = [&](const std::string& name, const torch::Tensor& whole) {
    return ShardForTensorParallel(name, whole, config, partition.tp_rank, partition.tp_size);
  };
  torch::Tensor exp_avg = torch::zeros({optimizer.total_elements()});
  torch::Tensor exp_avg_sq = torch::zeros({optimizer.total_elements()});
  int64_t step = 0;
  const std::vector<ShardedParameter>& parameters = optimizer.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const std::string& name = parameters[i].name;
    const torch::Tensor* whole = full.find(name);
    TORCH_CHECK(whole != nullptr, "the checkpoint's model has no parameter ", name);
    torch::Tensor p = parameters[i].tensor;
    p.copy_(shard(name, *whole));
    const torch::optim::AdamWParamState* state = FindAdamWState(full_optimizer, *whole);
    if (state == nullptr) continue;
    step = std::max<int64_t>(step, state->step());
    const int64_t offset = optimizer.offset_of(i);
    exp_avg.narrow(0, offset, p.numel()).copy_(shard(name, state->exp_avg()).reshape({-1}));
    exp_avg_sq.narrow(0, offset, p.numel()).copy_(shard(name, state->exp_avg_sq()).reshape({-1}));
  }
  optimizer.LoadMoments(exp_avg, exp_avg_sq, step);
}

}  // namespace loom::engine
