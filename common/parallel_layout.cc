#include "common/parallel_layout.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"

namespace loom {

std::string LayoutName(const ParallelLayout& layout) {
  return absl::StrCat("dp", layout.data, " x pp", layout.pipeline, " x tp", layout.tensor);
}

absl::Status ValidateLayout(const ParallelLayout& layout, int world_size) {
  const struct {
    const char* field;
    int value;
  } degrees[] = {{"parallelism.data", layout.data},
                 {"parallelism.tensor", layout.tensor},
                 {"parallelism.pipeline", layout.pipeline}};
  for (const auto& d : degrees) {
    if (d.value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(d.field, " must be >= 1, got ", d.value));
    }
  }
  // Overflow-safe product check: each degree is at most world_size.
  const int64_t product =
      int64_t{layout.data} * int64_t{layout.tensor} * int64_t{layout.pipeline};
  if (product != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism: data x pipeline x tensor = ", layout.data, " x ", layout.pipeline, " x ",
        layout.tensor, " = ", product, " ranks, but the job has ", world_size));
  }
  return absl::OkStatus();
}

RankCoordinates CoordinatesOf(const ParallelLayout& layout, int rank) {
  if (rank < 0 || rank >= layout.world_size()) std::abort();
  RankCoordinates c;
  c.tp = rank % layout.tensor;
  c.pp = (rank / layout.tensor) % layout.pipeline;
  c.dp = rank / (layout.tensor * layout.pipeline);
  return c;
}

int RankOf(const ParallelLayout& layout, const RankCoordinates& c) {
  if (c.dp < 0 || c.dp >= layout.data || c.pp < 0 || c.pp >= layout.pipeline || c.tp < 0 ||
      c.tp >= layout.tensor) {
    std::abort();
  }
  return (c.dp * layout.pipeline + c.pp) * layout.tensor + c.tp;
}

namespace {

// Members of `rank`'s group of `kind`: vary that kind's coordinate, keep the
// other two.
std::vector<int> GroupOf(const ParallelLayout& layout, int rank, GroupKind kind) {
  const RankCoordinates mine = CoordinatesOf(layout, rank);
  std::vector<int> members;
  const int degree = kind == GroupKind::kTensor     ? layout.tensor
                     : kind == GroupKind::kPipeline ? layout.pipeline
                                                    : layout.data;
  for (int i = 0; i < degree; ++i) {
    RankCoordinates c = mine;
    if (kind == GroupKind::kTensor) c.tp = i;
    if (kind == GroupKind::kPipeline) c.pp = i;
    if (kind == GroupKind::kData) c.dp = i;
    members.push_back(RankOf(layout, c));
  }
  return members;  // ascending: the varied coordinate's stride is positive
}

}  // namespace

std::vector<int> TensorGroupOf(const ParallelLayout& layout, int rank) {
  return GroupOf(layout, rank, GroupKind::kTensor);
}
std::vector<int> PipelineGroupOf(const ParallelLayout& layout, int rank) {
  return GroupOf(layout, rank, GroupKind::kPipeline);
}
std::vector<int> DataGroupOf(const ParallelLayout& layout, int rank) {
  return GroupOf(layout, rank, GroupKind::kData);
}

std::vector<std::vector<int>> AllGroups(const ParallelLayout& layout, GroupKind kind) {
  std::vector<std::vector<int>> groups;
  std::vector<bool> seen(layout.world_size(), false);
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    if (seen[rank]) continue;
    std::vector<int> members = GroupOf(layout, rank, kind);
    for (int m : members) seen[m] = true;
    groups.push_back(std::move(members));
  }
  return groups;
}

const char* GroupKindName(GroupKind kind) {
  switch (kind) {
    case GroupKind::kTensor:
      return "tensor";
    case GroupKind::kPipeline:
      return "pipeline";
    case GroupKind::kData:
      return "data";
  }
  return "unknown";
}

