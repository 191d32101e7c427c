#include "controller/elastic/elastic.h"

#include <algorithm>
#include <functional>

namespace loom::controller {

std::vector<ElasticShape> ElasticCandidates(const std::vector<int>& free_slots, int min_ranks,
                                            int max_ranks) {
  std::vector<int> free = free_slots;
  std::sort(free.begin(), free.end(), std::greater<int>());
  while (!free.empty() && free.back() <= 0) free.pop_back();
  std::vector<ElasticShape> out;
  for (int ranks = max_ranks; ranks >= std::max(1, min_ranks); --ranks) {
    for (int workers = 1; workers <= static_cast<int>(free.size()) && workers <= ranks; ++workers) {
      // An uneven split gives the first ranks % workers workers one rank
      // more (scheduler.h, RanksPerWorker): the largest offers take those.
      const int base = ranks / workers;
      const int larger = ranks % workers;
      bool fits = true;
      for (int i = 0; i < workers && fits; ++i) fits = free[i] >= base + (i < larger ? 1 : 0);
      if (fits) {
        out.push_back({ranks, workers});
        break;
      }
    }
  }
  return out;
}

loom::v1::JobSpec SpecForShape(const loom::v1::JobSpec& spec, ElasticShape shape) {
  loom::v1::JobSpec out = spec;
  out.mutable_resources()->set_ranks(shape.ranks);
  out.mutable_resources()->set_workers(shape.workers);
  loom::v1::ParallelismSpec* par = out.mutable_parallelism();
  par->set_auto_(true);
  par->set_data(0);
  par->set_tensor(0);
  par->set_pipeline(0);
  par->set_zero_stage(0);
  par->clear_stage_layers();  // the planner splits the new stages
  return out;
}

}  // namespace loom::controller
