// libFuzzer target: the cluster topology YAML parser (`loomctl plan
// --topology`, the Plan RPC's topology text). Built only in the fuzz build.
#include <cstddef>
#include <cstdint>
#include <string>

#include "controller/planner/topology_yaml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  loom::planner::LocalCpuMeasurement cpu;
  cpu.peak_flops_fp32 = 100e9;
  cpu.memory_bytes = int64_t{16} << 30;
  cpu.memory_bandwidth_bytes_per_second = 10e9;
  (void)loom::planner::ParseTopologyYaml(text, &cpu).ok();
  (void)loom::planner::ParseTopologyYaml(text, nullptr).ok();
  return 0;
}
