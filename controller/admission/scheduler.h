// The gang scheduler's placement: which live workers run a job, and which
// rank runs where. It places ranks with the planner's placement
// (planner::PlaceRanks), so the layout the planner
// costs is the layout that runs:
//   * every tensor-parallel group sits inside one worker (its two
//     all-reduces per sublayer never cross the network);
//   * the workers are taken in rack order (zone, rack, then id) and whole
//     racks are filled first, so that a model replica's pipeline stages
//     share a rack when one has room;
//   * data-parallel replicas are outermost and span racks.
// Each rank's (dp, pp, tp) is CoordinatesOf(layout, rank)
// (common/parallel_layout.h); PlaceRanks numbers ranks the same way.
//
// Every chosen worker runs the same number of ranks when resources.ranks
// splits into whole tensor groups evenly over resources.workers; the
// planner's topology is then one node per worker with that many devices and
// the rack labels' structure. Otherwise (e.g. 3 ranks on 2 workers) some
// workers take one tensor group more (the first in rack order with room for
// it), and the planner sees one node per tensor group and no racks (its
// topology is homogeneous).
//
// Pure functions of their arguments; thread-safe. No gRPC types.
#ifndef LOOM_CONTROLLER_ADMISSION_SCHEDULER_H_
#define LOOM_CONTROLLER_ADMISSION_SCHEDULER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/parallel_layout.h"
#include "controller/planner/topology.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

// What a job's gang asks for, from a defaulted spec.
struct GangRequest {
  int workers = 1;         // resources.workers: distinct workers to spread over
  ParallelLayout layout;   // layout.world_size() == resources.ranks
  bool gpu_per_rank = false;  // resources.gpus_per_rank 1: each rank needs a free GPU
};
GangRequest GangRequestOf(const loom::v1::JobSpec& spec);

// A live worker and what is free on it now.
struct WorkerOffer {
  loom::v1::WorkerInfo info;   // id, node, zone and rack as registered
  int free_slots = 0;          // slots no live rank holds
  std::vector<int> free_gpus;  // GPU indices no live rank holds (GPU jobs only)
};

struct PlacedRank {
  int rank = 0;
  int worker = 0;     // index into GangPlacement::workers (the planner's node)
  int gpu = -1;       // the rank's GPU on that worker; -1 for CPU ranks
  RankCoordinates at; // == CoordinatesOf(layout, rank)
};

struct GangPlacement {
  // The chosen workers in rack order. Rank 0's worker
  // (workers[ranks[0].worker]) hosts the rendezvous.
  std::vector<loom::v1::WorkerInfo> workers;
  // The shape the planner placed on: nodes, devices_per_node, nodes_per_rack
  // (no device figures; TopologyForSpec supplies those for costing).
  planner::ClusterTopology topology;
  std::vector<PlacedRank> ranks;  // ranks[i].rank == i
};

// The ranks each of the gang's workers runs, as PlaceGang splits them: the
// workers that take one tensor group more first. gang.workers entries.
std::vector<int> RanksPerWorker(const GangRequest& gang);

// Whether the gang can ever be placed, whatever the cluster: each worker must
// get at least one whole tensor group. INVALID_ARGUMENT naming the field.
absl::Status CheckGangShape(const GangRequest& gang);

// Places `gang` on the alive workers `offers` (any order; workers with
// nothing free count towards "alive" in the reason). INVALID_ARGUMENT as
// CheckGangShape; RESOURCE_EXHAUSTED saying which resource is short (free
// slots, free GPUs, how many are needed on each worker) when the live
// cluster cannot hold the gang now; the message is the waiting job's reason.
absl::StatusOr<GangPlacement> PlaceGang(const GangRequest& gang,
                                        const std::vector<WorkerOffer>& offers);

// The SCHEDULED transition's reason: "placed 4 rank(s) as dp1 x pp2 x tp2
// on racks [r1: node-a node-b]: 0@node-a(dp0,pp0,tp0) ...", with each rank's
// GPU (":gpu1") and, when the workers carry zone/rack labels, the racks in
// order with their workers.
std::string DescribePlacement(const GangRequest& gang, const GangPlacement& placement);

// "zone/rack", or whichever of the two labels is set; empty for neither.
std::string RackLabel(const loom::v1::WorkerInfo& w);

// Rack order: by zone, then rack, then id (ids start with the node name).
bool InRackOrder(const loom::v1::WorkerInfo& a, const loom::v1::WorkerInfo& b);

// `count` of `sorted` (in rack order) to run a gang whose replica spans
// `workers_per_replica` workers: first whole replicas from each rack in
// turn, so a replica never straddles racks while a rack has room for all of
// it, then whatever is left in rack order. Returns indices into `sorted`,
// ascending; fewer than `count` when `sorted` is shorter.
std::vector<int> ChooseInRackOrder(const std::vector<loom::v1::WorkerInfo>& sorted, int count,
                                   int workers_per_replica);

// The planner's nodes_per_rack for `workers` in rack order: the number of
// workers per (zone, rack) when some worker carries a rack label and every
// rack holds the same number of them, else 0 (no rack structure).
int NodesPerRack(const std::vector<loom::v1::WorkerInfo>& workers);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_ADMISSION_SCHEDULER_H_
