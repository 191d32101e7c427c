#include "controller/admission/scheduler.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/planner/placement.h"

namespace loom::controller {
namespace {

std::pair<std::string, std::string> RackKey(const loom::v1::WorkerInfo& w) {
  return {w.zone(), w.rack()};
}

// How a gang's ranks split over its workers: whole tensor groups, the first
// `big_workers` workers one group more than the rest.
struct Shares {
  int small = 0;        // ranks on each of the other workers
  int big = 0;          // ranks on each of the first big_workers workers
  int big_workers = 0;  // 0 when the split is even
  bool even() const { return big_workers == 0; }
};

Shares SharesOf(const GangRequest& gang) {
  const int tp = gang.layout.tensor;
  const int groups = gang.layout.world_size() / tp;
  Shares s;
  s.small = (groups / gang.workers) * tp;
  s.big_workers = groups % gang.workers;
  s.big = s.small + (s.big_workers > 0 ? tp : 0);
  return s;
}

}  // namespace

std::vector<int> RanksPerWorker(const GangRequest& gang) {
  const Shares shares = SharesOf(gang);
  std::vector<int> ranks;
  for (int w = 0; w < gang.workers; ++w) {
    ranks.push_back(w < shares.big_workers ? shares.big : shares.small);
  }
  return ranks;
}

namespace {

// Ranks this worker can take for the gang now.
int Capacity(const GangRequest& gang, const WorkerOffer& offer) {
  int cap = std::max(0, offer.free_slots);
  if (gang.gpu_per_rank) cap = std::min(cap, static_cast<int>(offer.free_gpus.size()));
  return cap;
}

std::string ShortageReason(const GangRequest& gang, const Shares& shares,
                           const std::vector<WorkerOffer>& offers) {
  int total = 0, with_big = 0, with_small = 0;
  for (const WorkerOffer& o : offers) {
    const int cap = Capacity(gang, o);
    total += cap;
    with_big += cap >= shares.big ? 1 : 0;
    with_small += cap >= shares.small ? 1 : 0;
  }
  const char* slot = gang.gpu_per_rank ? "such slot(s)" : "free slot(s)";
  std::string each =
      shares.even() ? absl::StrFormat("%d on each", shares.small)
                    : absl::StrFormat("%d on %d of them, %d on the rest", shares.big,
                                      shares.big_workers, shares.small);
  if (gang.layout.tensor > 1) {
    absl::StrAppendFormat(&each, "; a tensor group of %d rank(s) sits inside one worker",
                          gang.layout.tensor);
  }
  std::string have =
      shares.even()
          ? absl::StrFormat("%d of them with %d %s", with_small, shares.small, slot)
          : absl::StrFormat("%d of them with %d %s, %d with %d", with_big, shares.big, slot,
                            with_small, shares.small);
  return absl::StrFormat(
      "waiting for %d rank slot(s)%s on %d worker(s) (%s); %d worker(s) alive, %s, %d %s in "
      "all%s",
      gang.layout.world_size(), gang.gpu_per_rank ? " with a free GPU each" : "", gang.workers,
      each, static_cast<int>(offers.size()), have, total, slot,
      gang.gpu_per_rank ? " (workers report their GPUs at registration: loomctl workers)" : "");
}

}  // namespace

GangRequest GangRequestOf(const loom::v1::JobSpec& spec) {
  const auto& res = spec.resources();
  const auto& par = spec.parallelism();
  GangRequest gang;
  gang.workers = std::max(1, res.workers());
  const int ranks = std::max(gang.workers, res.ranks());
  gang.layout.tensor = std::max(1, par.tensor());
  gang.layout.pipeline = std::max(1, par.pipeline());
  gang.layout.data = std::max(1, ranks / (gang.layout.tensor * gang.layout.pipeline));
  gang.gpu_per_rank = res.gpus_per_rank() > 0;
  return gang;
}

std::string RackLabel(const loom::v1::WorkerInfo& w) {
  if (w.zone().empty()) return w.rack();
  if (w.rack().empty()) return w.zone();
  return absl::StrCat(w.zone(), "/", w.rack());
}

bool InRackOrder(const loom::v1::WorkerInfo& a, const loom::v1::WorkerInfo& b) {
  return std::tie(a.zone(), a.rack(), a.id()) < std::tie(b.zone(), b.rack(), b.id());
}

std::vector<int> ChooseInRackOrder(const std::vector<loom::v1::WorkerInfo>& sorted, int count,
                                   int workers_per_replica) {
  const int per = std::max(1, workers_per_replica);
  std::vector<bool> taken(sorted.size(), false);
  int need = count;
  // Whole replicas from each rack in turn.
  for (size_t begin = 0; begin < sorted.size() && need >= per;) {
    size_t end = begin;
    while (end < sorted.size() && RackKey(sorted[end]) == RackKey(sorted[begin])) ++end;
    const int room = static_cast<int>(end - begin);
    const int take = std::min(room / per, need / per) * per;
    for (int i = 0; i < take; ++i) taken[begin + i] = true;
    need -= take;
    begin = end;
  }
  // The rest in rack order.
  for (size_t i = 0; i < sorted.size() && need > 0; ++i) {
    if (!taken[i]) {
      taken[i] = true;
      --need;
    }
  }
  std::vector<int> chosen;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (taken[i]) chosen.push_back(static_cast<int>(i));
  }
  return chosen;
}

