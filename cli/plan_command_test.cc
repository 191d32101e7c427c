// `loomctl plan SPEC --topology T` as a library (plan_command.h) on the specs
// under examples/: every example plans without a schedule, since
// a person asking how to lay a model out often has no step count yet.
#include "cli/plan_command.h"

#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/jobspec.h"
#include "controller/planner/topology_yaml.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::cli {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kExamples = LOOM_SOURCE_DIR "/examples";

// Each example job spec and the cluster it is planned on: its own workers
// as 8-GPU nodes when it names them, else the topology its comment names.
const std::map<std::string, std::string>& ExampleTopologies() {
  static const auto* topologies = new std::map<std::string, std::string>{
      {"gpt-tiny.yaml",
       "device: A100-80GB\nnodes: 2\ndevices_per_node: 1\n"
       "inter_node: {bandwidth_gbit_per_s: 100, latency_us: 10}\n"},
      {"llama-tiny.yaml",
       "device: A100-80GB\nnodes: 2\ndevices_per_node: 1\n"
       "inter_node: {bandwidth_gbit_per_s: 100, latency_us: 10}\n"},
      {"gpt3-18b.yaml", "@topology-a100-80g-256.yaml"},
      {"gpt3-1t.yaml", "@topology-a100-80g-131072.yaml"},
  };
  return *topologies;
}

absl::StatusOr<planner::ClusterTopology> Topology(const std::string& entry) {
  if (entry[0] == '@') return planner::LoadTopologyFile(kExamples + "/" + entry.substr(1));
  return planner::ParseTopologyYaml(entry);
}

TEST(PlanCommandTest, EveryExampleSpecIsCovered) {
  for (const auto& file : std::filesystem::directory_iterator(kExamples)) {
    const std::string name = file.path().filename().string();
    if (file.path().extension() != ".yaml" || name.rfind("topology-", 0) == 0) continue;
    EXPECT_EQ(ExampleTopologies().count(name), 1u)
        << name << ": a new example spec needs a topology in this test";
  }
}

TEST(PlanCommandTest, EveryExamplePlansWithoutASchedule) {
  for (const auto& [name, topology_entry] : ExampleTopologies()) {
    SCOPED_TRACE(name);
    absl::StatusOr<loom::v1::JobSpec> spec = LoadJobSpecFile(kExamples + "/" + name);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->clear_schedule();
    // Only the planning-only examples are missing a layout's worth of
    // devices in resources; the topology gives them.
    ApplyJobSpecDefaults(&*spec);
    ASSERT_TRUE(ValidatePlanSpec(*spec).ok()) << ValidatePlanSpec(*spec);
    // A run does need the schedule.
    EXPECT_THAT(std::string(ValidateJobSpec(*spec).message()), HasSubstr("schedule.total_steps"));
    absl::StatusOr<planner::ClusterTopology> topology = Topology(topology_entry);
    ASSERT_TRUE(topology.ok()) << topology.status();
    PlanCommandOptions options;
    const auto& par = spec->parallelism();
    options.evaluate_spec_layout = !par.auto_() && par.data() > 0 &&
                                   static_cast<int64_t>(par.data()) * std::max(1, par.tensor()) *
                                           std::max(1, par.pipeline()) ==
                                       topology->total_devices();
    absl::StatusOr<std::string> report = RunPlan(*spec, *topology, options);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_THAT(*report, HasSubstr("tp "));
    // No token budget: no "time to train 1.2T tokens" row.
    EXPECT_THAT(*report, Not(ContainsRegex("time to train [0-9]")));
  }
}

}  // namespace
}  // namespace loom::cli
