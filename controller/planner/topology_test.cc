#include "controller/planner/topology.h"

#include <ostream>
#include <string>
#include <utility>

#include "controller/planner/topology_yaml.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

TEST(LocalCpuTest, UsesTheMeasuredPeak) {
  LocalCpuMeasurement measured;
  measured.peak_flops_fp32 = 2.5e11;
  measured.memory_bytes = 16000000000;
  measured.memory_bandwidth_bytes_per_second = 2e10;
  absl::StatusOr<DeviceSpec> cpu = LocalCpuDevice(measured);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->PeakFlops(Precision::kFp32), 2.5e11);
  EXPECT_EQ(cpu->PeakFlops(Precision::kBf16), 2.5e11);
  EXPECT_EQ(cpu->efficiency.At(8, 8), 1.0);
  measured.peak_flops_fp32 = 0;
  EXPECT_EQ(LocalCpuDevice(measured).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TopologyYamlTest, ParsesTheExampleFile) {
  absl::StatusOr<ClusterTopology> topo =
      LoadTopologyFile(std::string(LOOM_SOURCE_DIR) + "/examples/topology-a100-80g-256.yaml");
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_EQ(topo->name, "a100-80g-256");
  EXPECT_EQ(topo->device.name, "A100-80GB");
  EXPECT_EQ(topo->total_devices(), 256);
  EXPECT_DOUBLE_EQ(topo->intra_node_bandwidth_bytes_per_second, 300e9);
  EXPECT_DOUBLE_EQ(topo->inter_node_bandwidth_bytes_per_second, 25e9);  // 200 Gb/s
  EXPECT_DOUBLE_EQ(topo->inter_node_latency_seconds, 10e-6);
  EXPECT_EQ(topo->racks(), 8);
  EXPECT_EQ(topo->effective_device_power_watts(), 400);
  EXPECT_EQ(topo->host_power_watts, 2500);
  EXPECT_EQ(topo->price_per_device_hour_usd, 2.0);
}

TEST(TopologyYamlTest, DefaultsComeFromTheCatalog) {
  absl::StatusOr<ClusterTopology> topo =
      ParseTopologyYaml("device: H200\nnodes: 1\ndevices_per_node: 8\n");
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_EQ(topo->name, "1x8 H200");
  EXPECT_DOUBLE_EQ(topo->intra_node_bandwidth_bytes_per_second, 450e9);
  EXPECT_EQ(topo->effective_device_power_watts(), 700);
}

TEST(TopologyYamlTest, OverridesReplaceCatalogFigures) {
  absl::StatusOr<ClusterTopology> topo = ParseTopologyYaml(R"(
device: A100-40GB
nodes: 1
devices_per_node: 4
device_overrides:
  memory_gb: 38
  peak_tflops: {bf16: 280}
  efficiency: {max: 0.6}
)");
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_EQ(topo->device.memory_bytes, 38000000000);
  EXPECT_DOUBLE_EQ(topo->device.peak_flops_bf16, 280e12);
  EXPECT_DOUBLE_EQ(topo->device.peak_flops_fp16, 312e12);  // untouched
  EXPECT_DOUBLE_EQ(topo->device.efficiency.max_fraction, 0.6);
}

TEST(TopologyYamlTest, CpuTakesTheMeasurementFromTheCaller) {
  const std::string yaml = "device: cpu\nnodes: 2\ndevices_per_node: 1\n"
                           "inter_node: {bandwidth_gbit_per_s: 10}\n";
  absl::StatusOr<ClusterTopology> without = ParseTopologyYaml(yaml);
  EXPECT_EQ(without.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(without.status().message().substr(0, 36), "device: \"cpu\" needs a measured peak:");
  LocalCpuMeasurement measured{1e11, 8000000000, 1e10, 65};
  absl::StatusOr<ClusterTopology> with = ParseTopologyYaml(yaml, &measured);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->device.PeakFlops(Precision::kFp32), 1e11);
  EXPECT_EQ(with->effective_device_power_watts(), 65);
  absl::StatusOr<ClusterTopology> overrides = ParseTopologyYaml(
      yaml + "device_overrides: {memory_gb: 8, hbm_bandwidth_gb_per_s: 10, "
             "peak_tflops: {fp32: 0.1}}\n");
  ASSERT_TRUE(overrides.ok()) << overrides.status();
  EXPECT_DOUBLE_EQ(overrides->device.PeakFlops(Precision::kBf16), 0.1e12);
}