int NodesPerRack(const std::vector<loom::v1::WorkerInfo>& workers) {
  bool labelled = false;
  std::map<std::pair<std::string, std::string>, int> per_rack;
  for (const auto& w : workers) {
    labelled = labelled || !w.zone().empty() || !w.rack().empty();
    ++per_rack[RackKey(w)];
  }
  if (!labelled || per_rack.empty()) return 0;
  const int first = per_rack.begin()->second;
  for (const auto& [key, n] : per_rack) {
    if (n != first) return 0;
  }
  return first;
}

absl::Status CheckGangShape(const GangRequest& gang) {
  if (gang.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.workers: must be >= 1, got ", gang.workers));
  }
  if (absl::Status s = ValidateLayout(gang.layout, gang.layout.world_size()); !s.ok()) return s;
  const int groups = gang.layout.world_size() / gang.layout.tensor;
  if (groups < gang.workers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "resources.workers: %d worker(s) for %d tensor group(s) of %d rank(s) "
        "(parallelism.tensor); a tensor group sits inside one worker, so at most %d worker(s) "
        "get ranks",
        gang.workers, groups, gang.layout.tensor, groups));
  }
  return absl::OkStatus();
}

absl::StatusOr<GangPlacement> PlaceGang(const GangRequest& gang,
                                        const std::vector<WorkerOffer>& offers) {
  if (absl::Status s = CheckGangShape(gang); !s.ok()) return s;
  const Shares shares = SharesOf(gang);
  const int tp = gang.layout.tensor, pp = gang.layout.pipeline;

  std::vector<const WorkerOffer*> sorted;
  for (const WorkerOffer& o : offers) sorted.push_back(&o);
  std::stable_sort(sorted.begin(), sorted.end(), [](const WorkerOffer* a, const WorkerOffer* b) {
    return InRackOrder(a->info, b->info);
  });

  // The chosen workers in rack order and the ranks each runs.
  std::vector<const WorkerOffer*> chosen;
  std::vector<int> share;
  if (shares.even()) {
    std::vector<const WorkerOffer*> fit;
    std::vector<loom::v1::WorkerInfo> fit_info;
    for (const WorkerOffer* o : sorted) {
      if (Capacity(gang, *o) >= shares.small) {
        fit.push_back(o);
        fit_info.push_back(o->info);
      }
    }
    // A replica's pp x tp ranks cover this many workers.
    const int per_replica = std::max(1, (pp * tp + shares.small - 1) / shares.small);
    for (int i : ChooseInRackOrder(fit_info, gang.workers, per_replica)) {
      chosen.push_back(fit[i]);
    }
    share.assign(chosen.size(), shares.small);
  } else {
    // Uneven: the first workers in rack order that can take one tensor
    // group more do, the rest take the smaller share.
    std::vector<int> kind(sorted.size(), 0);  // 2 big, 1 small, 0 unused
    int bigs = 0, smalls = 0;
    for (size_t i = 0; i < sorted.size() && bigs < shares.big_workers; ++i) {
      if (Capacity(gang, *sorted[i]) >= shares.big) kind[i] = 2, ++bigs;
    }
    const int small_workers = gang.workers - shares.big_workers;
    for (size_t i = 0; i < sorted.size() && smalls < small_workers; ++i) {
      if (kind[i] == 0 && Capacity(gang, *sorted[i]) >= shares.small) kind[i] = 1, ++smalls;
    }
    if (bigs == shares.big_workers && smalls == small_workers) {
      for (size_t i = 0; i < sorted.size(); ++i) {
        if (kind[i] == 0) continue;
        chosen.push_back(sorted[i]);
        share.push_back(kind[i] == 2 ? shares.big : shares.small);
      }
    }
  }
  if (static_cast<int>(chosen.size()) < gang.workers) {
    return absl::ResourceExhaustedError(ShortageReason(gang, shares, offers));
  }

  GangPlacement placement;
  for (const WorkerOffer* o : chosen) placement.workers.push_back(o->info);
  planner::ClusterTopology& topology = placement.topology;
  // The planner's node -> (chosen worker, first local slot on it).
  std::vector<std::pair<int, int>> node_at;
  if (shares.even()) {
    topology.nodes = gang.workers;
    topology.devices_per_node = shares.small;
    topology.nodes_per_rack = NodesPerRack(placement.workers);
    for (int w = 0; w < gang.workers; ++w) node_at.push_back({w, 0});
  } else {
    topology.nodes = gang.layout.world_size() / tp;
    topology.devices_per_node = tp;
    for (int w = 0; w < gang.workers; ++w) {
      for (int g = 0; g < share[w] / tp; ++g) node_at.push_back({w, g * tp});
    }
  }
  topology.name = absl::StrFormat("%d x %d slot(s)", topology.nodes, topology.devices_per_node);

  planner::Layout layout;
  layout.tp = tp;
  layout.pp = pp;
  layout.dp = gang.layout.data;
  auto placed = planner::PlaceRanks(layout, topology);
  if (!placed.ok()) return placed.status();  // a broken invariant of the shapes above

  placement.ranks.resize(placed->ranks.size());
  for (const planner::RankPlacement& r : placed->ranks) {
    const auto [worker, first_slot] = node_at[r.node];
    const int local = first_slot + r.device;
    PlacedRank& out = placement.ranks[r.rank];
    out.rank = r.rank;
    out.worker = worker;
    out.gpu = gang.gpu_per_rank ? chosen[worker]->free_gpus[local] : -1;
    out.at = RankCoordinates{r.dp_rank, r.pp_rank, r.tp_rank};
  }
  return placement;
}

