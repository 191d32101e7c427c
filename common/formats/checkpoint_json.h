// Internal to the checkpoint formats (checkpoint_manifest.cc,
// checkpoint_format.cc): JSON written by hand (one member per line, so that
// diffs and the manifest checksum line are easy) and read with yaml-cpp,
// JSON being a subset of YAML 1.2, and the members manifests and shard
// headers share. No LibTorch.
#ifndef LOOM_COMMON_FORMATS_CHECKPOINT_JSON_H_
#define LOOM_COMMON_FORMATS_CHECKPOINT_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "common/formats/checkpoint_files.h"

namespace loom::engine::checkpoint_json {

// Version 3 of both the manifest and the shard format.
inline constexpr int kFormatVersion = 3;

// DATA_LOSS "<path>: <what>".
absl::Status DataLoss(const std::string& path, absl::string_view what);
// A JSON string literal, escaped.
std::string JsonString(absl::string_view s);
// Exact (17 significant digits); NaN and infinities as strings.
std::string JsonDouble(double v);
// [[a, b], ...].
std::string JsonPairs(const std::vector<std::pair<int64_t, int64_t>>& pairs);
std::vector<std::pair<int64_t, int64_t>> RangesAsPairs(const std::vector<BatchRange>& ranges);
// Members shared by manifests and shard headers, each line "  "key": v,\n".
void AppendStateMembers(const CheckpointShape& shape, const TrainingState& s, std::string* out);
// Parses `text`; DATA_LOSS naming `path` if it does not parse.
absl::StatusOr<YAML::Node> ParseJson(absl::string_view text, const std::string& path);

// Typed access to a parsed JSON object; remembers the first member that was
// missing or of the wrong type.
class JsonFields {
 public:
  explicit JsonFields(YAML::Node node) : node_(std::move(node)) {}

  int64_t Int(const char* key) {
    int64_t v = 0;
    const YAML::Node n = Get(key);
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v)) Fail(key);
    return v;
  }
  double Double(const char* key) {
    double v = 0;
    const YAML::Node n = Get(key);
    if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v)) Fail(key);
    return v;
  }
  bool Bool(const char* key) {
    const YAML::Node n = Get(key);
    if (n.IsScalar() && (n.Scalar() == "true" || n.Scalar() == "false")) {
      return n.Scalar() == "true";
    }
    Fail(key);
    return false;
  }
  std::string String(const char* key) {
    const YAML::Node n = Get(key);
    if (!n.IsScalar()) Fail(key);
    return n.IsScalar() ? n.Scalar() : std::string();
  }
  YAML::Node Sequence(const char* key) {
    const YAML::Node n = Get(key);
    if (!n.IsSequence()) Fail(key);
    return n;
  }
  std::vector<int64_t> Ints(const char* key) {
    std::vector<int64_t> out;
    const YAML::Node n = Sequence(key);
    for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
      int64_t v = 0;
      if (!n[i].IsScalar() || !absl::SimpleAtoi(n[i].Scalar(), &v)) Fail(key);
      out.push_back(v);
    }
    return out;
  }
  std::vector<std::pair<int64_t, int64_t>> Pairs(const char* key) {
    std::vector<std::pair<int64_t, int64_t>> out;
    const YAML::Node n = Sequence(key);
    for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
      int64_t a = 0, b = 0;
      if (!n[i].IsSequence() || n[i].size() != 2 || !absl::SimpleAtoi(n[i][0].Scalar(), &a) ||
          !absl::SimpleAtoi(n[i][1].Scalar(), &b)) {
        Fail(key);
      }
      out.emplace_back(a, b);
    }
    return out;
  }

  // Members added after version 1 of the format: absent in older
  // checkpoints, where they read as `fallback`.
  bool Has(const char* key) const {
    const YAML::Node& node = node_;
    return node.IsMap() && node[key];
  }
  double DoubleOr(const char* key, double fallback) {
    return Has(key) ? Double(key) : fallback;
  }
  int64_t IntOr(const char* key, int64_t fallback) { return Has(key) ? Int(key) : fallback; }

  // Empty if every access so far succeeded.
  const std::string& bad() const { return bad_; }

 private:
  YAML::Node Get(const char* key) {
    const YAML::Node& node = node_;  // const: lookups must not insert
    if (!node.IsMap() || !node[key]) {
      Fail(key);
      return YAML::Node();
    }
    return node[key];
  }
  void Fail(const char* key) {
    if (bad_.empty()) bad_ = key;
  }

  YAML::Node node_;
  std::string bad_;
};

// Reads what AppendStateMembers wrote.
void ReadStateMembers(JsonFields& f, CheckpointShape* shape, TrainingState* s);

}  // namespace loom::engine::checkpoint_json

#endif  // LOOM_COMMON_FORMATS_CHECKPOINT_JSON_H_
