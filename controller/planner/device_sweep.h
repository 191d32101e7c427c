// Devices that don't pay: the planner may leave devices idle.
//
// MakePlan spreads the layout over every device it is given. When the global
// batch is small for the cluster, the last devices buy little: a 1T GPT with
// 3,072 sequences per step on 131,072 A100s has at most 1,024 data-parallel
// replicas of 3 micro-batches each, and runs at 9.4% MFU. The sweep plans
// the same request on fewer devices and reports, per device count, the best
// layout's step time, MFU, time to train and cost (the iron law,
// iron_law.h), and the count it recommends.
//
// Device counts: 1, 2, 4, ... devices of one node while below a node, then
// 1, 2, 4, ... whole nodes (whole racks once above one rack, so that the
// rack structure stays exact), and the full cluster. A sub-cluster keeps the
// topology's device, links, power and price. Counts below the smallest one
// on which some layout fits are not listed.
//
// Recommendation: the fastest count whose device-hours are at most
// `max_cost_ratio` (default 2) x those of the cheapest count. The run's
// model FLOPs are the same on every count, so device-hours are inversely
// proportional to MFU (the iron law), and the rule reads: a count pays while
// its MFU is at least 1 / max_cost_ratio of the best count's, i.e. while a
// device there does at least half the work of a device where they are best
// used. Why this rule and not "within X% of the fastest": past the knee
// each doubling of the devices buys a few percent of wall clock for nearly
// twice the device-hours (for the 1T case below, the whole cluster trains
// 15% faster than half of it at 1.7x the device-hours), so a tolerance on time alone
// lands in that flat tail; a bound on cost relative to the cheapest count
// is scale-free, needs no price (it compares device-hours; with a price,
// cost is proportional to them) and no token budget (it compares
// devices / throughput). max_cost_ratio 1 recommends the cheapest count, a
// large one the fastest. Ties of throughput go to fewer devices.
//
// Pure functions of their arguments; thread-safe.
#ifndef LOOM_CONTROLLER_PLANNER_DEVICE_SWEEP_H_
#define LOOM_CONTROLLER_PLANNER_DEVICE_SWEEP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/planner/cost_model.h"
#include "controller/planner/topology.h"

namespace loom::planner {

struct PlanRequest;  // planner.h

struct DeviceSweepOptions {
  // See the rule above: device-hours at most this multiple (>= 1) of the
  // cheapest count's.
  double max_cost_ratio = 2.0;
};

// One device count.
struct DeviceCountResult {
  int devices = 0;
  int nodes = 0;             // of the sub-cluster
  int devices_per_node = 0;
  bool fits = false;         // some layout fits on this many devices
  std::string reason;        // !fits: why not (the planner's FAILED_PRECONDITION)
  // fits: the fastest layout, with step time, MFU and, for the request's
  // token budget, `run` (time to train, device-hours, cost, energy).
  LayoutEvaluation best;
};

struct DeviceSweep {
  std::vector<DeviceCountResult> counts;  // ascending device count
  int fastest = -1;      // index in `counts` of the highest throughput
  int cheapest = -1;     // index in `counts` of the fewest device-hours (highest MFU)
  int recommended = -1;  // index in `counts` of the recommendation
  std::string rule;      // the rule, in words, with its tolerance
  // One sentence: what the recommendation gives up and saves against the
  // full cluster, e.g. "16,384 of 131,072 devices: 2.05x the time to train
  // at 36.6% MFU instead of 9.4%, 74% fewer device-hours".
  std::string summary;
};

// The device counts the sweep plans for `topology` (see above), ascending,
// ending with topology.total_devices().
std::vector<int> SweepDeviceCounts(const ClusterTopology& topology);

// `topology` cut down to `devices`, which must be one of
// SweepDeviceCounts(topology).
ClusterTopology SubTopology(const ClusterTopology& topology, int devices);

// Plans `request` on each count of SweepDeviceCounts(request.topology) and
// recommends one. The request's constraints apply on every count; a pinned
// data-parallel degree (options.dp > 0) cannot leave devices idle, so it is
// INVALID_ARGUMENT, as is a max_cost_ratio below 1. Other planner errors
// (INVALID_ARGUMENT for a bad model or training spec) are returned as they
// are. FAILED_PRECONDITION when no count fits.
absl::StatusOr<DeviceSweep> SweepDevices(const PlanRequest& request,
                                         const DeviceSweepOptions& options = {});

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_DEVICE_SWEEP_H_
