#include "worker/engine/checkpoint/checkpoint_inspect.h"

#include "worker/engine/checkpoint/checkpoint_model.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <vector>

#include <torch/serialize/input-archive.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/parallel/parallel_gpt.h"
#include "worker/engine/parallel/sharded_checkpoint.h"
#include "absl/strings/numbers.h"

namespace loom::engine {
namespace {

// One tensor into the digest: a header (name, rank, dtype, shape), then the
// bytes.
void Add(const std::string& name, const std::vector<int64_t>& shape, const std::string& dtype,
         const void* data, size_t bytes, loom::Sha256& hash, ModelDigest& digest) {
  std::string header = absl::StrCat(name, "|", shape.size(), "|", dtype, "|");
  int64_t numel = 1;
  for (int64_t d : shape) {
    absl::StrAppend(&header, d, ",");
    numel *= d;
  }
  hash.Update(header);
  hash.Update(data, bytes);
  digest.tensors += 1;
  digest.parameters += numel;
}

// Version 1/2 files: depth-first over nested archives, keys sorted at each
// level so the order is canonical.
void Walk(torch::serialize::InputArchive& archive, const std::string& prefix, loom::Sha256& hash,
          ModelDigest& digest) {
  std::vector<std::string> keys = archive.keys();
  std::sort(keys.begin(), keys.end());
  for (const std::string& key : keys) {
    std::string name = prefix.empty() ? key : prefix + "." + key;
    torch::Tensor t;
    if (archive.try_read(key, t)) {
      torch::Tensor c = t.contiguous().cpu();
      Add(name, c.sizes().vec(), std::string(c.dtype().name()), c.data_ptr(), c.nbytes(), hash,
          digest);
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) Walk(child, name, hash, digest);
  }
}

absl::StatusOr<ModelDigest> DigestLegacyFile(const std::string& path) {
  torch::serialize::InputArchive root;
  root.load_from(path);
  torch::serialize::InputArchive model;
  if (!root.try_read("model", model)) {
    return absl::DataLossError(absl::StrCat(path, ": no model archive in the checkpoint"));
  }
  loom::Sha256 hash;
  ModelDigest digest;
  Walk(model, "", hash, digest);
  digest.sha256 = loom::ToHex(hash.Finish());
  return digest;
}

// A shard's "model/..." tensors, in the order Walk visits the same tensors
// of a version 1/2 file (names compared component by component), so that
// both formats give equal digests for equal weights.
absl::StatusOr<ModelDigest> DigestShard(absl::string_view bytes, const std::string& path) {
  absl::StatusOr<ShardView> shard = ParseShard(bytes);
  if (!shard.ok()) return absl::DataLossError(absl::StrCat(path, ": ", shard.status().message()));
  struct Item {
    std::vector<std::string> components;
    size_t index;
  };
  std::vector<Item> items;
  constexpr absl::string_view kModel = "model/";
  for (size_t i = 0; i < shard->header.tensors.size(); ++i) {
    absl::string_view name = shard->header.tensors[i].name;
    if (!absl::ConsumePrefix(&name, kModel)) continue;
    items.push_back({absl::StrSplit(name, '.'), i});
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.components < b.components; });
  loom::Sha256 hash;
  ModelDigest digest;
  for (const Item& item : items) {
    const ShardTensor& t = shard->header.tensors[item.index];
    const absl::string_view data = shard->data[item.index];
    Add(t.name.substr(kModel.size()), t.shape,
        std::string(c10::scalarTypeToTypeMeta(t.dtype).name()), data.data(), data.size(), hash,
        digest);
  }
  digest.sha256 = loom::ToHex(hash.Finish());
  return digest;
}

// The model config a fingerprint ("n_layer=2,n_head=2,...", ModelFingerprint)
// names.
absl::StatusOr<GptConfig> ConfigOfFingerprint(const std::string& fingerprint,
                                              const std::string& path) {
  GptConfig config;
  int found = 0;
  for (absl::string_view item : absl::StrSplit(fingerprint, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    // The family's knobs (ModelFingerprint names them for models other
    // than GPT-2's shape).
    double real = 0;
    if (kv.first == "rope_theta" && absl::SimpleAtod(kv.second, &real)) config.rope_theta = real;
    if (kv.first == "norm_eps" && absl::SimpleAtod(kv.second, &real)) config.norm_eps = real;
    int value = 0;
    if (!absl::SimpleAtoi(kv.second, &value)) continue;
    if (kv.first == "n_kv_head") config.n_kv_head = value;
    if (kv.first == "ffn_hidden") config.ffn_hidden = value;
    if (kv.first == "gated_mlp") config.gated_mlp = value != 0;
    if (kv.first == "bias") config.bias = value != 0;
    if (kv.first == "rms_norm") config.rms_norm = value != 0;
    if (kv.first == "rotary") config.rotary = value != 0;
    if (kv.first == "tied_embeddings") config.tied_embeddings = value != 0;
    if (kv.first == "n_layer") config.n_layer = value, ++found;
    if (kv.first == "n_head") config.n_head = value, ++found;
    if (kv.first == "d_model") config.d_model = value, ++found;
    if (kv.first == "seq_len") config.seq_len = value, ++found;
    if (kv.first == "vocab_size") config.vocab_size = value, ++found;
  }
  if (found != 5) {
    return absl::DataLossError(absl::StrCat(path, ": unreadable model \"", fingerprint, "\""));
  }
  return config;
}

// A sharded checkpoint: every parameter assembled whole from its pieces, in
// DigestShard's order, so that equal weights digest equally whatever layout
// wrote them.
absl::StatusOr<ModelDigest> DigestSharded(const std::string& path,
                                          const CheckpointManifest& manifest) {
  ASSIGN_OR_RETURN(GptConfig config, ConfigOfFingerprint(manifest.shape.model, path));
  ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(path, config));
  struct Item {
    std::vector<std::string> components;
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Item> items;
  for (auto& [name, shape] : GptParameterShapes(config)) {
    items.push_back({absl::StrSplit(name, '.'), name, shape});
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.components < b.components; });
  loom::Sha256 hash;
  ModelDigest digest;
  for (const Item& item : items) {
    ASSIGN_OR_RETURN(torch::Tensor whole, reader.Whole("model/" + item.name, item.shape));
    Add(item.name, item.shape, std::string(whole.dtype().name()), whole.data_ptr(),
        whole.nbytes(), hash, digest);
  }
  digest.sha256 = loom::ToHex(hash.Finish());
  return digest;
}

}  // namespace