std::string DescribePlacement(const GangRequest& gang, const GangPlacement& placement) {
  const bool layered = gang.layout.tensor > 1 || gang.layout.pipeline > 1;
  std::vector<std::string> parts;
  for (const PlacedRank& r : placement.ranks) {
    const loom::v1::WorkerInfo& w = placement.workers[r.worker];
    parts.push_back(absl::StrCat(
        r.rank, "@", w.node(), r.gpu >= 0 ? absl::StrCat(":gpu", r.gpu) : "",
        layered ? absl::StrCat("(dp", r.at.dp, ",pp", r.at.pp, ",tp", r.at.tp, ")") : ""));
  }
  // Rack labels, when the workers carry any: "[r1: node-a node-b] [r2: node-c]".
  std::string racks;
  if (std::any_of(placement.workers.begin(), placement.workers.end(),
                  [](const loom::v1::WorkerInfo& w) {
                    return !w.zone().empty() || !w.rack().empty();
                  })) {
    absl::StrAppend(&racks, " on racks");
    for (size_t i = 0; i < placement.workers.size(); ++i) {
      const loom::v1::WorkerInfo& w = placement.workers[i];
      if (i > 0 && RackKey(w) == RackKey(placement.workers[i - 1])) {
        racks.insert(racks.size() - 1, absl::StrCat(" ", w.node()));
      } else {
        const std::string name = RackLabel(w);
        absl::StrAppend(&racks, " [", name.empty() ? "no rack" : name, ": ", w.node(), "]");
      }
    }
  }
  return absl::StrCat("placed ", gang.layout.world_size(), " rank(s)",
                      layered ? absl::StrCat(" as ", LayoutName(gang.layout)) : "", racks, ": ",
                      absl::StrJoin(parts, " "));
}

}  // namespace loom::controller
