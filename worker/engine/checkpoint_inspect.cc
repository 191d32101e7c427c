#include "worker/engine/checkpoint_inspect.h"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <vector>

#include <torch/serialize/input-archive.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace loom::engine {
namespace {

// Depth-first over nested archives; keys sorted so the order is canonical.
void Walk(torch::serialize::InputArchive& archive, const std::string& prefix, loom::Sha256& hash,
          ModelDigest& digest) {
  std::vector<std::string> keys = archive.keys();
  std::sort(keys.begin(), keys.end());
  for (const std::string& key : keys) {
    std::string name = prefix.empty() ? key : prefix + "." + key;
    torch::Tensor t;
    if (archive.try_read(key, t)) {
      torch::Tensor c = t.contiguous().cpu();
      std::string header = absl::StrCat(name, "|", c.sizes().vec().size(), "|",
                                        std::string(c.dtype().name()), "|");
      for (int64_t d : c.sizes()) absl::StrAppend(&header, d, ",");
      hash.Update(header);
      hash.Update(c.data_ptr(), c.nbytes());
      digest.tensors += 1;
      digest.parameters += c.numel();
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) Walk(child, name, hash, digest);
  }
}

}  // namespace

absl::StatusOr<ModelDigest> DigestCheckpointModel(const std::string& path) {
  if (access(path.c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint"));
  }
  try {
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
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not a readable checkpoint: ", e.what()));
  }
}

}  // namespace loom::engine
