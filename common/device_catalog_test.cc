// The device catalog: names as people and NVML write them, peaks per
// precision, GEMM efficiency.
#include "common/device_catalog.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(CatalogTest, KnowsTheIssueDevices) {
  for (const char* name : {"V100", "A100-40GB", "A100-80GB", "H100-SXM", "H200", "A100-PCIe-40GB",
                           "A100-PCIe-80GB", "H100-PCIe", "H100-NVL", "H200-NVL"}) {
    EXPECT_TRUE(LookupDevice(name).ok()) << name;
  }
  EXPECT_EQ(CatalogDeviceNames().size(), 10u);
}

TEST(CatalogTest, FiguresPerPrecision) {
  absl::StatusOr<DeviceSpec> h100 = LookupDevice("h100");  // alias
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->name, "H100-SXM");
  EXPECT_DOUBLE_EQ(h100->PeakFlops(MatmulPrecision::kBf16), 989.4e12);
  EXPECT_DOUBLE_EQ(h100->PeakFlops(MatmulPrecision::kFp8), 1978.9e12);
  // Memory as nvidia-smi reports it, in MiB: an "80 GB" H100 has 79.6 GiB.
  EXPECT_EQ(h100->memory_bytes, int64_t{81559} << 20);
  absl::StatusOr<DeviceSpec> a100 = LookupDevice("a100_80");
  ASSERT_TRUE(a100.ok());
  EXPECT_DOUBLE_EQ(a100->PeakFlops(MatmulPrecision::kBf16), 312e12);
  EXPECT_EQ(a100->PeakFlops(MatmulPrecision::kFp8), 0);  // Ampere has no fp8
  EXPECT_EQ(a100->memory_bytes, int64_t{80} << 30);
  absl::StatusOr<DeviceSpec> h200 = LookupDevice("H200");
  ASSERT_TRUE(h200.ok());
  EXPECT_EQ(h200->memory_bytes, int64_t{143771} << 20);
  absl::StatusOr<DeviceSpec> v100 = LookupDevice("V100");
  ASSERT_TRUE(v100.ok());
  EXPECT_EQ(v100->PeakFlops(MatmulPrecision::kBf16), 0);  // Volta has no bf16
  EXPECT_DOUBLE_EQ(v100->PeakFlops(MatmulPrecision::kFp16), 125e12);
}

