// plan-accuracy: the planner's step time against the measured one, for every
// kind of layout the engine executes: the planner's accuracy against
// measurement.
//
// Starts a real local Loom (controller + 2 workers of 2 slots; each worker
// measures its GEMM rate and copy bandwidth at start-up and reports them),
// and for each layout (one rank alone, the baseline of the compute model;
// DP2, TP2, PP2 with m = 8, TP2 x PP2, ZeRO-1 and ZeRO-2 DP2) asks
// the controller's planner for the spec's own layout on the live cluster
// (`loomctl -o json plan SPEC`: spec_layout.step_seconds and its split),
// trains the same spec, and takes the median step time of its steps after
// the first two. Pipelines also print the measured bubble (the first
// stage's median share of the step spent waiting on its neighbours,
// StepMetrics.pipeline_wait_seconds) against the planner's and
// (p - 1) / (m + p - 1).
// The last line is
//   plan-accuracy: worst |predicted/measured - 1| = <x> ratio=<x>
//
// The machine has 2 cores: a 4-rank layout shares them between 4 ranks,
// which the planner's one-device-per-slot model does not know; its line
// says so.
//
// Usage: loom_plan_accuracy_bench BIN_DIR [steps=14]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cli/local_cluster.h"
#include "common/file_util.h"
#include "loom/v1/service.grpc.pb.h"
#include "tests/test_util.h"

namespace {

int Die(const std::string& msg) {
  std::cerr << "plan-accuracy bench: " << msg << std::endl;
  return 1;
}

struct Case {
  std::string name;
  int workers, ranks, data, tensor, pipeline, zero_stage;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Die("usage: loom_plan_accuracy_bench BIN_DIR [steps]");
  using loom::testing::RunCommand;
  const std::string bin = argv[1];
  const int steps = argc > 2 ? std::atoi(argv[2]) : 14;
  if (steps < 4) return Die("steps must be >= 4");
  const std::string home = loom::testing::MakeTempDir("loom_plan_accuracy_bench");
  const std::string ctl = absl::StrCat(bin, "/loomctl --home ", home, " ");
  auto up = RunCommand(ctl + "local up --workers 2 --slots 2");
  if (up.exit_code != 0) return Die(up.err);
  const loom::testing::RunOnExit down(ctl + "local down");
  auto prep = RunCommand(ctl + "data prepare --input /usr/share/games/fortunes/fortunes "
                               "/usr/share/games/fortunes/literature --out " + home + "/data");
  if (prep.exit_code != 0) return Die(prep.err);

  auto info = loom::cli::ReadReadyFile(home + "/run/controller.json");
  auto token = loom::ReadFile(home + "/token");
  if (!info.ok() || !token.ok()) return Die("no controller");
  auto stub = loom::v1::JobService::NewStub(
      *loom::cli::LocalControllerChannel(home, info->grpc_address));
  const std::string bearer = "Bearer " + std::string(absl::StripAsciiWhitespace(*token));

  const std::vector<Case> cases = {
      {"1 rank", 1, 1, 1, 1, 1, 0},    {"DP2", 2, 2, 2, 1, 1, 0},
      {"TP2", 1, 2, 1, 2, 1, 0},
      {"PP2", 2, 2, 1, 1, 2, 0},       {"TP2xPP2", 2, 4, 1, 2, 2, 0},
      {"ZeRO-1 DP2", 2, 2, 2, 1, 1, 1}, {"ZeRO-2 DP2", 2, 2, 2, 1, 1, 2},
  };
  constexpr int kGlobalBatch = 8, kMicroBatch = 1;
  double worst = 0;
  std::printf("%-12s %12s %12s %8s   %s\n", "layout", "predicted s", "measured s", "pred/meas",
              "planner's split (s)");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string name = absl::StrCat("acc", i);
    const std::string spec = absl::StrCat(home, "/", name, ".yaml");
    std::ofstream(spec) << "name: " << name << R"(
model:
  gpt: {n_layer: 4, n_head: 4, d_model: 256, seq_len: 128, vocab_size: 256}
data: {train: ["data/train_*.bin"]}
optimizer:
  adamw: {lr: 0.001, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )" << steps << R"(, warmup_steps: 2}
batch: {global_batch: )" << kGlobalBatch << ", micro_batch: " << kMicroBatch << R"(}
resources: {workers: )" << c.workers << ", ranks: " << c.ranks << R"(}
parallelism: {data: )" << c.data << ", tensor: " << c.tensor << ", pipeline: " << c.pipeline
                        << ", zero_stage: " << c.zero_stage << R"(}
recovery: {disable_spike_detection: true}
seed: 3
)";
    auto plan = RunCommand(ctl + "-o json plan " + spec);
    if (plan.exit_code != 0) return Die(c.name + ": plan: " + plan.err);
    loom::v1::PlanResponse planned;
    if (!google::protobuf::util::JsonStringToMessage(plan.out, &planned).ok() ||
        !planned.has_spec_layout()) {
      return Die(c.name + ": no evaluation of the spec's layout in: " + plan.out);
    }
    const loom::v1::PlannedLayout& p = planned.spec_layout();