struct BadYaml {
  const char* yaml;
  const char* message;
};

void PrintTo(const BadYaml& bad, std::ostream* os) { *os << bad.message; }

class TopologyYamlErrorTest : public ::testing::TestWithParam<BadYaml> {};

TEST_P(TopologyYamlErrorTest, NamesTheFieldPath) {
  absl::StatusOr<ClusterTopology> topo = ParseTopologyYaml(GetParam().yaml);
  EXPECT_EQ(topo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(topo.status().message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TopologyYamlErrorTest,
    ::testing::Values(
        BadYaml{"device: A100-80GB\nnodes: 4\ndevices_per_node: 8\n"
                "inter_node: {bandwidth_gbit_per_s: fast}\n",
                "inter_node.bandwidth_gbit_per_s: expected a number, got \"fast\""},
        BadYaml{"device: A100-80GB\nnodes: 4\ndevices_per_node: 8\n"
                "inter_node: {bandwidth_gbit_per_s: \"200\"}\n",
                "inter_node.bandwidth_gbit_per_s: expected a number, got \"200\""},
        BadYaml{"device: A100-80GB\nnodes: 4\ndevices_per_node: 8\n"
                "inter_node: {bandwidth_gbit_per_s: 200}\nracks: {nodes_per_rak: 2}\n",
                "racks.nodes_per_rak: unknown field (did you mean \"nodes_per_rack\"?)"},
        BadYaml{"device: A100-80GB\nnodes: 4\ndevices_per_node: 8\n"
                "inter_node: {bandwidth_gbit_per_s: 200}\nracks: {nodes_per_rack: 3}\n",
                "racks.nodes_per_rack: 3 does not divide nodes 4"},
        BadYaml{"device: A100-80GB\nnodes: 4\ndevices_per_node: 8\n",
                "inter_node.bandwidth_gbit_per_s: required when nodes > 1"},
        BadYaml{"device: A100-80GB\nnodes: 4.5\ndevices_per_node: 8\n",
                "nodes: expected an integer, got \"4.5\""},
        BadYaml{"device: A100-80GB\nnodes: 0\ndevices_per_node: 8\n", "nodes: must be >= 1, got 0"},
        BadYaml{"nodes: 1\ndevices_per_node: 8\n", "device: required"},
        BadYaml{"device: TPUv5\nnodes: 1\ndevices_per_node: 8\n",
                "device: unknown device \"TPUv5\"; known: V100, A100-40GB, A100-80GB, "
                "A100-PCIe-40GB, A100-PCIe-80GB, H100-SXM, H200, H100-PCIe, H100-NVL, H200-NVL, "
                "or \"cpu\" with a measured peak"},
        BadYaml{"device: H100\nnodes: 1\ndevices_per_node: 8\ndevice_overrides:\n"
                "  peak_tflops: {bf61: 1}\n",
                "device_overrides.peak_tflops.bf61: unknown field (did you mean \"bf16\"?)"},
        BadYaml{"device: H100\nnodes: 1\ndevices_per_node: 8\ndevice_overrides:\n"
                "  efficiency: {max: 1.5}\n",
                "device_overrides.efficiency.max: must be in (0, 1]"},
        BadYaml{"device: H100\nnodes: 1\ndevices_per_node: 8\npower: {host_watts: -5}\n",
                "power.host_watts: must be >= 0, got -5"},
        BadYaml{"device: H100\nnodes: 1\nnodes: 2\ndevices_per_node: 8\n",
                "nodes: given more than once"},
        BadYaml{"device: H100\nnodes: 1\ndevices_per_node: 8\nintra_node: 300\n",
                "intra_node: expected a mapping, got \"300\""},
        BadYaml{"- device: H100\n", "topology: expected a mapping, got a list"},
        BadYaml{"", "topology: empty"},
        BadYaml{"device: [H100\n",
                "topology: invalid YAML at line 2, column 1: end of sequence flow not found"}));

TEST(TopologyYamlTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadTopologyFile("/nonexistent/topology.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(MakeTopologyTest, BuildsFromTheCatalog) {
  absl::StatusOr<ClusterTopology> topo = MakeTopology("A100-80GB", 32, 8, 25e9);
  ASSERT_TRUE(topo.ok());
  EXPECT_EQ(topo->total_devices(), 256);
  EXPECT_EQ(MakeTopology("A100-80GB", 2, 8, 0).status().message(),
            "inter_node.bandwidth_gbit_per_s: required when nodes > 1");
}

}  // namespace
}  // namespace loom::planner
