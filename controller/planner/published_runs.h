// Published large training runs as planner inputs: the data file of the
// published-runs suite (testdata/published_runs.yaml, each run with the
// paper or report it comes from) read into job specs, a topology and the
// published layout. Used by published_runs_test.cc and the
// `published-plans` bench. The file's format is described in its header.
//
// Pure functions; thread-safe.
#ifndef LOOM_CONTROLLER_PLANNER_PUBLISHED_RUNS_H_
#define LOOM_CONTROLLER_PLANNER_PUBLISHED_RUNS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/planner/planner.h"
#include "loom/v1/job.pb.h"

namespace loom::planner {

struct PublishedRun {
  std::string name;    // e.g. "bloom-176b"
  std::string source;  // the paper or report, with section and table
  std::string style;   // "gpt", "bloom" or "llama": the family it stands for
  ClusterTopology topology;
  // The run as a user writes it for `loomctl plan`, defaulted: no schedule,
  // no micro-batch, parallelism.auto; and with the published layout pinned.
  loom::v1::JobSpec auto_spec;
  loom::v1::JobSpec published_spec;
  // The planner's input for the run (model, batch, precision, topology),
  // converted from auto_spec as loomctl converts it; default options but
  // for the cost model's kernels and pipeline sends, which the data file's
  // `framework` sets to what the run's framework did.
  PlanRequest request;
  Layout published;  // every knob, recompute included (selective too)
  // What the source reports; 0 when it does not.
  double reported_tflops_per_device = 0;
  double reported_mfu = 0;
  // The reported TFLOP/s count recomputed FLOPs (hardware FLOPs).
  bool reported_counts_recompute = false;

  // Checks of the suite this run is known to fail, each with why (the
  // planner's model does not cover what the run did): the suite expects
  // them to fail, and flags them when they pass.
  std::map<std::string, std::string> known_gaps;

  int64_t devices() const { return topology.total_devices(); }
};

// Reads and checks the data file: INVALID_ARGUMENT naming the run and field
// for anything missing or malformed (a spec or topology that does not
// parse); NOT_FOUND when the file is missing. Does not validate the specs
// for planning: that is what the suite tests.
absl::StatusOr<std::vector<PublishedRun>> LoadPublishedRuns(const std::string& path);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_PUBLISHED_RUNS_H_
