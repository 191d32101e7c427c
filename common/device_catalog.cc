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

// Vendor datasheet figures, dense (no 2:4 sparsity), SXM form factors.
// NVLink bandwidth is per direction: V100 300 GB/s, A100 600 GB/s and
// H100/H200 900 GB/s are the bidirectional totals NVIDIA quotes.
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
// and "a10080gb". PCIe parts are not dropped to their SXM figures: their
// peaks and power differ, so "H100 PCIe" stays unknown.
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
  if (has("h200")) return LookupDevice("H200");
  if (has("h100")) return LookupDevice("H100-SXM");
  if (has("a100")) return LookupDevice(has("80g") ? "A100-80GB" : "A100-40GB");
  if (has("v100")) return LookupDevice("V100");
  return absl::NotFoundError(absl::StrCat("\"", product, "\" is not a GPU Loom knows the peak of (",
                                          absl::StrJoin(CatalogDeviceNames(), ", "), ")"));
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
