// How a job's pipeline stages split its blocks, for the speeds of the nodes
// its ranks sit on: pure functions over a job record (no controller state),
// used when placing a job (admission/) and when a slow rank re-splits it.
#ifndef LOOM_CONTROLLER_SLOW_RANKS_STAGE_SPLIT_H_
#define LOOM_CONTROLLER_SLOW_RANKS_STAGE_SPLIT_H_

#include <string>
#include <utility>
#include <vector>

#include "controller/jobs/job_record.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

// The engine's estimate of the LM head and loss in block units
// (worker/engine/parallel/parallel_gpt.h LastStageExtraBlocks).
double LastStageExtraBlocks(const loom::v1::JobSpec& spec);
// The split the engine runs without stage_layers (empty when it has none).
std::vector<int> EvenSplit(const loom::v1::JobSpec& spec);
// "stages 3+1 blocks".
std::string DescribeSplit(const std::vector<int>& split);
// (node, pipeline stage) of each of rec's ranks as placed now.
std::vector<std::pair<std::string, int>> NodeStagesOf(const JobRecord& rec);
// DescribeSplit of `split`, or of the engine's own split when empty.
std::string StageSplitText(const JobRecord& rec, const std::vector<int>& split);
// The blocks per pipeline stage for rec's ranks placed as `node_stage` says,
// each stage's cost scaled by the slowest rec.node_slowdown of its nodes;
// empty when the job has no pipeline stages or none is on a slow node.
std::vector<int> StageLayersForPlacement(
    const JobRecord& rec, const std::vector<std::pair<std::string, int>>& node_stage);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_SLOW_RANKS_STAGE_SPLIT_H_
