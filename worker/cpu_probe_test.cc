#include "worker/cpu_probe.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

TEST(CpuProbeTest, MeasuresGemmAndBandwidthWithinTheBudget) {
  CpuProbe p = ProbeCpu(0.5);
  // The machine's BLAS may be OpenBLAS (tens of GFLOP/s per core) or the
  // reference one (~1 GFLOP/s); either is a positive, sane figure.
  EXPECT_GT(p.gemm_flops_per_second_per_thread, 1e8) << p.gemm_source;
  EXPECT_LT(p.gemm_flops_per_second_per_thread, 1e13) << p.gemm_source;
  EXPECT_GT(p.memory_bandwidth_bytes_per_second, 1e8);
  EXPECT_THAT(p.gemm_source, ::testing::StartsWith("sgemm 384^3"));
  EXPECT_LT(p.seconds, 1.5) << "registration must not wait long";
}

// The figure is per thread: OpenBLAS's OpenMP build runs on the calling
// thread's OpenMP thread count, which the probe lowers to one for the
// measurement (it reported the whole machine's rate as one thread's before)
// and gives back afterwards.
TEST(CpuProbeTest, MeasuresOnOneThreadAndRestoresTheThreadCount) {
  void* blas = dlopen("libblas.so.3", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(blas, nullptr) << "libblas.so.3 is a dependency of Loom";
  auto omp_set = reinterpret_cast<void (*)(int)>(dlsym(blas, "omp_set_num_threads"));
  auto omp_get = reinterpret_cast<int (*)()>(dlsym(blas, "omp_get_max_threads"));
  if (omp_set != nullptr) omp_set(3);
  CpuProbe p = ProbeCpu(0.2);
  EXPECT_EQ(p.gemm_threads, 1) << p.gemm_source;
  EXPECT_THAT(p.gemm_source, ::testing::HasSubstr(", 1 thread(s), "));
  if (omp_get != nullptr) {
    EXPECT_EQ(omp_get(), 3);
  }
  dlclose(blas);
}

// The rank binary measures a block's cost beyond its FLOPs; the worker
// reads its one line. No timing is asserted, only that the figures are
// there and in range: a fixed cost is a measured time less a modelled one,
// floored at 0, and on a machine another test loads it has come out 0.
TEST(BlockProbeTest, ReadsWhatTheRankBinaryMeasures) {
  absl::StatusOr<BlockProbe> probe = ProbeBlocks(LOOM_RANK_BINARY);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_GE(probe->fixed_seconds, 0) << probe->line;
  EXPECT_GE(probe->seconds_per_activation, 0) << probe->line;
  EXPECT_GE(probe->tensor_collective_extra_seconds, 0) << probe->line;
  EXPECT_THAT(probe->line, ::testing::HasSubstr(" tensor_collective_extra_seconds="));
  EXPECT_GE(probe->tensor_collective_idle_fraction, 0) << probe->line;
  EXPECT_LE(probe->tensor_collective_idle_fraction, 1) << probe->line;
  EXPECT_THAT(probe->line, ::testing::HasSubstr(" tensor_collective_idle_fraction="));
  EXPECT_GE(probe->concurrent_slowdown, 1) << probe->line;
  EXPECT_THAT(probe->line, ::testing::StartsWith("block_fixed_seconds="));
}

TEST(BlockProbeTest, ABinaryThatPrintsSomethingElseIsAnError) {
  absl::StatusOr<BlockProbe> echo = ProbeBlocks("/bin/echo");  // prints "--probe"
  EXPECT_EQ(echo.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(echo.status().message()), ::testing::HasSubstr("--probe"));
  EXPECT_EQ(ProbeBlocks("/nonexistent/loom-rank").status().code(), absl::StatusCode::kInternal);
}

// Hostile probe output: negative, infinite, non-numeric or missing figures
// are not taken (the worker then registers none and the planner counts
// FLOPs only).
TEST(BlockProbeTest, RefusesFiguresThatAreNotFiniteAndNonNegative) {
  const std::string dir = ::testing::TempDir();
  for (const char* line :
       {"block_fixed_seconds=-1 block_seconds_per_activation=1e-7",
        "block_fixed_seconds=inf block_seconds_per_activation=1e-7",
        "block_fixed_seconds=nan block_seconds_per_activation=1e-7",
        "block_fixed_seconds=abc block_seconds_per_activation=1e-7",
        "block_fixed_seconds=1e-4", "block_fixed_seconds block_seconds_per_activation=="}) {
    const std::string script = dir + "/fake-rank.sh";
    {
      std::ofstream out(script);
      out << "#!/bin/sh\necho '" << line << "'\n";
    }
    ASSERT_EQ(chmod(script.c_str(), 0755), 0);
    EXPECT_EQ(ProbeBlocks(script).status().code(), absl::StatusCode::kInternal) << line;
  }
}

}  // namespace
// Two workers of one host: the second waits while the first probes, and
// gives up (probing anyway, saying why) after its wait.
TEST(HostProbeLockTest, OneWorkerOfAHostProbesAtATime) {
  char pattern[] = "/tmp/loom_probe_lockXXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string path = std::string(pattern) + "/loom-probe.lock";
  {
    HostProbeLock first(path, 1);
    ASSERT_TRUE(first.held()) << first.note();
    EXPECT_TRUE(first.note().empty());
    // flock locks belong to the open file: a second open in this process
    // contends as another worker's would.
    HostProbeLock second(path, 0.2);
    EXPECT_FALSE(second.held());
    EXPECT_GE(second.waited_seconds(), 0.2);
    EXPECT_THAT(second.note(), ::testing::HasSubstr("another worker held"));
  }
  HostProbeLock after(path, 1);
  EXPECT_TRUE(after.held()) << after.note();
  EXPECT_LT(after.waited_seconds(), 0.2);
  HostProbeLock unopenable(std::string(pattern) + "/missing/dir/lock", 1);
  EXPECT_FALSE(unopenable.held());
  EXPECT_THAT(unopenable.note(), ::testing::HasSubstr("probing without the host's probe lock"));
  std::filesystem::remove_all(pattern);
}

}  // namespace loom::worker