    auto run = RunCommand(ctl + "submit --follow " + spec);
    if (run.exit_code != 0) return Die(c.name + ": " + run.out + run.err);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", bearer);
    loom::v1::GetStepMetricsRequest req;
    req.set_job_id(name + "-" + std::to_string(i + 1));
    loom::v1::GetStepMetricsResponse metrics;
    const grpc::Status got = stub->GetStepMetrics(&ctx, req, &metrics);
    if (!got.ok()) return Die(c.name + ": step metrics: " + got.error_message());
    std::vector<double> seconds, waits, compute, comm, optimizer;
    for (const auto& m : metrics.steps()) {
      if (m.step() <= 2) continue;
      seconds.push_back(m.step_time_seconds());
      waits.push_back(m.pipeline_wait_seconds() / m.step_time_seconds());
      compute.push_back(m.compute_seconds());
      comm.push_back(m.comm_seconds());
      optimizer.push_back(m.optimizer_seconds());
    }
    if (seconds.empty()) return Die(c.name + ": no step times");
    std::sort(seconds.begin(), seconds.end());
    std::sort(waits.begin(), waits.end());
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double measured = seconds[seconds.size() / 2];
    const double measured_bubble = waits[waits.size() / 2];
    const double ratio = p.step_seconds() / measured;
    worst = std::max(worst, std::abs(ratio - 1));
    std::printf("%-12s %12.4f %12.4f %8.3f   compute %.4f, TP %.4f, PP p2p %.4f, bubble %.4f, "
                "DP exposed %.4f, optimizer %.4f%s\n",
                c.name.c_str(), p.step_seconds(), measured, ratio, p.compute_seconds(),
                p.tensor_parallel_comm_seconds(), p.pipeline_p2p_seconds(),
                p.pipeline_bubble_seconds(), p.data_parallel_exposed_seconds(),
                p.optimizer_seconds(), c.ranks > 2 ? " (4 ranks on 2 cores)" : "");
    // What rank 0 reported (compute includes TP all-reduces and pipeline
    // waits; comm is the exposed data-parallel part).
    std::printf("%-12s measured split (s): compute %.4f, DP exposed %.4f, optimizer %.4f\n", "",
                median(compute), median(comm), median(optimizer));
    if (c.pipeline > 1) {
      const int m = kGlobalBatch / (c.data * kMicroBatch);
      const double formula = (c.pipeline - 1.0) / (m + c.pipeline - 1.0);
      const double planned_bubble =
          p.step_seconds() > 0 ? p.pipeline_bubble_seconds() / p.step_seconds() : 0;
      std::printf("%-12s bubble: measured %.3f of the step (the first stage's wait on its "
                  "neighbours, transfers included), planner %.3f, (p-1)/(m+p-1) = %.3f "
                  "(p %d, m %d)\n",
                  "", measured_bubble, planned_bubble, formula, c.pipeline, m);
    }
  }
  std::printf("plan-accuracy: worst |predicted/measured - 1| = %.3f ratio=%.3f\n", worst, worst);
  return 0;
}
