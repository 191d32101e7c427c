// Checkpoint layout, listing, verification, retention and restore. See
// checkpoint.h; the formats are in checkpoint_format.cc, versions 1/2 in
// checkpoint_legacy.cc, the writer in checkpoint_writer.cc.
#include "worker/engine/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/crc32c.h"
#include "common/prune_log.h"
#include "common/status_macros.h"
#include "worker/engine/checkpoint_legacy.h"
#include "worker/engine/optimizer_state_key.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kStepPrefix = "step-";
constexpr int kStepDigits = 9;
constexpr absl::string_view kTempInfix = ".tmp-";
constexpr size_t kReadChunkBytes = size_t{8} << 20;

absl::Status DataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Reads a whole file, CRC-32C as it goes. NOT_FOUND if it does not exist.
absl::StatusOr<std::string> ReadFileWithCrc(const std::string& path, uint32_t* crc) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": missing"));
    return ErrnoError("open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status status = ErrnoError("stat", path);
    ::close(fd);
    return status;
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  uint32_t c = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, &out[done], std::min(kReadChunkBytes, out.size() - done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status status = ErrnoError("read", path);
      ::close(fd);
      return status;
    }
    if (n == 0) break;  // shrank while reading
    c = Crc32cExtend(c, &out[done], static_cast<size_t>(n));
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  if (crc != nullptr) *crc = c;
  return out;
}

// ---------------------------------------------------------------------------
// Listing.

// The step of a checkpoint directory name ("step-" + exactly 9 digits), or -1.
int64_t StepOfDirectoryName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix) || name.size() != kStepDigits ||
      !std::all_of(name.begin(), name.end(), absl::ascii_isdigit)) {
    return -1;
  }
  int64_t step = -1;
  return absl::SimpleAtoi(name, &step) ? step : -1;
}

int64_t ManifestGeneration(const std::string& checkpoint_path) {
  const std::string path = (fs::path(checkpoint_path) / kManifestFileName).string();
  absl::StatusOr<std::string> bytes = ReadFileWithCrc(path, nullptr);
  if (!bytes.ok()) return -1;
  absl::StatusOr<CheckpointManifest> manifest = ParseManifest(*bytes, path);
  return manifest.ok() ? manifest->state.generation : -1;
}

// ---------------------------------------------------------------------------
// Verification.

// Verifies every file of a checkpoint directory; keeps rank 0's shard bytes
// for a replicated layout (a sharded one's files are read piecewise later).
// On failure fills `failure` (not null).
absl::StatusOr<VerifiedCheckpoint> VerifyDirectory(const CheckpointEntry& entry,
                                                   VerificationFailure* failure) {
  auto fail = [failure](const std::string& file, const char* check, absl::Status status) {
    *failure = {file, check};
    return status;
  };
  const std::string manifest_path = (fs::path(entry.path) / kManifestFileName).string();
  absl::StatusOr<std::string> manifest_bytes = ReadFileWithCrc(manifest_path, nullptr);
  if (!manifest_bytes.ok()) {
    return absl::IsNotFound(manifest_bytes.status())
               ? fail(manifest_path, kCheckMissing, DataLoss(manifest_path, "missing"))
               : fail(manifest_path, kCheckUnreadable,
                      absl::DataLossError(manifest_bytes.status().message()));
  }
  if (absl::Status s = CheckManifestChecksum(*manifest_bytes, manifest_path); !s.ok()) {
    return fail(manifest_path, kCheckManifestChecksum, s);
  }
  absl::StatusOr<CheckpointManifest> parsed = ParseManifest(*manifest_bytes, manifest_path);
  if (!parsed.ok()) return fail(manifest_path, kCheckManifestContent, parsed.status());
  CheckpointManifest manifest = *std::move(parsed);
  if (manifest.state.step != entry.step) {
    return fail(manifest_path, kCheckManifestContent,
                DataLoss(manifest_path, absl::StrCat("says step ", manifest.state.step,
                                                     ", the directory step ", entry.step)));
  }
  const bool sharded = manifest.layout == kShardedLayout;
  VerifiedCheckpoint verified;
  verified.path = entry.path;
  bool have_shard = false;
  for (const ManifestFile& file : manifest.files) {
    const std::string path = (fs::path(entry.path) / file.name).string();
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);  // before reading it all
    if (ec) {
      const bool missing = ec == std::errc::no_such_file_or_directory;
      return fail(path, missing ? kCheckMissing : kCheckUnreadable,
                  DataLoss(path, missing ? "missing (listed in the manifest)" : ec.message()));
    }
    if (size != file.bytes) {
      return fail(path, kCheckSize,
                  DataLoss(path, absl::StrCat(size, " bytes, the manifest says ", file.bytes)));
    }
    uint32_t crc = 0;
    absl::StatusOr<std::string> bytes = ReadFileWithCrc(path, &crc);
    if (!bytes.ok()) {
      return fail(path, kCheckUnreadable, absl::DataLossError(bytes.status().message()));
    }
    if (bytes->size() != file.bytes) {
      return fail(path, kCheckSize,
                  DataLoss(path, absl::StrCat(bytes->size(), " bytes, the manifest says ",
                                              file.bytes)));
    }
    if (crc != file.crc32c) {
      return fail(path, kCheckCrc32c,
                  DataLoss(path, absl::StrCat("crc32c ", Crc32cHex(crc),
                                              " does not match the manifest's ",
                                              Crc32cHex(file.crc32c))));
    }
    if (file.rank == 0 && !have_shard) {
      if (!sharded) verified.bytes = *std::move(bytes);
      have_shard = true;
    }
  }
  if (!have_shard) {
    return fail(manifest_path, kCheckManifestContent,
                DataLoss(manifest_path, "lists no shard of rank 0"));
  }
  verified.manifest = std::move(manifest);
  return verified;
}

