#include "common/device_catalog.h"

#include <cctype>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom {

absl::string_view PrecisionName(MatmulPrecision precision) {
  switch (precision) {
    case MatmulPrecision::kFp32: return "fp32";
    case MatmulPrecision::kTf32: return "tf32";
    case MatmulPrecision::kBf16: return "bf16";
    case MatmulPrecision::kFp16: return "fp16";
    case MatmulPrecision::kFp8: return "fp8";
  }
  return "?";
}

double GemmEfficiency::At(double hidden_per_device, double tokens) const {
  const double width = half_width > 0 ? hidden_per_device / (hidden_per_device + half_width) : 1.0;
  const double length = half_tokens > 0 ? tokens / (tokens + half_tokens) : 1.0;
  return max_fraction * width * length;
}

double DeviceSpec::PeakFlops(MatmulPrecision precision) const {
  switch (precision) {
    case MatmulPrecision::kFp32: return peak_flops_fp32;
    case MatmulPrecision::kTf32: return peak_flops_tf32;
    case MatmulPrecision::kBf16: return peak_flops_bf16;
    case MatmulPrecision::kFp16: return peak_flops_fp16;
    case MatmulPrecision::kFp8: return peak_flops_fp8;
  }
  return 0;
}

namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
// Device memory is sized in binary units: the total nvidia-smi reports, in
// MiB (an "80 GB" A100 or H100 has 80 GiB, 85.9e9 bytes, less on the H100
// what the driver keeps back).
constexpr int64_t kMiB = int64_t{1} << 20;

