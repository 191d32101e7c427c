// The manifest and shard formats of checkpoint.h: JSON written by hand and
// read with yaml-cpp, the manifest's own checksum, the shard's prefix.
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
#include "worker/engine/checkpoint.h"

namespace loom::engine {
namespace {

constexpr char kManifestFormat[] = "loom-checkpoint";
constexpr char kShardFormat[] = "loom-checkpoint-shard";
constexpr int kFormatVersion = 3;
constexpr char kShardMagic[] = "LOOMSHRD";  // 8 bytes, no terminator written
constexpr size_t kShardPrefixBytes = 16;    // magic + header length
constexpr absl::string_view kManifestCrcKey = "  \"manifest_crc32c\": \"";

absl::Status DataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

// ---------------------------------------------------------------------------
// JSON. Written by hand (one member per line, so that diffs and the manifest
// checksum line are easy); read with yaml-cpp, JSON being a subset of YAML 1.2.

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

// Exact: 17 significant digits round-trip an IEEE double. JSON has no NaN
// or infinity (a diverged loss), so those are strings.
std::string JsonDouble(double v) {
  if (std::isnan(v)) return "\"nan\"";
  if (std::isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
  return absl::StrFormat("%.17g", v);
}

std::string JsonPairs(const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  std::string out = "[";
  for (size_t i = 0; i < pairs.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", "[", pairs[i].first, ", ", pairs[i].second, "]");
  }
  return out + "]";
}

std::vector<std::pair<int64_t, int64_t>> RangesAsPairs(const std::vector<BatchRange>& ranges) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const BatchRange& r : ranges) out.emplace_back(r.begin, r.end);
  return out;
}

// Members shared by manifests and shard headers, each line "  "key": v,\n".
void AppendStateMembers(const CheckpointShape& shape, const TrainingState& s, std::string* out) {
  absl::StrAppend(out, "  \"step\": ", s.step, ",\n");
  absl::StrAppend(out, "  \"generation\": ", s.generation, ",\n");
  absl::StrAppend(out, "  \"lineage\": ", JsonPairs(s.lineage), ",\n");
  absl::StrAppend(out, "  \"world_size\": ", shape.world_size, ",\n");
  absl::StrAppend(out, "  \"global_batch\": ", shape.global_batch, ",\n");
  absl::StrAppend(out, "  \"model\": ", JsonString(shape.model), ",\n");
  absl::StrAppend(out, "  \"loss\": ", JsonDouble(s.loss), ",\n");
  absl::StrAppend(out, "  \"has_val_loss\": ", s.has_val_loss ? "true" : "false", ",\n");
  absl::StrAppend(out, "  \"val_loss\": ", JsonDouble(s.val_loss), ",\n");
  absl::StrAppend(out, "  \"next_data_batch\": ", s.next_data_batch, ",\n");
  // In samples (the data cursor proper); informational, next_data_batch is
  // what is read back.
  absl::StrAppend(out, "  \"data_cursor\": ", s.next_data_batch * shape.global_batch, ",\n");
  absl::StrAppend(out, "  \"skip_batches\": ", JsonPairs(RangesAsPairs(s.skip_batches)), ",\n");
  absl::StrAppend(out, "  \"loss_scale\": ", JsonDouble(s.loss_scale), ",\n");
  absl::StrAppend(out, "  \"loss_scale_clean_steps\": ", s.loss_scale_clean_steps, ",\n");
  absl::StrAppend(out, "  \"loss_scale_overflow_steps\": ", s.loss_scale_overflow_steps, ",\n");
}

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

void ReadStateMembers(JsonFields& f, CheckpointShape* shape, TrainingState* s) {
  s->step = f.Int("step");
  s->generation = f.Int("generation");
  s->lineage = f.Pairs("lineage");
  shape->world_size = static_cast<int>(f.Int("world_size"));
  shape->global_batch = static_cast<int>(f.Int("global_batch"));
  shape->model = f.String("model");
  s->loss = f.Double("loss");
  s->has_val_loss = f.Bool("has_val_loss");
  s->val_loss = f.Double("val_loss");
  s->next_data_batch = f.Int("next_data_batch");
  s->skip_batches.clear();
  for (const auto& [begin, end] : f.Pairs("skip_batches")) s->skip_batches.push_back({begin, end});
  s->loss_scale = f.DoubleOr("loss_scale", 0);
  s->loss_scale_clean_steps = f.IntOr("loss_scale_clean_steps", 0);
  s->loss_scale_overflow_steps = f.IntOr("loss_scale_overflow_steps", 0);
}

absl::StatusOr<YAML::Node> ParseJson(absl::string_view text, const std::string& path) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return DataLoss(path, absl::StrCat("does not parse: ", e.what()));
  }
}

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