// ---------------------------------------------------------------------------
// Restore.

// A copy of a shard tensor's bytes as a tensor shaped like `like`.
class ShardTensors {
 public:
  explicit ShardTensors(const ShardView& shard) : shard_(shard) {
    for (size_t i = 0; i < shard.header.tensors.size(); ++i) {
      index_[shard.header.tensors[i].name] = i;
    }
  }

  bool Has(const std::string& name) const { return index_.count(name) > 0; }

  // A tensor viewing the shard's bytes (valid while the shard's bytes are);
  // FAILED_PRECONDITION if missing or of another dtype or shape than `like`.
  absl::StatusOr<torch::Tensor> View(const std::string& name, const torch::Tensor& like) const {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint has no tensor ", name));
    }
    const ShardTensor& t = shard_.header.tensors[it->second];
    if (t.dtype != like.scalar_type() || t.shape != like.sizes().vec()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint tensor ", name, " is ", c10::toString(t.dtype), " [",
          absl::StrJoin(t.shape, ","), "], the model's ", c10::toString(like.scalar_type()), " [",
          absl::StrJoin(like.sizes().vec(), ","), "]"));
    }
    void* data = const_cast<char*>(shard_.data[it->second].data());
    return torch::from_blob(data, t.shape, torch::TensorOptions().dtype(t.dtype));
  }

 private:
  const ShardView& shard_;
  std::unordered_map<std::string, size_t> index_;
};

absl::Status RestoreShard(const ShardView& shard, const CheckpointShape& expected,
                          torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                          TrainingState* state) {
  const ShardHeader& h = shard.header;
  if (h.shape.model != expected.model) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint is for model ", h.shape.model,
                                                      ", config says ", expected.model));
  }
  if (h.shape.global_batch != expected.global_batch) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint was written with global_batch ", h.shape.global_batch,
                     ", config says ", expected.global_batch,
                     "; data batch indices would not line up"));
  }
  const ShardTensors tensors(shard);
  torch::NoGradGuard no_grad;

  // Weights (in place, so the optimizer's references stay valid).
  size_t in_checkpoint = 0, restored = 0;
  for (const ShardTensor& t : h.tensors) in_checkpoint += absl::StartsWith(t.name, "model/");
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    torch::Tensor p = item.value();
    ASSIGN_OR_RETURN(torch::Tensor saved, tensors.View("model/" + item.key(), p));
    p.copy_(saved);
    names[p.unsafeGetTensorImpl()] = item.key();
    ++restored;
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    torch::Tensor b = item.value();
    ASSIGN_OR_RETURN(torch::Tensor saved, tensors.View("model/" + item.key(), b));
    b.copy_(saved);
    ++restored;
  }
  if (restored != in_checkpoint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint holds ", in_checkpoint, " model tensors, the model ", restored));
  }

  // AdamW state, matched by parameter name within each group.
  std::vector<torch::optim::OptimizerParamGroup>& groups = optimizer.param_groups();
  if (groups.size() != h.optimizer_groups.size()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint has ", h.optimizer_groups.size(),
                                                      " optimizer groups, the optimizer ",
                                                      groups.size()));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const ShardOptimizerGroup& saved = h.optimizer_groups[g];
    auto* options = dynamic_cast<torch::optim::AdamWOptions*>(&groups[g].options());
    if (options == nullptr) {
      return absl::FailedPreconditionError("checkpoints hold AdamW state; the optimizer is not AdamW");
    }
    const std::vector<torch::Tensor>& params = groups[g].params();
    if (params.size() != saved.params.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "optimizer group ", g, " has ", params.size(), " parameters, the checkpoint's ",
          saved.params.size()));
    }
    options->lr(saved.lr).betas(std::make_tuple(saved.beta1, saved.beta2)).eps(saved.eps);
    options->weight_decay(saved.weight_decay).amsgrad(saved.amsgrad);
    for (size_t i = 0; i < params.size(); ++i) {
      auto name = names.find(params[i].unsafeGetTensorImpl());
      if (name == names.end() || name->second != saved.params[i]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "optimizer group ", g, " parameter ", i, " is ",
            name == names.end() ? std::string("not a model parameter") : name->second,
            ", the checkpoint's ", saved.params[i]));
      }
      const OptimizerStateKey key = StateKeyOf(params[i]);
      if (saved.steps[i] < 0) {
        optimizer.state().erase(key);
        continue;
      }
      const std::string prefix = absl::StrCat("optimizer/", saved.params[i], "/");
      auto adam = std::make_unique<torch::optim::AdamWParamState>();
      adam->step(saved.steps[i]);
      ASSIGN_OR_RETURN(torch::Tensor exp_avg, tensors.View(prefix + "exp_avg", params[i]));
      ASSIGN_OR_RETURN(torch::Tensor exp_avg_sq, tensors.View(prefix + "exp_avg_sq", params[i]));
      adam->exp_avg(exp_avg.clone());
      adam->exp_avg_sq(exp_avg_sq.clone());
      if (tensors.Has(prefix + "max_exp_avg_sq")) {
        ASSIGN_OR_RETURN(torch::Tensor max_sq, tensors.View(prefix + "max_exp_avg_sq", params[i]));
        adam->max_exp_avg_sq(max_sq.clone());
      }
      optimizer.state()[key] = std::move(adam);
    }
  }

  // torch's default CPU generator.
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    const torch::Tensor current = generator.get_state();
    ASSIGN_OR_RETURN(torch::Tensor saved, tensors.View("rng/cpu", current));
    generator.set_state(saved.clone());
  }
  *state = h.state;
  return absl::OkStatus();
}

}  // namespace

