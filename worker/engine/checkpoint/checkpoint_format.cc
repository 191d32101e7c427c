// The shard format of checkpoint.h: its prefix and JSON header (the
// manifest is in checkpoint_manifest.cc).
#include <cmath>
#include <cstring>

#include <yaml-cpp/yaml.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "common/formats/checkpoint_json.h"

namespace loom::engine {
namespace {

using checkpoint_json::JsonString;
using checkpoint_json::JsonDouble;
using checkpoint_json::AppendStateMembers;
using checkpoint_json::ParseJson;
using checkpoint_json::JsonFields;
using checkpoint_json::ReadStateMembers;
using checkpoint_json::kFormatVersion;

constexpr char kShardFormat[] = "loom-checkpoint-shard";
constexpr char kShardMagic[] = "LOOMSHRD";  // 8 bytes, no terminator written
constexpr size_t kShardPrefixBytes = 16;    // magic + header length

c10::ScalarType ParseDtype(absl::string_view name, bool* ok) {
  for (c10::ScalarType t :
       {c10::ScalarType::Float, c10::ScalarType::Double, c10::ScalarType::Half,
        c10::ScalarType::BFloat16, c10::ScalarType::Long, c10::ScalarType::Int,
        c10::ScalarType::Short, c10::ScalarType::Char, c10::ScalarType::Byte,
        c10::ScalarType::Bool}) {
    if (name == c10::toString(t)) return t;
  }
  *ok = false;
  return c10::ScalarType::Undefined;
}

}  // namespace

bool IsShard(absl::string_view bytes) {
  return bytes.substr(0, 8) == absl::string_view(kShardMagic, 8);
}
std::string SerializeShardPrefix(ShardHeader* h) {
  std::string json = "{\n";
  absl::StrAppend(&json, "  \"format\": ", JsonString(kShardFormat), ",\n");
  absl::StrAppend(&json, "  \"version\": ", kFormatVersion, ",\n");
  absl::StrAppend(&json, "  \"rank\": ", h->rank, ",\n");
  AppendStateMembers(h->shape, h->state, &json);
  absl::StrAppend(&json, "  \"optimizer_groups\": [\n");
  for (size_t g = 0; g < h->optimizer_groups.size(); ++g) {
    const ShardOptimizerGroup& o = h->optimizer_groups[g];
    std::vector<std::string> names;
    for (const std::string& p : o.params) names.push_back(JsonString(p));
    absl::StrAppend(&json, "    {\"type\": \"adamw\", \"lr\": ", JsonDouble(o.lr),
                    ", \"beta1\": ", JsonDouble(o.beta1), ", \"beta2\": ", JsonDouble(o.beta2),
                    ", \"eps\": ", JsonDouble(o.eps), ", \"weight_decay\": ",
                    JsonDouble(o.weight_decay), ", \"amsgrad\": ", o.amsgrad ? "true" : "false",
                    ",\n     \"params\": [", absl::StrJoin(names, ", "), "],\n     \"steps\": [",
                    absl::StrJoin(o.steps, ", "), "]}",
                    g + 1 < h->optimizer_groups.size() ? "," : "", "\n");
  }
  absl::StrAppend(&json, "  ],\n  \"tensors\": [\n");
  for (size_t i = 0; i < h->tensors.size(); ++i) {
    const ShardTensor& t = h->tensors[i];
    absl::StrAppend(&json, "    {\"name\": ", JsonString(t.name), ", \"dtype\": ",
                    JsonString(c10::toString(t.dtype)), ", \"shape\": [",
                    absl::StrJoin(t.shape, ", "), "], \"offset\": ", t.offset,
                    ", \"bytes\": ", t.bytes);
    if (t.begin >= 0) {
      absl::StrAppend(&json, ", \"tp_rank\": ", t.tp_rank, ", \"tp_size\": ", t.tp_size,
                      ", \"begin\": ", t.begin);
    }
    absl::StrAppend(&json, "}", i + 1 < h->tensors.size() ? "," : "", "\n");
  }
  absl::StrAppend(&json, "  ]\n}\n");

  const uint64_t header_end = kShardPrefixBytes + json.size();
  h->data_offset = (header_end + kShardDataAlignment - 1) / kShardDataAlignment *
                   kShardDataAlignment;
  std::string out(h->data_offset, '\0');
  std::memcpy(&out[0], kShardMagic, 8);
  const uint64_t length = json.size();
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<char>((length >> (8 * i)) & 0xff);
  std::memcpy(&out[kShardPrefixBytes], json.data(), json.size());
  return out;
}

absl::StatusOr<ShardHeader> ParseShardHeader(absl::string_view bytes, uint64_t file_bytes) {
  const std::string where = "shard";
  if (bytes.size() < kShardPrefixBytes || file_bytes < kShardPrefixBytes || !IsShard(bytes)) {
    return absl::DataLossError("not a loom checkpoint shard (bad magic)");
  }
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<uint8_t>(bytes[8 + i])} << (8 * i);
  if (length > file_bytes - kShardPrefixBytes) {
    return absl::DataLossError("shard header runs past the end of the shard");
  }
  if (length > bytes.size() - kShardPrefixBytes) {
    return absl::OutOfRangeError(absl::StrCat("the shard header needs ", kShardPrefixBytes + length,
                                              " bytes"));
  }
  ASSIGN_OR_RETURN(YAML::Node root, ParseJson(bytes.substr(kShardPrefixBytes, length), where));
  JsonFields f(root);
  ShardHeader h;
  if (f.String("format") != kShardFormat || f.Int("version") != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard format ", f.String("format"), " version ", f.Int("version"), ", this build reads ",
        kShardFormat, " version ", kFormatVersion));
  }
  h.rank = static_cast<int>(f.Int("rank"));
  ReadStateMembers(f, &h.shape, &h.state);
  const YAML::Node groups = f.Sequence("optimizer_groups");
  for (size_t g = 0; groups.IsSequence() && g < groups.size(); ++g) {
    JsonFields group(groups[g]);
    ShardOptimizerGroup o;
    o.lr = group.Double("lr");
    o.beta1 = group.Double("beta1");
    o.beta2 = group.Double("beta2");
    o.eps = group.Double("eps");
    o.weight_decay = group.Double("weight_decay");
    o.amsgrad = group.Bool("amsgrad");
    const YAML::Node params = group.Sequence("params");
    for (size_t i = 0; params.IsSequence() && i < params.size(); ++i) {
      o.params.push_back(params[i].IsScalar() ? params[i].Scalar() : std::string());
    }
    o.steps = group.Ints("steps");
    if (!group.bad().empty() || o.steps.size() != o.params.size()) {
      return absl::DataLossError(absl::StrCat("shard optimizer group ", g, " is malformed"));
    }
    h.optimizer_groups.push_back(std::move(o));
  }
  h.data_offset = (kShardPrefixBytes + length + kShardDataAlignment - 1) / kShardDataAlignment *
                  kShardDataAlignment;
  const YAML::Node tensors = f.Sequence("tensors");
  for (size_t i = 0; tensors.IsSequence() && i < tensors.size(); ++i) {
    JsonFields tensor(tensors[i]);
    ShardTensor t;
    t.name = tensor.String("name");
    bool dtype_ok = true;
    t.dtype = ParseDtype(tensor.String("dtype"), &dtype_ok);
    t.shape = tensor.Ints("shape");
    t.offset = static_cast<uint64_t>(tensor.Int("offset"));
    t.bytes = static_cast<uint64_t>(tensor.Int("bytes"));
    if (tensor.Has("begin")) {
      t.tp_rank = static_cast<int>(tensor.Int("tp_rank"));
      t.tp_size = static_cast<int>(tensor.Int("tp_size"));
      t.begin = tensor.Int("begin");
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const bool piece_ok =
        t.begin < 0 ? !tensor.Has("tp_rank")
                    : t.tp_size >= 1 && t.tp_rank >= 0 && t.tp_rank < t.tp_size && t.shape.size() == 1;
    if (!tensor.bad().empty() || !dtype_ok || !piece_ok ||
        t.bytes != static_cast<uint64_t>(numel) * c10::elementSize(t.dtype) ||
        t.offset > file_bytes || t.bytes > file_bytes - h.data_offset ||
        h.data_offset + t.offset > file_bytes - t.bytes) {
      return absl::DataLossError(absl::StrCat("shard tensor ", i, " (", t.name, ") is malformed"));
    }
    h.tensors.push_back(std::move(t));
  }
  if (!f.bad().empty()) {
    return absl::DataLossError(absl::StrCat("shard header member \"", f.bad(), "\" is malformed"));
  }
  return h;
}

absl::StatusOr<ShardView> ParseShard(absl::string_view bytes) {
  ShardView view;
  ASSIGN_OR_RETURN(view.header, ParseShardHeader(bytes, bytes.size()));
  for (const ShardTensor& t : view.header.tensors) {
    view.data.push_back(bytes.substr(view.header.data_offset + t.offset, t.bytes));
  }
  return view;
}

}  // namespace loom::engine