std::string SerializeManifest(const CheckpointManifest& m) {
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": ", JsonString(kManifestFormat), ",\n");
  absl::StrAppend(&out, "  \"version\": ", m.version, ",\n");
  absl::StrAppend(&out, "  \"layout\": ", JsonString(m.layout), ",\n");
  if (m.layout == kShardedLayout) {
    absl::StrAppend(&out, "  \"data_parallel\": ", m.data_parallel, ",\n");
    absl::StrAppend(&out, "  \"pipeline_parallel\": ", m.pipeline_parallel, ",\n");
    absl::StrAppend(&out, "  \"tensor_parallel\": ", m.tensor_parallel, ",\n");
    absl::StrAppend(&out, "  \"zero_stage\": ", m.zero_stage, ",\n");
  }
  AppendStateMembers(m.shape, m.state, &out);
  absl::StrAppend(&out, "  \"files\": [\n");
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    absl::StrAppend(&out, "    {\"name\": ", JsonString(f.name), ", \"rank\": ", f.rank,
                    ", \"bytes\": ", f.bytes, ", \"crc32c\": ", JsonString(Crc32cHex(f.crc32c)),
                    "}", i + 1 < m.files.size() ? "," : "", "\n");
  }
  absl::StrAppend(&out, "  ],\n");
  absl::StrAppend(&out, kManifestCrcKey, Crc32cHex(Crc32c(out)), "\"\n}\n");
  return out;
}

absl::Status CheckManifestChecksum(absl::string_view bytes, const std::string& path) {
  // The checksum line: kManifestCrcKey, 8 hex digits, "\"\n}\n", at the end.
  const size_t at = bytes.rfind(absl::StrCat("\n", kManifestCrcKey));
  const size_t tail = at == absl::string_view::npos ? 0 : at + 1 + kManifestCrcKey.size();
  if (at == absl::string_view::npos || bytes.size() != tail + 8 + 4 ||
      bytes.substr(tail + 8) != "\"\n}\n") {
    return DataLoss(path, "no manifest_crc32c line at its end (torn or not a manifest)");
  }
  // Compared as text, not as a number: "0A" and "0a" are the same number,
  // and a byte of the manifest changed from one to the other would go
  // unnoticed (CheckpointTest.ManifestChecksumIsComparedAsWritten).
  const std::string actual = Crc32cHex(Crc32c(bytes.substr(0, at + 1)));
  const absl::string_view recorded = bytes.substr(tail, 8);
  if (recorded != actual) {
    return DataLoss(path, absl::StrCat("crc32c ", actual, " does not match its own ",
                                       absl::CHexEscape(recorded)));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view bytes,
                                                 const std::string& path) {
  RETURN_IF_ERROR(CheckManifestChecksum(bytes, path));
  ASSIGN_OR_RETURN(YAML::Node root, ParseJson(bytes, path));
  JsonFields f(root);
  if (f.String("format") != kManifestFormat) return DataLoss(path, "not a loom manifest");
  CheckpointManifest m;
  m.version = static_cast<int>(f.Int("version"));
  if (f.bad().empty() && m.version != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": checkpoint format version ",
                                                      m.version, ", this build reads ",
                                                      kFormatVersion));
  }
  m.layout = f.String("layout");
  if (m.layout == kShardedLayout) {
    m.data_parallel = static_cast<int>(f.Int("data_parallel"));
    m.pipeline_parallel = static_cast<int>(f.Int("pipeline_parallel"));
    m.tensor_parallel = static_cast<int>(f.Int("tensor_parallel"));
    m.zero_stage = static_cast<int>(f.Int("zero_stage"));
  }
  ReadStateMembers(f, &m.shape, &m.state);
  const YAML::Node files = f.Sequence("files");
  for (size_t i = 0; files.IsSequence() && i < files.size(); ++i) {
    JsonFields file(files[i]);
    ManifestFile mf;
    mf.name = file.String("name");
    mf.rank = static_cast<int>(file.Int("rank"));
    mf.bytes = static_cast<uint64_t>(file.Int("bytes"));
    const std::string crc = file.String("crc32c");
    if (!file.bad().empty() || !absl::SimpleHexAtoi(crc, &mf.crc32c) ||
        mf.name.find('/') != std::string::npos || mf.name.empty() || mf.name[0] == '.') {
      return DataLoss(path, absl::StrCat("files[", i, "] is malformed"));
    }
    m.files.push_back(std::move(mf));
  }
  if (!f.bad().empty()) return DataLoss(path, absl::StrCat("member \"", f.bad(), "\" is malformed"));
  if (m.layout != kReplicatedLayout && m.layout != kShardedLayout) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": layout \"", m.layout,
                                                      "\" is not supported"));
  }
  return m;
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