std::string ModelFingerprint(const GptConfig& c) {
  std::string f = absl::StrCat("n_layer=", c.n_layer, ",n_head=", c.n_head, ",d_model=", c.d_model,
                               ",seq_len=", c.seq_len, ",vocab_size=", c.vocab_size);
  // GPT-2's shape keeps the fingerprint it always had (so its checkpoints
  // stay loadable); every other member of the family names its knobs.
  if (!IsGpt2Shape(c)) {
    absl::StrAppend(&f, ",n_kv_head=", KvHeads(c), ",ffn_hidden=", FfnHidden(c),
                    ",gated_mlp=", c.gated_mlp ? 1 : 0, ",bias=", c.bias ? 1 : 0,
                    ",rms_norm=", c.rms_norm ? 1 : 0, ",rotary=", c.rotary ? 1 : 0,
                    ",tied_embeddings=", c.tied_embeddings ? 1 : 0, ",rope_theta=", c.rope_theta,
                    ",norm_eps=", c.norm_eps);
  }
  return f;
}

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return (fs::path(dir) / absl::StrFormat("%s%0*d", kStepPrefix, kStepDigits, step)).string();
}

std::string ShardFileName(int rank) { return absl::StrFormat("shard-%05d.bin", rank); }

std::vector<CheckpointEntry> ListCheckpoints(const std::string& dir) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (const int64_t step = StepOfDirectoryName(name);
        step >= 0 && it->is_directory(type_ec)) {
      out.push_back({step, it->path().string(), ManifestGeneration(it->path().string()), false});
    } else if (const int64_t legacy_step = legacy_checkpoint::StepOfFileName(name); legacy_step >= 0) {
      out.push_back({legacy_step, it->path().string(),
                     legacy_checkpoint::SidecarGeneration(it->path().string()), true});
    }
  }
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    if (a.generation != b.generation) return a.generation > b.generation;
    if (a.step != b.step) return a.step > b.step;
    return !a.legacy && b.legacy;
  });
  return out;
}

bool IsOnBranch(const CheckpointEntry& entry, const Lineage& lineage, int64_t tip_step) {
  for (size_t i = 0; i < lineage.size(); ++i) {
    if (lineage[i].first != entry.generation) continue;
    const int64_t last = i + 1 < lineage.size() ? lineage[i + 1].second : tip_step;
    return entry.step >= lineage[i].second && entry.step <= last;
  }
  return false;
}

void RemoveTemporaries(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if ((absl::StartsWith(name, kStepPrefix) && absl::StrContains(name, kTempInfix)) ||
        legacy_checkpoint::IsTemporaryName(name)) {
      doomed.push_back(it->path());
    }
  }
  for (const fs::path& path : doomed) fs::remove_all(path, ec);
}

