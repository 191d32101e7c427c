// Where a rank sits in a 3-D parallel layout (data x pipeline x tensor), and
// which ranks it shares each kind of group with. Pure arithmetic: no
// LibTorch, so the controller's scheduler, the worker daemon and the engine
// agree on one definition.
//
// Rank order (Megatron-LM's, Shoeybi et al. 2019 sec. 3 and Narayanan et al.
// 2021 sec. 3.3): tensor-parallel rank varies fastest, then pipeline stage,
// then data-parallel replica,
//
//   rank = (dp * pipeline + pp) * tensor + tp,
//
// so the `tensor` ranks of one TP group are consecutive (and a scheduler that
// fills a node with consecutive ranks keeps each TP group inside it), the
// stages of one pipeline are `tensor` apart, and data-parallel replicas are
// outermost.
#ifndef LOOM_COMMON_PARALLEL_LAYOUT_H_
#define LOOM_COMMON_PARALLEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

struct ParallelLayout {
  int data = 1;      // data-parallel replicas (dp)
  int tensor = 1;    // tensor-parallel ranks per layer (tp)
  int pipeline = 1;  // pipeline stages (pp)

  int world_size() const { return data * tensor * pipeline; }
  bool operator==(const ParallelLayout& o) const {
    return data == o.data && tensor == o.tensor && pipeline == o.pipeline;
  }
  bool operator!=(const ParallelLayout& o) const { return !(*this == o); }
};

// "dp2 x pp1 x tp2"-style text for logs and errors.
std::string LayoutName(const ParallelLayout& layout);

// A rank's coordinates; each in [0, the layout's degree of that kind).
struct RankCoordinates {
  int dp = 0;
  int pp = 0;
  int tp = 0;
  bool operator==(const RankCoordinates& o) const {
    return dp == o.dp && pp == o.pp && tp == o.tp;
  }
};

// INVALID_ARGUMENT naming the field ("parallelism.tensor must be >= 1 ...")
// unless every degree is >= 1 and their product equals world_size.
absl::Status ValidateLayout(const ParallelLayout& layout, int world_size);

// Requires 0 <= rank < layout.world_size() (checked by the caller; out of
// range aborts, as a broken invariant).
RankCoordinates CoordinatesOf(const ParallelLayout& layout, int rank);
int RankOf(const ParallelLayout& layout, const RankCoordinates& coordinates);

// The ranks, ascending, that share a group with `rank`: the tensor group
// (same dp and pp), the pipeline group (same dp and tp; index in it = pp)
// and the data group (same pp and tp; index in it = dp). A rank's index in
// its tensor group is its tp coordinate.
std::vector<int> TensorGroupOf(const ParallelLayout& layout, int rank);
std::vector<int> PipelineGroupOf(const ParallelLayout& layout, int rank);
std::vector<int> DataGroupOf(const ParallelLayout& layout, int rank);

// Every group of each kind, each as its ascending member list, in the order
// of their smallest member. A group kind has world_size / degree groups.
enum class GroupKind { kTensor, kPipeline, kData };
std::vector<std::vector<int>> AllGroups(const ParallelLayout& layout, GroupKind kind);
const char* GroupKindName(GroupKind kind);  // "tensor", "pipeline", "data"

// Splits `n_layer` transformer blocks into `stages` consecutive pipeline
// stages, each with at least one block, minimising the cost of the most
// expensive stage (which sets a pipeline's pace). A block costs 1; the first
// stage also carries the embedding (first_stage_extra, in block units) and
// the last the LM head and loss (last_stage_extra). Uneven splits are the
// point: 70 layers on 12 stages. Ties: the first stage takes the fewest blocks (most activations
// in 1F1B), then earlier stages the most. Returns the number of blocks per stage.
// `stage_slowdown` (empty: all 1) multiplies each stage's cost: a stage on
// a device measured 2x slower than its peers costs twice as much per block
// (a slow-rank re-plan, recovery.slow_rank.action "replan").
// INVALID_ARGUMENT if stages < 1, n_layer < stages, an extra cost is
// negative or not finite, or stage_slowdown is not empty and not one
// finite factor >= 0.01 per stage.
absl::StatusOr<std::vector<int>> SplitLayers(int n_layer, int stages, double first_stage_extra = 0,
                                             double last_stage_extra = 0,
                                             const std::vector<double>& stage_slowdown = {});

// Index of the first block of stage `stage` under `blocks_per_stage`.
int FirstBlockOfStage(const std::vector<int>& blocks_per_stage, int stage);

// Whether Megatron-LM's interleaved 1F1B schedule (Narayanan et al. 2021,
// Sec. 2.2.2) can run `virtual_stages` model chunks per pipeline rank: it
// needs more than one stage, equal stages (`pipeline` divides `n_layer`),
// equal chunks (`virtual_stages` divides the layers per stage) and the
// micro-batches in groups of `pipeline` (`micro_batches` per replica per step
// a multiple of it; pass 0 when not known yet to skip that rule). OK when
// virtual_stages <= 1 (not interleaved). Otherwise INVALID_ARGUMENT whose
// message is the reason alone, e.g. "3 does not divide the 20 layers per
// stage": the planner prefixes "layout.virtual_stages: ", the job spec
// "parallelism.virtual_stages: ". One rule for both, so `loomctl plan` and
// submit agree.
absl::Status CheckInterleaving(int64_t n_layer, int64_t pipeline, int64_t virtual_stages,
                               int64_t micro_batches);

}  // namespace loom

#endif  // LOOM_COMMON_PARALLEL_LAYOUT_H_