// Vendor datasheet figures, dense (no 2:4 sparsity: half the starred
// figures of the datasheets). The plain names are the SXM form factors; the
// PCIe and NVL boards run at lower clocks and power, so their peaks differ
// and they have entries of their own. NVLink bandwidth is per direction:
// V100 300 GB/s, A100 600 GB/s and H100/H200 900 GB/s are the bidirectional
// totals NVIDIA quotes; a PCIe board without a bridge talks to its
// neighbours over PCIe (Gen4 x16 ~32 GB/s, Gen5 x16 ~64 GB/s per direction).
std::vector<DeviceSpec> Catalog() {
  std::vector<DeviceSpec> catalog;
  DeviceSpec v100;
  v100.name = "V100";
  v100.memory_bytes = 32768 * kMiB;
  v100.peak_flops_fp32 = 15.7 * kTera;
  v100.peak_flops_fp16 = 125 * kTera;
  v100.hbm_bandwidth_bytes_per_second = 900 * kGiga;
  v100.intra_node_bandwidth_bytes_per_second = 150 * kGiga;
  v100.power_watts = 300;
  catalog.push_back(v100);

  DeviceSpec a100_40;
  a100_40.name = "A100-40GB";
  a100_40.memory_bytes = 40960 * kMiB;
  a100_40.peak_flops_fp32 = 19.5 * kTera;
  a100_40.peak_flops_tf32 = 156 * kTera;
  a100_40.peak_flops_bf16 = 312 * kTera;
  a100_40.peak_flops_fp16 = 312 * kTera;
  a100_40.hbm_bandwidth_bytes_per_second = 1555 * kGiga;
  a100_40.intra_node_bandwidth_bytes_per_second = 300 * kGiga;
  a100_40.power_watts = 400;
  catalog.push_back(a100_40);

  DeviceSpec a100_80 = a100_40;
  a100_80.name = "A100-80GB";
  a100_80.memory_bytes = 81920 * kMiB;
  a100_80.hbm_bandwidth_bytes_per_second = 2039 * kGiga;
  catalog.push_back(a100_80);

  // The A100's PCIe boards keep the SXM part's peaks at lower power and
  // bandwidth.
  DeviceSpec a100_pcie_40 = a100_40;
  a100_pcie_40.name = "A100-PCIe-40GB";
  a100_pcie_40.intra_node_bandwidth_bytes_per_second = 32 * kGiga;
  a100_pcie_40.power_watts = 250;
  catalog.push_back(a100_pcie_40);

  DeviceSpec a100_pcie_80 = a100_80;
  a100_pcie_80.name = "A100-PCIe-80GB";
  a100_pcie_80.hbm_bandwidth_bytes_per_second = 1935 * kGiga;
  a100_pcie_80.intra_node_bandwidth_bytes_per_second = 32 * kGiga;
  a100_pcie_80.power_watts = 300;
  catalog.push_back(a100_pcie_80);

  DeviceSpec h100;
  h100.name = "H100-SXM";
  h100.memory_bytes = 81559 * kMiB;
  h100.peak_flops_fp32 = 67 * kTera;
  h100.peak_flops_tf32 = 494.7 * kTera;
  h100.peak_flops_bf16 = 989.4 * kTera;
  h100.peak_flops_fp16 = 989.4 * kTera;
  h100.peak_flops_fp8 = 1978.9 * kTera;
  h100.hbm_bandwidth_bytes_per_second = 3350 * kGiga;
  h100.intra_node_bandwidth_bytes_per_second = 450 * kGiga;
  h100.power_watts = 700;
  // Hopper's larger tiles need bigger GEMMs to saturate, and its dense
  // bf16 GEMMs top out nearer 70% of the datasheet peak.
  h100.efficiency.max_fraction = 0.72;
  h100.efficiency.half_width = 256;
  h100.efficiency.half_tokens = 256;
  catalog.push_back(h100);

  DeviceSpec h200 = h100;
  h200.name = "H200";
  h200.memory_bytes = 143771 * kMiB;
  h200.hbm_bandwidth_bytes_per_second = 4800 * kGiga;
  catalog.push_back(h200);

  // H100 PCIe: 80 GB HBM2e, 350 W, bf16 756 TFLOP/s dense.
  DeviceSpec h100_pcie = h100;
  h100_pcie.name = "H100-PCIe";
  h100_pcie.peak_flops_fp32 = 51.2 * kTera;
  h100_pcie.peak_flops_tf32 = 378 * kTera;
  h100_pcie.peak_flops_bf16 = 756 * kTera;
  h100_pcie.peak_flops_fp16 = 756 * kTera;
  h100_pcie.peak_flops_fp8 = 1513 * kTera;
  h100_pcie.hbm_bandwidth_bytes_per_second = 2000 * kGiga;
  h100_pcie.intra_node_bandwidth_bytes_per_second = 64 * kGiga;
  h100_pcie.power_watts = 350;
  catalog.push_back(h100_pcie);

  // H100 NVL: 94 GB HBM3 (95830 MiB as nvidia-smi reports it), 400 W, bf16
  // 835 TFLOP/s dense, NVLink bridges of 600 GB/s between pairs.
  DeviceSpec h100_nvl = h100;
  h100_nvl.name = "H100-NVL";
  h100_nvl.memory_bytes = 95830 * kMiB;
  h100_nvl.peak_flops_fp32 = 60 * kTera;
  h100_nvl.peak_flops_tf32 = 417.5 * kTera;
  h100_nvl.peak_flops_bf16 = 835.5 * kTera;
  h100_nvl.peak_flops_fp16 = 835.5 * kTera;
  h100_nvl.peak_flops_fp8 = 1670.5 * kTera;
  h100_nvl.hbm_bandwidth_bytes_per_second = 3900 * kGiga;
  h100_nvl.intra_node_bandwidth_bytes_per_second = 300 * kGiga;
  h100_nvl.power_watts = 400;
  catalog.push_back(h100_nvl);

  // H200 NVL: the H200's 141 GB at 4.8 TB/s, the H100 NVL's peaks, up to
  // 600 W, NVLink bridges of 900 GB/s.
  DeviceSpec h200_nvl = h100_nvl;
  h200_nvl.name = "H200-NVL";
  h200_nvl.memory_bytes = h200.memory_bytes;
  h200_nvl.hbm_bandwidth_bytes_per_second = 4800 * kGiga;
  h200_nvl.intra_node_bandwidth_bytes_per_second = 450 * kGiga;
  h200_nvl.power_watts = 600;
  catalog.push_back(h200_nvl);
  return catalog;
}

