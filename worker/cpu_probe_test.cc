#include "worker/cpu_probe.h"

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

}  // namespace
}  // namespace loom::worker
