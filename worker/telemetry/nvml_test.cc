#include "worker/telemetry/nvml.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/telemetry/scoped_env.h"

#ifndef LOOM_FAKE_NVML_PATH
#error "LOOM_FAKE_NVML_PATH must name the nvml_fake_lib.cc shared library"
#endif

namespace loom::telemetry {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;


// The fake's own count of nvmlInit_v2 calls not yet shut down.
int LiveInits() {
  void* handle = dlopen(LOOM_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return -1;
  auto fn = reinterpret_cast<int (*)()>(dlsym(handle, "loom_fake_nvml_live_inits"));
  const int n = fn != nullptr ? fn() : -1;
  dlclose(handle);
  return n;
}

TEST(NvmlTest, MissingLibraryIsNotFound) {
  auto nvml = Nvml::Open("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(nvml.status().message()),
              StartsWith("/nonexistent/libnvidia-ml.so.1 not found: check LOOM_NVML_LIBRARY"));
}

TEST(NvmlTest, DefaultLibraryMissingSaysThereIsNoDriver) {
  auto nvml = Nvml::Open(Nvml::kDefaultLibrary);
  // Only a host without the driver can show this message (CI's and this
  // project's machines); MissingLibraryIsNotFound covers the same path by a
  // file name that exists nowhere.
  if (nvml.ok()) GTEST_SKIP() << "this host has an NVIDIA driver";
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(nvml.status().message()),
              StartsWith("libnvidia-ml.so.1 not found: no NVIDIA driver on this host (dlopen: "));
}

TEST(NvmlTest, LibraryWithoutNvmlIsFailedPrecondition) {
  auto nvml = Nvml::Open("libc.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(nvml.status().message(),
            "libc.so.6 has no nvmlInit_v2: the NVIDIA driver is too old for energy "
            "accounting; update it");
}

TEST(NvmlTest, ReadsTheFakeLibrary) {
  auto nvml = Nvml::Open(LOOM_FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_EQ((*nvml)->library(), LOOM_FAKE_NVML_PATH);
  auto count = (*nvml)->DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 2);

  // The fake's counter grows by 7500 mJ per reading.
  auto first = (*nvml)->TotalEnergyMillijoules(0);
  auto second = (*nvml)->TotalEnergyMillijoules(0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GE(*first, 1000000u);
  EXPECT_EQ(*second - *first, 7500u);
  // Device 1 has its own counter, a million mJ further on.
  auto other = (*nvml)->TotalEnergyMillijoules(1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_GE(*other, 2000000u);
  EXPECT_LT(*other, 3000000u);

  auto p0 = (*nvml)->PowerMilliwatts(0);
  auto p1 = (*nvml)->PowerMilliwatts(1);
  ASSERT_TRUE(p0.ok()) << p0.status();
  ASSERT_TRUE(p1.ok()) << p1.status();
  EXPECT_EQ(*p0, 250000u);
  EXPECT_EQ(*p1, 251000u);

  // Product names, as the rank uses them to look up its GPU's peak.
  auto n0 = (*nvml)->DeviceName(0);
  auto n1 = (*nvml)->DeviceName(1);
  ASSERT_TRUE(n0.ok()) << n0.status();
  ASSERT_TRUE(n1.ok()) << n1.status();
  EXPECT_EQ(*n0, "NVIDIA H200");
  EXPECT_EQ(*n1, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ((*nvml)->DeviceName(2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NvmlTest, DeviceOutOfRangeIsInvalidArgument) {
  auto nvml = Nvml::Open(LOOM_FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto e = (*nvml)->TotalEnergyMillijoules(2);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(),
            "nvmlDeviceGetHandleByIndex_v2: no GPU 2 on this host (NVML sees 2 GPUs)");
  auto p = (*nvml)->PowerMilliwatts(-1);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(), "GPU index -1 is negative");
}

TEST(NvmlTest, EnvironmentVariableChoosesTheLibrary) {
  ScopedEnv env(Nvml::kLibraryEnv, LOOM_FAKE_NVML_PATH);
  auto nvml = Nvml::Open();
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_EQ((*nvml)->library(), LOOM_FAKE_NVML_PATH);
}

TEST(NvmlTest, InitFailureSaysWhatToDo) {
  const int before = LiveInits();
  ScopedEnv fail("LOOM_FAKE_NVML_INIT_RC", "9");  // NVML_ERROR_DRIVER_NOT_LOADED
  auto nvml = Nvml::Open(LOOM_FAKE_NVML_PATH);
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(nvml.status().message(),
            "nvmlInit_v2: Driver Not Loaded (the nvidia kernel module is not loaded: does "
            "nvidia-smi work?)");
  EXPECT_EQ(LiveInits(), before);
}

TEST(NvmlTest, EnergyCounterNotSupportedNamesTheDevice) {
  auto nvml = Nvml::Open(LOOM_FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  ScopedEnv unsupported("LOOM_FAKE_NVML_ENERGY_RC", "3");  // NVML_ERROR_NOT_SUPPORTED
  auto e = (*nvml)->TotalEnergyMillijoules(0);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(e.status().message(),
            "nvmlDeviceGetTotalEnergyConsumption: Not Supported on device 0 (pre-Volta GPU)");
  // The power reading is independent of the counter.
  EXPECT_TRUE((*nvml)->PowerMilliwatts(0).ok());
}

TEST(NvmlTest, ErrorsKeepNvmlsWordsAndAddAHint) {
  auto nvml = Nvml::Open(LOOM_FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  ScopedEnv lost("LOOM_FAKE_NVML_POWER_RC", "15");  // NVML_ERROR_GPU_IS_LOST
  auto p = (*nvml)->PowerMilliwatts(1);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(p.status().message()),
              StartsWith("nvmlDeviceGetPowerUsage: GPU is lost on device 1"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("dmesg"));
}

TEST(NvmlTest, DestructionShutsNvmlDown) {
  const int before = LiveInits();
  ASSERT_GE(before, 0);
  {
    auto a = Nvml::Open(LOOM_FAKE_NVML_PATH);
    auto b = Nvml::Open(LOOM_FAKE_NVML_PATH);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(LiveInits(), before + 2);
  }
  EXPECT_EQ(LiveInits(), before);
}

}  // namespace
}  // namespace loom::telemetry