void DeleteCheckpoint(const CheckpointEntry& entry) {
  std::error_code ec;
  if (entry.legacy) {
    fs::remove(legacy_checkpoint::SidecarPath(entry.path), ec);  // sidecar first: never a
    fs::remove(entry.path, ec);                     // sidecar without its data
    return;
  }
  const std::string doomed = absl::StrCat(entry.path, kTempInfix, ::getpid(), "-deleted");
  fs::remove_all(doomed, ec);
  fs::rename(entry.path, doomed, ec);
  fs::remove_all(ec ? fs::path(entry.path) : fs::path(doomed), ec);
}

std::vector<std::string> PruneCheckpoints(const std::string& dir, int keep,
                                          int64_t retain_distance_steps, const Lineage& lineage,
                                          int64_t tip_step) {
  std::vector<std::string> deleted;
  if (keep <= 0) return deleted;
  // On the branch, lineage order is step order, newest first.
  std::vector<CheckpointEntry> branch, doomed;
  for (CheckpointEntry& entry : ListCheckpoints(dir)) {
    if (IsOnBranch(entry, lineage, tip_step)) {
      branch.push_back(std::move(entry));
    } else if (entry.step <= tip_step) {
      doomed.push_back(std::move(entry));  // an abandoned branch, passed
    }                                      // (later steps: kept for now)
  }
  // Keep the newest `keep`; with a reserve, also the newest at or before
  // tip_step - retain_distance_steps and everything after it (those become
  // the reserve as the branch advances, so they must not go first).
  size_t kept = std::min(branch.size(), static_cast<size_t>(keep));
  if (retain_distance_steps > 0) {
    const int64_t target = tip_step - retain_distance_steps;
    size_t reserve = 0;
    while (reserve < branch.size() && branch[reserve].step > target) ++reserve;
    kept = std::max(kept, std::min(reserve + 1, branch.size()));
  }
  doomed.insert(doomed.end(), branch.begin() + kept, branch.end());
  for (const CheckpointEntry& entry : doomed) {
    // Logged before it goes, so that the catalog calls it pruned even if
    // this rank dies before reporting it (common/prune_log.h); what cannot
    // be logged is kept.
    if (!AppendPruneLog(dir, fs::path(entry.path).filename().string()).ok()) continue;
    DeleteCheckpoint(entry);
    std::error_code ec;
    if (!fs::exists(entry.path, ec) && !ec) deleted.push_back(entry.path);
  }
  return deleted;
}

absl::StatusOr<VerifiedCheckpoint> VerifyCheckpoint(const CheckpointEntry& entry,
                                                    VerificationFailure* failure) {
  VerificationFailure ignored;
  if (failure == nullptr) failure = &ignored;
  if (!entry.legacy) return VerifyDirectory(entry, failure);
  VerifiedCheckpoint verified;
  verified.path = entry.path;
  verified.legacy = true;
  absl::StatusOr<std::string> bytes = legacy_checkpoint::ReadVerified(entry.path);
  if (!bytes.ok()) {
    // ReadVerified reads the sidecar, then the file, then compares.
    std::error_code ec;
    const std::string sidecar = legacy_checkpoint::SidecarPath(entry.path);
    if (!fs::exists(sidecar, ec)) {
      *failure = {sidecar, kCheckMissing};
    } else if (!fs::exists(entry.path, ec)) {
      *failure = {entry.path, kCheckMissing};
    } else {
      *failure = {entry.path, kCheckSha256};
    }
    return bytes.status();
  }
  verified.bytes = *std::move(bytes);
  return verified;
}

absl::StatusOr<std::string> ReadVerifiedCheckpoint(const CheckpointEntry& entry) {
  ASSIGN_OR_RETURN(VerifiedCheckpoint verified, VerifyCheckpoint(entry));
  if (verified.manifest.layout == kShardedLayout) {
    return absl::FailedPreconditionError(absl::StrCat(
        entry.path, ": a sharded checkpoint has no single shard to restore from; read it with "
                    "parallel/sharded_checkpoint.h"));
  }
  return std::move(verified.bytes);
}

absl::Status RestoreCheckpoint(absl::string_view bytes, const CheckpointShape& expected,
                               torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                               TrainingState* state) {
  try {
    if (!IsShard(bytes)) {
      return legacy_checkpoint::Restore(bytes, expected, module, optimizer, state);
    }
    ASSIGN_OR_RETURN(ShardView shard, ParseShard(bytes));
    return RestoreShard(shard, expected, module, optimizer, state);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("restoring the checkpoint: ", e.what()));
  }
}

}  // namespace loom::engine
