// The manifest format of checkpoint.h and the JSON helpers it shares with
// the shard format (checkpoint_json.h). No LibTorch.
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
#include "common/formats/checkpoint_files.h"
#include "common/formats/checkpoint_json.h"

namespace loom::engine {
namespace checkpoint_json {

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

}  // namespace checkpoint_json

namespace {

using checkpoint_json::DataLoss;
using checkpoint_json::JsonString;
using checkpoint_json::AppendStateMembers;
using checkpoint_json::ParseJson;
using checkpoint_json::JsonFields;
using checkpoint_json::ReadStateMembers;
using checkpoint_json::kFormatVersion;

constexpr char kManifestFormat[] = "loom-checkpoint";
constexpr absl::string_view kManifestCrcKey = "  \"manifest_crc32c\": \"";

}  // namespace

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
                    f.sha256.empty() ? "" : absl::StrCat(", \"sha256\": ", JsonString(f.sha256)),
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
    if (file.Has("sha256")) mf.sha256 = file.String("sha256");
    if (!file.bad().empty() || !absl::SimpleHexAtoi(crc, &mf.crc32c) ||
        (file.Has("sha256") && mf.sha256.size() != 64) || mf.name.find('/') != std::string::npos ||
        mf.name.empty() || mf.name[0] == '.') {
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

}  // namespace loom::engine
