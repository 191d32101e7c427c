// Whether a gang fits a set of workers now, and where: each entry of the
// gang's demand on a distinct worker with room for it. All or nothing.
//
// Best fit, largest demand first: each entry goes to the worker it leaves
// the least room on (slots, then GPUs, then the lowest index), so big holes
// stay big for big gangs. For one resource this finds a placement whenever
// one exists (sorted demands against sorted capacities); with GPUs too it
// is a heuristic that may miss a rare fit.
//
// Pure functions; thread-safe.
#ifndef LOOM_CONTROLLER_SCHEDULING_GANG_FIT_H_
#define LOOM_CONTROLLER_SCHEDULING_GANG_FIT_H_

#include <optional>
#include <string>
#include <vector>

#include "controller/scheduling/resources.h"
#include "controller/scheduling/snapshot.h"

namespace loom::scheduling {

// For each gang.per_worker[i], the index into `free` of its worker; nullopt
// when the gang does not fit. An empty gang fits nowhere (nullopt).
std::optional<std::vector<int>> FitGang(const GangDemand& gang, const std::vector<Resources>& free);

// Why it does not fit, for a waiting job's reason: "needs 4 worker(s) with
// 2 slot(s) each; 3 have room (7 free slot(s) in all)".
std::string DescribeShortage(const GangDemand& gang, const std::vector<Resources>& free);

}  // namespace loom::scheduling

#endif  // LOOM_CONTROLLER_SCHEDULING_GANG_FIT_H_