absl::StatusOr<std::vector<int>> SplitLayers(int n_layer, int stages, double first_stage_extra,
                                             double last_stage_extra,
                                             const std::vector<double>& stage_slowdown) {
  if (stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.pipeline must be >= 1, got ", stages));
  }
  if (n_layer < stages) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.pipeline (", stages,
                                                   ") exceeds model.n_layer (", n_layer,
                                                   "): every stage needs at least one block"));
  }
  if (!std::isfinite(first_stage_extra) || !std::isfinite(last_stage_extra) ||
      first_stage_extra < 0 || last_stage_extra < 0) {
    return absl::InvalidArgumentError("pipeline stage extra costs must be finite and >= 0");
  }
  if (!stage_slowdown.empty()) {
    if (static_cast<int>(stage_slowdown.size()) != stages) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage slowdowns: ", stage_slowdown.size(), " for ", stages, " stages"));
    }
    for (double f : stage_slowdown) {
      if (!std::isfinite(f) || f < 0.01) {
        return absl::InvalidArgumentError("stage slowdowns must be finite and >= 0.01");
      }
    }
  }
  const double kInf = std::numeric_limits<double>::infinity();
  auto cost = [&](int stage, int blocks) {
    const double factor = stage_slowdown.empty() ? 1.0 : stage_slowdown[stage];
    return factor * (blocks + (stage == 0 ? first_stage_extra : 0.0) +
                     (stage == stages - 1 ? last_stage_extra : 0.0));
  };
  // suffix[k][i]: the smallest achievable maximum stage cost when blocks
  // i..n_layer-1 go to stages k..stages-1, each stage non-empty.
  std::vector<std::vector<double>> suffix(stages + 1, std::vector<double>(n_layer + 1, kInf));
  suffix[stages][n_layer] = 0;
  for (int k = stages - 1; k >= 0; --k) {
    const int later = stages - 1 - k;  // stages after k, each needs a block
    for (int i = 0; i + 1 + later <= n_layer; ++i) {
      double best = kInf;
      for (int c = 1; i + c + later <= n_layer; ++c) {
        best = std::min(best, std::max(cost(k, c), suffix[k + 1][i + c]));
      }
      suffix[k][i] = best;
    }
  }
  const double bottleneck = suffix[0][0];
  // The first stage takes the fewest blocks that keep the optimum: under
  // 1F1B it holds the most micro-batches' activations (p of them), so a
  // block moved off it lowers the pipeline's peak memory at no cost in
  // pace. Then, front to back, each stage takes the most blocks that keep
  // the optimum, which leaves the short stages last, where the LM head is.
  // (126 blocks on 16 stages: 7, fourteen 8s, 7, Llama 3 405B's split.)
  std::vector<int> blocks(stages, 0);
  int begin = 0;
  for (int k = 0; k < stages; ++k) {
    const int later = stages - 1 - k;
    const int most = n_layer - begin - later;
    auto keeps_optimum = [&](int c) {
      return std::max(cost(k, c), suffix[k + 1][begin + c]) <= bottleneck + 1e-9;
    };
    if (k == 0 && stages > 1) {
      for (int c = 1; c <= most; ++c) {
        if (keeps_optimum(c)) {
          blocks[k] = c;
          break;
        }
      }
    } else {
      for (int c = most; c >= 1; --c) {
        if (keeps_optimum(c)) {
          blocks[k] = c;
          break;
        }
      }
    }
    begin += blocks[k];
  }
  return blocks;
}

int FirstBlockOfStage(const std::vector<int>& blocks_per_stage, int stage) {
  int first = 0;
  for (int k = 0; k < stage; ++k) first += blocks_per_stage[k];
  return first;
}

absl::Status CheckInterleaving(int64_t n_layer, int64_t pipeline, int64_t virtual_stages,
                               int64_t micro_batches) {
  if (virtual_stages <= 1) return absl::OkStatus();
  if (pipeline <= 1) {
    return absl::InvalidArgumentError("interleaving needs more than one pipeline stage");
  }
  if (n_layer % pipeline != 0) {
    // Every rank holds v equal chunks, so the stages must be equal too.
    return absl::InvalidArgumentError(
        absl::StrCat("interleaving needs equal stages, but ", pipeline,
                     " pipeline stages do not divide the ", n_layer, " layers"));
  }
  const int64_t layers_per_stage = n_layer / pipeline;
  if (layers_per_stage % virtual_stages != 0) {
    return absl::InvalidArgumentError(absl::StrCat(virtual_stages, " does not divide the ",
                                                   layers_per_stage, " layers per stage"));
  }
  if (micro_batches > 0 && micro_batches % pipeline != 0) {
    // The interleaved schedule runs micro-batches in groups of p.
    return absl::InvalidArgumentError(
        absl::StrCat("the interleaved schedule needs the ", micro_batches,
                     " micro-batches per replica to be a multiple of the ", pipeline,
                     " pipeline stages"));
  }
  return absl::OkStatus();
}

}  // namespace loom