absl::StatusOr<CheckpointModel> LoadCheckpointModel(const std::string& path) {
  struct stat st;
  if (access(path.c_str(), R_OK) != 0 || ::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint directory"));
  }
  try {
    const std::string manifest_path = (std::filesystem::path(path) / kManifestFileName).string();
    absl::StatusOr<std::string> manifest_bytes = ReadFile(manifest_path);
    if (!manifest_bytes.ok()) {
      return absl::DataLossError(absl::StrCat(manifest_path, ": missing or unreadable"));
    }
    ASSIGN_OR_RETURN(CheckpointManifest manifest, ParseManifest(*manifest_bytes, manifest_path));
    CheckpointModel model;
    model.step = manifest.state.step;
    ASSIGN_OR_RETURN(model.config, ConfigOfFingerprint(manifest.shape.model, path));
    if (manifest.layout == kShardedLayout) {
      RETURN_IF_ERROR(VerifyCheckpoint({manifest.state.step, path, -1, false}).status());
      ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(path, model.config));
      for (auto& [name, shape] : GptParameterShapes(model.config)) {
        ASSIGN_OR_RETURN(torch::Tensor whole, reader.Whole("model/" + name, shape));
        model.parameters[name] = whole.to(torch::kFloat).clone();
      }
      return model;
    }
    ASSIGN_OR_RETURN(std::string bytes,
                     ReadVerifiedCheckpoint({manifest.state.step, path, -1, false}));
    absl::StatusOr<ShardView> shard = ParseShard(bytes);
    if (!shard.ok()) return absl::DataLossError(absl::StrCat(path, ": ", shard.status().message()));
    constexpr absl::string_view kModel = "model/";
    for (size_t i = 0; i < shard->header.tensors.size(); ++i) {
      const ShardTensor& t = shard->header.tensors[i];
      absl::string_view name = t.name;
      if (!absl::ConsumePrefix(&name, kModel)) continue;
      const absl::string_view data = shard->data[i];
      torch::Tensor view = torch::from_blob(const_cast<char*>(data.data()), t.shape,
                                            torch::TensorOptions().dtype(t.dtype));
      model.parameters[std::string(name)] = view.to(torch::kFloat).clone();
    }
    return model;
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not a readable checkpoint: ", e.what()));
  }
}

absl::StatusOr<Gpt> BuildCheckpointModel(const CheckpointModel& checkpoint) {
  RETURN_IF_ERROR(ValidateGptConfig(checkpoint.config));
  Gpt model(checkpoint.config);
  torch::NoGradGuard no_grad;
  const auto params = model->named_parameters(/*recurse=*/true);
  if (params.size() != checkpoint.parameters.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint holds ", checkpoint.parameters.size(), " parameter tensors, its model ",
        params.size()));
  }
  for (const auto& item : params) {
    auto it = checkpoint.parameters.find(item.key());
    if (it == checkpoint.parameters.end() || it->second.sizes() != item.value().sizes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint has no parameter ", item.key(), " of shape [",
                       absl::StrJoin(item.value().sizes(), ", "), "]"));
    }
    item.value().copy_(it->second);
  }
  model->eval();
  return model;
}

absl::StatusOr<ModelDigest> DigestCheckpointModel(const std::string& path) {
  struct stat st;
  if (access(path.c_str(), R_OK) != 0 || ::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint"));
  }
  try {
    if (S_ISDIR(st.st_mode)) {
      // A checkpoint directory: verify every file, then digest rank 0's
      // shard. The step comes from the manifest, so the directory may have
      // been copied under another name.
      const std::string manifest_path =
          (std::filesystem::path(path) / kManifestFileName).string();
      absl::StatusOr<std::string> manifest_bytes = ReadFile(manifest_path);
      if (!manifest_bytes.ok()) {
        return absl::DataLossError(absl::StrCat(manifest_path, ": missing or unreadable"));
      }
      ASSIGN_OR_RETURN(CheckpointManifest manifest, ParseManifest(*manifest_bytes, manifest_path));
      if (manifest.layout == kShardedLayout) {
        RETURN_IF_ERROR(VerifyCheckpoint({manifest.state.step, path, -1, false}).status());
        return DigestSharded(path, manifest);
      }
      ASSIGN_OR_RETURN(std::string shard,
                       ReadVerifiedCheckpoint({manifest.state.step, path, -1, false}));
      return DigestShard(shard, path);
    }
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) return absl::DataLossError(absl::StrCat(path, ": unreadable"));
    if (IsShard(*bytes)) return DigestShard(*bytes, path);  // a shard alone
    return DigestLegacyFile(path);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not a readable checkpoint: ", e.what()));
  }
}

}  // namespace loom::engine
