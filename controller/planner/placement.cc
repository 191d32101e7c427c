#include "controller/planner/placement.h"

#include <algorithm>
#include <deque>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::planner {

absl::StatusOr<Placement> PlaceRanks(const Layout& layout, const ClusterTopology& topology) {
  const int tp = layout.tp, pp = layout.pp, dp = layout.dp;
  const int per_node = topology.devices_per_node;
  const int n = topology.total_devices();
  if (tp < 1 || pp < 1 || dp < 1) {
    return absl::InvalidArgumentError("layout: degrees must be >= 1");
  }
  if (static_cast<int64_t>(tp) * pp * dp != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout: tp x pp x dp = ", static_cast<int64_t>(tp) * pp * dp, ", but the cluster has ",
        n, " devices"));
  }
  if ((tp <= per_node && per_node % tp != 0) || (tp > per_node && tp % per_node != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.tp: ", tp, " would split a node's ", per_node,
                     " devices unevenly"));
  }
  const int nodes_per_rack = topology.nodes_per_rack > 0 ? topology.nodes_per_rack : topology.nodes;
  auto rack_of_node = [&](int node) { return node / nodes_per_rack; };

  // Free TP slots per rack, in device order. Slot k covers flat devices
  // [k tp, (k+1) tp); flat device g is device g % per_node of node g / per_node.
  const int slots = n / tp;
  const int racks = (topology.nodes + nodes_per_rack - 1) / nodes_per_rack;
  std::vector<std::deque<int>> free_slots(racks);
  for (int k = 0; k < slots; ++k) {
    free_slots[rack_of_node(k * tp / per_node)].push_back(k);
  }

  Placement placement;
  placement.ranks.resize(n);
  for (int d = 0; d < dp; ++d) {
    // A rack that can hold the whole replica, else spill across racks.
    std::vector<int> chosen;
    for (auto& rack : free_slots) {
      if (static_cast<int>(rack.size()) >= pp) {
        for (int i = 0; i < pp; ++i) {
          chosen.push_back(rack.front());
          rack.pop_front();
        }
        break;
      }
    }
    for (auto& rack : free_slots) {
      while (static_cast<int>(chosen.size()) < pp && !rack.empty()) {
        chosen.push_back(rack.front());
        rack.pop_front();
      }
    }
    for (int p = 0; p < pp; ++p) {
      for (int t = 0; t < tp; ++t) {
        const int rank = d * pp * tp + p * tp + t;
        const int flat = chosen[p] * tp + t;
        RankPlacement& r = placement.ranks[rank];
        r.rank = rank;
        r.node = flat / per_node;
        r.device = flat % per_node;
        r.rack = topology.nodes_per_rack > 0 ? rack_of_node(r.node) : 0;
        r.tp_rank = t;
        r.pp_rank = p;
        r.dp_rank = d;
      }
    }
  }

  // Group facts.
  const auto& ranks = placement.ranks;
  placement.tp_groups = pp * dp;
  for (int g = 0; g < pp * dp; ++g) {
    std::set<int> nodes;
    for (int t = 0; t < tp; ++t) nodes.insert(ranks[g * tp + t].node);
    if (nodes.size() == 1) ++placement.tp_groups_within_one_node;
  }
  placement.pp_groups = dp * tp;
  for (int d = 0; d < dp; ++d) {
    for (int t = 0; t < tp; ++t) {
      std::set<int> nodes, rack_set;
      for (int p = 0; p < pp; ++p) {
        const RankPlacement& r = ranks[d * pp * tp + p * tp + t];
        nodes.insert(r.node);
        rack_set.insert(r.rack);
      }
      if (nodes.size() == 1) ++placement.pp_groups_within_one_node;
      if (rack_set.size() == 1) ++placement.pp_groups_within_one_rack;
    }
  }
  placement.dp_groups = pp * tp;
  for (int p = 0; p < pp; ++p) {
    for (int t = 0; t < tp; ++t) {
      std::set<int> nodes;
      for (int d = 0; d < dp; ++d) nodes.insert(ranks[d * pp * tp + p * tp + t].node);
      placement.max_nodes_per_dp_group =
          std::max(placement.max_nodes_per_dp_group, static_cast<int>(nodes.size()));
    }
  }
  return placement;
}

}  // namespace loom::planner
