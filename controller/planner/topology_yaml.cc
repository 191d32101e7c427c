#include "controller/planner/topology_yaml.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/yaml_util.h"
#include "yaml-cpp/yaml.h"

namespace loom::planner {

namespace {

absl::Status FieldError(absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

// Optimal string alignment distance on lowercased names.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string DidYouMean(absl::string_view name, const std::vector<std::string>& known) {
  const std::string lower = absl::AsciiStrToLower(name);
  const size_t limit = std::clamp<size_t>(lower.size() / 3, 1, 3);
  const std::string* best = nullptr;
  size_t best_distance = limit + 1;
  for (const std::string& candidate : known) {
    const size_t distance = EditDistance(lower, candidate);
    if (distance < best_distance) {
      best = &candidate;
      best_distance = distance;
    }
  }
  return best == nullptr ? "" : absl::StrCat(" (did you mean \"", *best, "\"?)");
}

// Walks one YAML mapping: each field is claimed by a handler; unknown and
// repeated keys are errors.
class MapReader {
 public:
  using Handler = std::function<absl::Status(const YAML::Node&, const std::string& path)>;

  MapReader(std::string path) : path_(std::move(path)) {}

  void On(const std::string& key, Handler handler) {
    handlers_.emplace(key, std::move(handler));
  }

  absl::Status Read(const YAML::Node& node) const {
    if (!node.IsMap()) {
      return FieldError(path_.empty() ? "topology" : path_,
                        absl::StrCat("expected a mapping, got ", DescribeYamlNode(node)));
    }
    std::vector<std::string> known;
    for (const auto& [key, unused] : handlers_) known.push_back(key);
    std::vector<std::string> seen;
    for (const auto& entry : node) {
      if (!entry.first.IsScalar()) {
        return FieldError(path_.empty() ? "topology" : path_, "keys must be plain names");
      }
      const std::string key = entry.first.Scalar();
      const std::string path = JoinYamlPath(path_, key);
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
        return FieldError(path, "given more than once");
      }
      seen.push_back(key);
      auto handler = handlers_.find(key);
      if (handler == handlers_.end()) {
        return FieldError(path, absl::StrCat("unknown field", DidYouMean(key, known)));
      }
      RETURN_IF_ERROR(handler->second(entry.second, path));
    }
    return absl::OkStatus();
  }

