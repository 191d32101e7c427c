#include "controller/slow_ranks/stage_split.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec_model.h"
#include "common/parallel_layout.h"

namespace loom::controller {

double LastStageExtraBlocks(const loom::v1::JobSpec& spec) {
  const loom::v1::GptModel gpt = EffectiveDecoder(spec.model());
  return static_cast<double>(gpt.vocab_size()) / (12.0 * gpt.d_model() + 2.0 * gpt.seq_len());
}

std::vector<int> EvenSplit(const loom::v1::JobSpec& spec) {
  const int stages = std::max(1, spec.parallelism().pipeline());
  absl::StatusOr<std::vector<int>> split = SplitLayers(EffectiveDecoder(spec.model()).n_layer(),
                                                       stages, 0.0, LastStageExtraBlocks(spec));
  return split.ok() ? *split : std::vector<int>();
}

std::string DescribeSplit(const std::vector<int>& split) {
  return absl::StrCat("stages ", absl::StrJoin(split, "+"), " blocks");
}

std::vector<std::pair<std::string, int>> NodeStagesOf(const JobRecord& rec) {
  std::vector<std::pair<std::string, int>> out;
  for (const loom::v1::RankAssignment& a : rec.job.ranks()) out.push_back({a.node(), a.pp()});
  return out;
}

std::string StageSplitText(const JobRecord& rec, const std::vector<int>& split) {
  return DescribeSplit(split.empty() ? EvenSplit(rec.job.spec()) : split);
}

std::vector<int> StageLayersForPlacement(
    const JobRecord& rec, const std::vector<std::pair<std::string, int>>& node_stage) {
  const loom::v1::JobSpec& spec = rec.job.spec();
  const int stages = spec.parallelism().pipeline();
  if (stages <= 1 || rec.node_slowdown.empty()) return {};
  std::vector<double> factor(stages, 1.0);
  bool slow = false;
  for (const auto& [node, stage] : node_stage) {
    auto it = rec.node_slowdown.find(node);
    if (it == rec.node_slowdown.end() || stage < 0 || stage >= stages) continue;
    factor[stage] = std::max(factor[stage], it->second);
    slow = true;
  }
  if (!slow) return {};
  absl::StatusOr<std::vector<int>> split = SplitLayers(
      EffectiveDecoder(spec.model()).n_layer(), stages, 0.0, LastStageExtraBlocks(spec), factor);
  return split.ok() ? *split : std::vector<int>();
}

}  // namespace loom::controller
