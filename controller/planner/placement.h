// Rank placement: which (node, device) runs each rank of a layout.
//
// Ranks are numbered with tensor parallelism innermost, pipeline next and
// data parallelism outermost (the chapter's placement heuristic, line
// 1520: the most frequent collectives on the fastest links):
//   rank = dp_rank x (pp x tp) + pp_rank x tp + tp_rank
// Devices are handed out in slots of tp consecutive devices of one node, so
// a TP group never leaves its node (unless tp > devices_per_node, which
// needs whole nodes). Each model replica (its pp slots) is placed inside one
// rack when the topology has racks and one has room, so pipeline traffic
// stays under the rack switch; DP groups span racks.
//
// Pure functions; thread-safe.
#ifndef LOOM_CONTROLLER_PLANNER_PLACEMENT_H_
#define LOOM_CONTROLLER_PLANNER_PLACEMENT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "controller/planner/cost_model.h"
#include "controller/planner/topology.h"

namespace loom::planner {

struct RankPlacement {
  int rank = 0;
  int node = 0;
  int device = 0;  // index within the node
  int rack = 0;    // 0 when the topology has no racks
  int tp_rank = 0;
  int pp_rank = 0;
  int dp_rank = 0;
};

struct Placement {
  std::vector<RankPlacement> ranks;  // ranks[i].rank == i
  // Facts about the groups, for reports and checks.
  int tp_groups = 0;
  int tp_groups_within_one_node = 0;
  int pp_groups = 0;  // one per (dp_rank, tp_rank)
  int pp_groups_within_one_node = 0;
  int pp_groups_within_one_rack = 0;
  int dp_groups = 0;  // one per (pp_rank, tp_rank)
  int max_nodes_per_dp_group = 0;
};

// INVALID_ARGUMENT when the layout does not use exactly the cluster's
// devices, or tp splits a node unevenly.
absl::StatusOr<Placement> PlaceRanks(const Layout& layout, const ClusterTopology& topology);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_PLACEMENT_H_