 private:
  std::string path_;
  std::map<std::string, Handler> handlers_;
};

absl::Status ReadDouble(const YAML::Node& node, const std::string& path, double* out) {
  double value = 0;
  if (!node.IsScalar() || node.Tag() != "?" || !absl::SimpleAtod(node.Scalar(), &value) ||
      !std::isfinite(value)) {
    return FieldError(path, absl::StrCat("expected a number, got ", DescribeYamlNode(node)));
  }
  if (value < 0) return FieldError(path, absl::StrCat("must be >= 0, got ", node.Scalar()));
  *out = value;
  return absl::OkStatus();
}

absl::Status ReadInt(const YAML::Node& node, const std::string& path, int* out) {
  int value = 0;
  if (!node.IsScalar() || node.Tag() != "?" || !absl::SimpleAtoi(node.Scalar(), &value)) {
    return FieldError(path, absl::StrCat("expected an integer, got ", DescribeYamlNode(node)));
  }
  if (value < 1) return FieldError(path, absl::StrCat("must be >= 1, got ", value));
  *out = value;
  return absl::OkStatus();
}

absl::Status ReadString(const YAML::Node& node, const std::string& path, std::string* out) {
  if (!node.IsScalar() || node.Scalar().empty()) {
    return FieldError(path, absl::StrCat("expected a string, got ", DescribeYamlNode(node)));
  }
  *out = node.Scalar();
  return absl::OkStatus();
}

// Handler storing `scale` x the number into `*target`.
MapReader::Handler Number(double* target, double scale) {
  return [target, scale](const YAML::Node& node, const std::string& path) {
    double value = 0;
    RETURN_IF_ERROR(ReadDouble(node, path, &value));
    *target = value * scale;
    return absl::OkStatus();
  };
}

MapReader::Handler Integer(int* target) {
  return [target](const YAML::Node& node, const std::string& path) {
    return ReadInt(node, path, target);
  };
}

MapReader::Handler Nested(MapReader* reader) {
  return [reader](const YAML::Node& node, const std::string&) { return reader->Read(node); };
}

// Fields as read, before the catalog is applied. -1 = not given.
struct RawTopology {
  std::string name;
  std::string device;
  int nodes = 0;
  int devices_per_node = 0;
  double memory_gb = -1, hbm_gb_per_s = -1, power_watts = -1;
  double fp32 = -1, tf32 = -1, bf16 = -1, fp16 = -1, fp8 = -1;
  double eff_max = -1, eff_half_width = -1, eff_half_tokens = -1;
  double intra_gb_per_s = -1, intra_latency_us = -1;
  double inter_gbit_per_s = -1, inter_latency_us = -1;
  int nodes_per_rack = 0;
  double inter_rack_gbit_per_s = -1;
  double device_watts = -1, host_watts = -1;
  double price = -1;
};

absl::Status ReadRaw(const YAML::Node& root, RawTopology* raw) {
  MapReader peak("device_overrides.peak_tflops");
  peak.On("fp32", Number(&raw->fp32, 1));
  peak.On("tf32", Number(&raw->tf32, 1));
  peak.On("bf16", Number(&raw->bf16, 1));
  peak.On("fp16", Number(&raw->fp16, 1));
  peak.On("fp8", Number(&raw->fp8, 1));
  MapReader efficiency("device_overrides.efficiency");
  efficiency.On("max", Number(&raw->eff_max, 1));
  efficiency.On("half_width", Number(&raw->eff_half_width, 1));
  efficiency.On("half_tokens", Number(&raw->eff_half_tokens, 1));
  MapReader overrides("device_overrides");
  overrides.On("memory_gb", Number(&raw->memory_gb, 1));
  overrides.On("hbm_bandwidth_gb_per_s", Number(&raw->hbm_gb_per_s, 1));
  overrides.On("power_watts", Number(&raw->power_watts, 1));
  overrides.On("peak_tflops", Nested(&peak));
  overrides.On("efficiency", Nested(&efficiency));
  MapReader intra("intra_node");
  intra.On("bandwidth_gb_per_s", Number(&raw->intra_gb_per_s, 1));
  intra.On("latency_us", Number(&raw->intra_latency_us, 1));
  MapReader inter("inter_node");
  inter.On("bandwidth_gbit_per_s", Number(&raw->inter_gbit_per_s, 1));
  inter.On("latency_us", Number(&raw->inter_latency_us, 1));
  MapReader racks("racks");
  racks.On("nodes_per_rack", Integer(&raw->nodes_per_rack));
  racks.On("inter_rack_bandwidth_gbit_per_s", Number(&raw->inter_rack_gbit_per_s, 1));
  MapReader power("power");
  power.On("device_watts", Number(&raw->device_watts, 1));
  power.On("host_watts", Number(&raw->host_watts, 1));
  MapReader top("");
  top.On("name", [raw](const YAML::Node& n, const std::string& p) {
    return ReadString(n, p, &raw->name);
  });
  top.On("device", [raw](const YAML::Node& n, const std::string& p) {
    return ReadString(n, p, &raw->device);
  });
  top.On("nodes", Integer(&raw->nodes));
  top.On("devices_per_node", Integer(&raw->devices_per_node));
  top.On("device_overrides", Nested(&overrides));
  top.On("intra_node", Nested(&intra));
  top.On("inter_node", Nested(&inter));
  top.On("racks", Nested(&racks));
  top.On("power", Nested(&power));
  top.On("price_per_device_hour_usd", Number(&raw->price, 1));
  RETURN_IF_ERROR(top.Read(root));
  if (raw->device.empty()) return FieldError("device", "required");
  if (raw->nodes == 0) return FieldError("nodes", "required");
  if (raw->devices_per_node == 0) return FieldError("devices_per_node", "required");
  return absl::OkStatus();
}

absl::StatusOr<ClusterTopology> Build(const RawTopology& raw,
                                      const LocalCpuMeasurement* local_cpu) {
  constexpr double kGiga = 1e9, kTera = 1e12;
  ClusterTopology topology;
  const bool cpu = absl::AsciiStrToLower(raw.device) == "cpu";
  if (cpu) {
    if (local_cpu != nullptr) {
      absl::StatusOr<DeviceSpec> device = LocalCpuDevice(*local_cpu);
      if (!device.ok()) return FieldError("device", device.status().message());
      topology.device = *device;
    } else {
      if (raw.fp32 <= 0 || raw.memory_gb <= 0 || raw.hbm_gb_per_s <= 0) {
        return FieldError("device",
                          "\"cpu\" needs a measured peak: plan on a worker that measured "
                          "it, or set device_overrides.peak_tflops.fp32, "
                          "device_overrides.memory_gb and "
                          "device_overrides.hbm_bandwidth_gb_per_s");
      }
      topology.device.name = "cpu";
      topology.device.efficiency = GemmEfficiency{1.0, 0, 0};
    }
  } else {
    absl::StatusOr<DeviceSpec> device = LookupDevice(raw.device);
    if (!device.ok()) return FieldError("device", device.status().message());
    topology.device = *device;
  }
  DeviceSpec& d = topology.device;
  if (raw.memory_gb >= 0) d.memory_bytes = static_cast<int64_t>(raw.memory_gb * kGiga);
  if (raw.hbm_gb_per_s >= 0) d.hbm_bandwidth_bytes_per_second = raw.hbm_gb_per_s * kGiga;
  if (raw.power_watts >= 0) d.power_watts = raw.power_watts;
  if (raw.fp32 >= 0) d.peak_flops_fp32 = raw.fp32 * kTera;
  if (raw.tf32 >= 0) d.peak_flops_tf32 = raw.tf32 * kTera;
  if (raw.bf16 >= 0) d.peak_flops_bf16 = raw.bf16 * kTera;
  if (raw.fp16 >= 0) d.peak_flops_fp16 = raw.fp16 * kTera;
  if (raw.fp8 >= 0) d.peak_flops_fp8 = raw.fp8 * kTera;
  if (cpu) {  // no faster low-precision units unless stated
    for (double* peak : {&d.peak_flops_tf32, &d.peak_flops_bf16, &d.peak_flops_fp16}) {
      if (*peak == 0) *peak = d.peak_flops_fp32;
    }
    if (d.intra_node_bandwidth_bytes_per_second == 0) {
      d.intra_node_bandwidth_bytes_per_second = d.hbm_bandwidth_bytes_per_second;
    }
  }
  if (raw.eff_max >= 0) d.efficiency.max_fraction = raw.eff_max;
  if (raw.eff_half_width >= 0) d.efficiency.half_width = raw.eff_half_width;
  if (raw.eff_half_tokens >= 0) d.efficiency.half_tokens = raw.eff_half_tokens;

  topology.name = raw.name.empty()
                      ? absl::StrCat(raw.nodes, "x", raw.devices_per_node, " ", d.name)
                      : raw.name;
  topology.nodes = raw.nodes;
  topology.devices_per_node = raw.devices_per_node;
  topology.intra_node_bandwidth_bytes_per_second =
      raw.intra_gb_per_s >= 0 ? raw.intra_gb_per_s * kGiga
                              : d.intra_node_bandwidth_bytes_per_second;
  if (raw.intra_latency_us >= 0) topology.intra_node_latency_seconds = raw.intra_latency_us * 1e-6;
  if (raw.inter_gbit_per_s >= 0) {
    topology.inter_node_bandwidth_bytes_per_second = raw.inter_gbit_per_s * kGiga / 8;
  }
  if (raw.inter_latency_us >= 0) topology.inter_node_latency_seconds = raw.inter_latency_us * 1e-6;
  topology.nodes_per_rack = raw.nodes_per_rack;
  if (raw.inter_rack_gbit_per_s >= 0) {
    topology.inter_rack_bandwidth_bytes_per_second = raw.inter_rack_gbit_per_s * kGiga / 8;
  }
  if (raw.device_watts >= 0) topology.device_power_watts = raw.device_watts;
  if (raw.host_watts >= 0) topology.host_power_watts = raw.host_watts;
  if (raw.price >= 0) topology.price_per_device_hour_usd = raw.price;
  RETURN_IF_ERROR(ValidateTopology(topology));
  return topology;
}

}  // namespace

