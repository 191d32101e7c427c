// Elastic jobs: the gang an elastic job is re-planned to when the
// live cluster cannot give it what it had, and its spec for that gang.
// elastic/replanner.h asks the planner for a layout of each candidate,
// largest first, and takes the first that plans.
//
// Pure functions; no clock, no store, no gRPC. Thread-compatible.
#ifndef LOOM_CONTROLLER_ELASTIC_ELASTIC_H_
#define LOOM_CONTROLLER_ELASTIC_ELASTIC_H_

#include <string>
#include <vector>

#include "loom/v1/job.pb.h"

namespace loom::controller {

// A gang: `ranks` spread over `workers` distinct workers.
struct ElasticShape {
  int ranks = 0;
  int workers = 0;
};

// The gangs the live cluster can hold for the job now, best first: for each
// rank count from max_ranks down to min_ranks, the fewest workers among
// `free_slots` (what each alive worker could give the job: its slots less
// those other jobs hold) that hold the ranks split as evenly as they go
// (the first ranks % workers of them one more, on the largest offers).
// Rank counts no split fits are left out; empty when none fits.
std::vector<ElasticShape> ElasticCandidates(const std::vector<int>& free_slots, int min_ranks,
                                            int max_ranks);

// `spec` for `shape`: resources.ranks and .workers set, and the layout left
// to the planner (parallelism.auto, the degrees cleared); the global batch,
// the micro-batch and everything else unchanged.
loom::v1::JobSpec SpecForShape(const loom::v1::JobSpec& spec, ElasticShape shape);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_ELASTIC_ELASTIC_H_