std::string Fold(absl::string_view name) {
  std::string folded;
  for (char c : name) {
    if (c == '-' || c == '_' || c == ' ') continue;
    folded.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return folded;
}

// Aliases (folded) -> catalog name.
const char* Alias(const std::string& folded) {
  struct Entry { const char* alias; const char* name; };
  static const Entry kAliases[] = {
      {"v100sxm2", "V100"},  {"v100sxm232gb", "V100"}, {"v10032gb", "V100"},
      {"a10040", "A100-40GB"}, {"a100sxm40gb", "A100-40GB"},
      {"a10080", "A100-80GB"}, {"a100sxm80gb", "A100-80GB"},
      {"h100", "H100-SXM"},  {"h100sxm5", "H100-SXM"}, {"h100sxm80gb", "H100-SXM"},
      {"h10080gb", "H100-SXM"},
      {"h200sxm", "H200"},   {"h200141gb", "H200"},
      {"a100pcie40gb", "A100-PCIe-40GB"}, {"a100pcie80gb", "A100-PCIe-80GB"},
      {"h100pcie80gb", "H100-PCIe"}, {"h100nvl94gb", "H100-NVL"}, {"h200nvl141gb", "H200-NVL"},
  };
  for (const Entry& entry : kAliases) {
    if (folded == entry.alias) return entry.name;
  }
  return nullptr;
}

// The name as people write it with the words that do not pick a catalog
// entry dropped, then folded: the vendor ("NVIDIA", "Tesla"), the SXM form
// factor and its generation ("SXM", "SXM4", "SXM5": every catalog entry is
// the SXM part) and the memory technology ("HBM3"). Words are split at '-',
// '_' and spaces, so "H100 SXM5 80GB" and "A100-SXM4-80GB" become "h10080gb"
// and "a10080gb". "PCIe" and "NVL" are kept: those boards are entries of
// their own ("H100 PCIe" is H100-PCIe, not H100-SXM).
std::string Canonical(absl::string_view name) {
  static const char* const kNoise[] = {"nvidia", "tesla", "sxm",  "sxm2", "sxm3", "sxm4",
                                       "sxm5",   "hbm2",  "hbm2e", "hbm3", "hbm3e"};
  std::string canonical;
  std::string word;
  auto flush = [&] {
    bool noise = false;
    for (const char* n : kNoise) noise |= word == n;
    if (!noise) canonical += word;
    word.clear();
  };
  for (char c : name) {
    if (c == '-' || c == '_' || c == ' ') {
      flush();
    } else {
      word.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  flush();
  return canonical;
}

// The catalog entry whose folded name or alias is `key`, or null.
const char* CatalogName(const std::vector<DeviceSpec>& catalog, const std::string& key) {
  if (const char* alias = Alias(key)) return alias;
  for (const DeviceSpec& device : catalog) {
    if (Fold(device.name) == key || Canonical(device.name) == key) return device.name.c_str();
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<DeviceSpec> LookupDeviceByProductName(absl::string_view product) {
  const std::string folded = Fold(product);
  auto has = [&](const char* part) { return folded.find(part) != std::string::npos; };
  auto unknown = [&](absl::string_view why) {
    return absl::NotFoundError(absl::StrCat("\"", product, "\" is not a GPU Loom knows the peak of",
                                            why, " (", absl::StrJoin(CatalogDeviceNames(), ", "),
                                            ")"));
  };
  // Grace Hopper's GPU is named "GH200": not the H200 board.
  if (has("gh200") || has("gh100")) return unknown(": a Grace Hopper superchip");
  const bool pcie = has("pcie"), nvl = has("nvl");
  if (pcie || nvl) {
    // The PCIe and NVL boards have their own peaks and power; one the
    // catalog lacks must not borrow the SXM part's.
    if (has("h200") && nvl) return LookupDevice("H200-NVL");
    if (has("h100") && nvl) return LookupDevice("H100-NVL");
    if (has("h100") && pcie) return LookupDevice("H100-PCIe");
    if (has("a100") && pcie) return LookupDevice(has("80g") ? "A100-PCIe-80GB" : "A100-PCIe-40GB");
    return unknown(absl::StrCat(": its ", pcie ? "PCIe" : "NVL",
                                " board's peak differs from the SXM part's, and the catalog has "
                                "no entry for it"));
  }
  if (has("h200")) return LookupDevice("H200");
  if (has("h100")) return LookupDevice("H100-SXM");
  if (has("a100")) return LookupDevice(has("80g") ? "A100-80GB" : "A100-40GB");
  if (has("v100")) return LookupDevice("V100");
  return unknown("");
}

std::vector<std::string> CatalogDeviceNames() {
  std::vector<std::string> names;
  for (const DeviceSpec& device : Catalog()) names.push_back(device.name);
  return names;
}

absl::StatusOr<DeviceSpec> LookupDevice(absl::string_view name) {
  const std::vector<DeviceSpec> catalog = Catalog();
  const char* found = CatalogName(catalog, Fold(name));
  if (found == nullptr) found = CatalogName(catalog, Canonical(name));
  if (found != nullptr) {
    for (const DeviceSpec& device : catalog) {
      if (device.name == found) return device;
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "unknown device \"", name, "\"; known: ", absl::StrJoin(CatalogDeviceNames(), ", "),
      ", or \"cpu\" with a measured peak"));
}

}  // namespace loom