absl::StatusOr<ClusterTopology> ParseTopologyYaml(absl::string_view text,
                                                  const LocalCpuMeasurement* local_cpu) {
  RawTopology raw;
  try {
    // Not YAML::LoadAll: it never returns on some malformed streams, and
    // this text comes from Plan RPCs (common/yaml_util.h).
    const std::string yaml(text);
    const int documents = CountYamlDocuments(yaml, 16);
    if (documents > 1) {
      return FieldError("topology", absl::StrCat("expected one YAML document, got ",
                                                 documents > 16 ? "more than 16"
                                                                : absl::StrCat(documents)));
    }
    const YAML::Node document = documents == 0 ? YAML::Node() : YAML::Load(yaml);
    if (!document.IsDefined() || document.IsNull()) return FieldError("topology", "empty");
    RETURN_IF_ERROR(ReadRaw(document, &raw));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) return FieldError("topology", absl::StrCat("invalid YAML: ", e.msg));
    return FieldError("topology", absl::StrFormat("invalid YAML at line %d, column %d: %s",
                                                  e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  return Build(raw, local_cpu);
}

absl::StatusOr<ClusterTopology> LoadTopologyFile(const std::string& path,
                                                 const LocalCpuMeasurement* local_cpu) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseTopologyYaml(text, local_cpu);
}

}  // namespace loom::planner