TEST(CatalogTest, UnknownDeviceListsTheKnownOnes) {
  absl::StatusOr<DeviceSpec> device = LookupDevice("B200");
  EXPECT_EQ(device.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(device.status().message(),
            "unknown device \"B200\"; known: V100, A100-40GB, A100-80GB, A100-PCIe-40GB, "
            "A100-PCIe-80GB, H100-SXM, H200, H100-PCIe, H100-NVL, H200-NVL, or \"cpu\" with a "
            "measured peak");
}

// Device names as people write them in a topology file or on the command
// line (for the planner's fidelity) resolve to the catalog.
TEST(CatalogTest, NamesAsPeopleWriteThem) {
  const std::pair<const char*, const char*> cases[] = {
      {"H100-80GB", "H100-SXM"},       {"H100 SXM5 80GB", "H100-SXM"},
      {"H100 SXM", "H100-SXM"},        {"h100_sxm5", "H100-SXM"},
      {"NVIDIA H100 80GB HBM3", "H100-SXM"},
      {"A100-SXM4-80GB", "A100-80GB"}, {"A100 80GB", "A100-80GB"},
      {"a100-80", "A100-80GB"},        {"NVIDIA A100-SXM4-40GB", "A100-40GB"},
      {"A100 40GB", "A100-40GB"},      {"Tesla V100-SXM2-32GB", "V100"},
      {"V100 SXM2", "V100"},           {"H200 SXM 141GB", "H200"},
      {"h200", "H200"},                {"H100 PCIe", "H100-PCIe"},
      {"H100 NVL", "H100-NVL"},        {"H200-NVL", "H200-NVL"},
  };
  for (const auto& [written, name] : cases) {
    absl::StatusOr<DeviceSpec> device = LookupDevice(written);
    ASSERT_TRUE(device.ok()) << written << ": " << device.status();
    EXPECT_EQ(device->name, name) << written;
  }
  // Not guessed: "A100" alone could be either memory size, and no SXM H100
  // has 94 GB.
  for (const char* unknown : {"A100", "H100 SXM5 94GB"}) {
    absl::StatusOr<DeviceSpec> device = LookupDevice(unknown);
    EXPECT_EQ(device.status().code(), absl::StatusCode::kNotFound) << unknown;
    EXPECT_THAT(std::string(device.status().message()),
                testing::HasSubstr("known: V100, A100-40GB, A100-80GB"))
        << unknown;
  }
}

// Product names as NVML reports them map to the catalog (the worker's GPU
// ranks take their MFU peak from it).
TEST(CatalogTest, NvidiaProductNamesMapToTheCatalog) {
  const std::pair<const char*, const char*> cases[] = {
      {"NVIDIA H200", "H200"},
      {"NVIDIA H100 80GB HBM3", "H100-SXM"},
      {"NVIDIA H100 PCIe", "H100-PCIe"},
      {"NVIDIA H100 NVL", "H100-NVL"},
      {"NVIDIA H200 NVL", "H200-NVL"},
      {"NVIDIA A100-SXM4-80GB", "A100-80GB"},
      {"NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"},
      {"NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"},
      {"Tesla V100-SXM2-32GB", "V100"},
  };
  for (const auto& [product, name] : cases) {
    absl::StatusOr<DeviceSpec> device = LookupDeviceByProductName(product);
    ASSERT_TRUE(device.ok()) << product << ": " << device.status();
    EXPECT_EQ(device->name, name) << product;
  }
  EXPECT_DOUBLE_EQ(LookupDeviceByProductName("NVIDIA H200")->PeakFlops(MatmulPrecision::kBf16),
                   989.4e12);
  // The PCIe and NVL boards do not get the SXM part's peak.
  EXPECT_DOUBLE_EQ(LookupDeviceByProductName("NVIDIA H100 PCIe")->PeakFlops(MatmulPrecision::kBf16),
                   756e12);
  EXPECT_DOUBLE_EQ(LookupDeviceByProductName("NVIDIA H200 NVL")->PeakFlops(MatmulPrecision::kBf16),
                   835.5e12);
  EXPECT_DOUBLE_EQ(LookupDeviceByProductName("NVIDIA H100 NVL")->PeakFlops(MatmulPrecision::kBf16),
                   835.5e12);
  // A PCIe board the catalog lacks, and Grace Hopper, are refused by name.
  for (const char* product : {"Tesla V100-PCIE-16GB", "NVIDIA GH200 480GB"}) {
    absl::StatusOr<DeviceSpec> refused = LookupDeviceByProductName(product);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << product;
    EXPECT_THAT(std::string(refused.status().message()), testing::HasSubstr(product));
  }
  // The catalog's own names and their spellings reach the new entries.
  EXPECT_EQ(LookupDevice("h100-pcie")->name, "H100-PCIe");
  EXPECT_EQ(LookupDevice("H200 NVL")->name, "H200-NVL");
  absl::StatusOr<DeviceSpec> unknown = LookupDeviceByProductName("NVIDIA GeForce RTX 4090");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), testing::HasSubstr("RTX 4090"));
}

TEST(GemmEfficiencyTest, SaturatesWithSize) {
  const GemmEfficiency eff{0.8, 100, 200};
  EXPECT_DOUBLE_EQ(eff.At(100, 200), 0.8 * 0.5 * 0.5);
  EXPECT_LT(eff.At(768, 2048), eff.At(3200, 2048));
  EXPECT_LT(eff.At(3200, 2048), 0.8);
  EXPECT_GT(eff.At(1e9, 1e9), 0.7999);
}

}  // namespace
}  // namespace loom
