#include "worker/engine/checkpoint_legacy.h"

#include <algorithm>
#include <filesystem>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/serialize/input-archive.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/sha256.h"

namespace loom::engine {
namespace legacy_checkpoint {
namespace {

constexpr absl::string_view kPrefix = "ckpt_";
constexpr absl::string_view kExtension = ".pt";
constexpr absl::string_view kSidecarExtension = ".sha256";
constexpr absl::string_view kTempInfix = ".tmp.";
constexpr absl::string_view kSidecarGenerationPrefix = "# loom generation=";
constexpr char kFormatV2[] = "loom-checkpoint-v2";
constexpr char kFormatV1[] = "loom-checkpoint-v1";

absl::Status DataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

}  // namespace

int64_t StepOfFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kPrefix) || !absl::ConsumeSuffix(&name, kExtension) ||
      name.empty() || !std::all_of(name.begin(), name.end(), absl::ascii_isdigit)) {
    return -1;
  }
  int64_t step = -1;
  return absl::SimpleAtoi(name, &step) ? step : -1;
}

bool IsTemporaryName(absl::string_view name) {
  return absl::StartsWith(name, kPrefix) && absl::StrContains(name, kTempInfix);
}

std::string SidecarPath(const std::string& checkpoint_path) {
  return absl::StrCat(checkpoint_path, kSidecarExtension);
}

int64_t SidecarGeneration(const std::string& checkpoint_path) {
  absl::StatusOr<std::string> sidecar = ReadFile(SidecarPath(checkpoint_path));
  if (!sidecar.ok()) return -1;
  const size_t at = sidecar->find(absl::StrCat("\n", kSidecarGenerationPrefix));
  if (at == std::string::npos) return 0;
  absl::string_view rest =
      absl::string_view(*sidecar).substr(at + 1 + kSidecarGenerationPrefix.size());
  rest = rest.substr(0, std::min(rest.find(' '), rest.find('\n')));
  int64_t generation = -1;
  if (!absl::SimpleAtoi(rest, &generation) || generation < 0) return -1;
  return generation;
}

absl::StatusOr<std::string> ReadVerified(const std::string& path) {
  absl::StatusOr<std::string> sidecar = ReadFile(SidecarPath(path));
  if (!sidecar.ok()) return DataLoss(SidecarPath(path), "missing or unreadable");
  // sha256sum format: "<64 hex>  <file name>\n".
  const absl::string_view expected = absl::string_view(*sidecar).substr(0, 64);
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return DataLoss(path, bytes.status().message());
  const std::string actual = Sha256Hex(*bytes);
  if (expected != actual) {
    return DataLoss(path, absl::StrCat("sha256 ", actual, " does not match sidecar ", expected));
  }
  return bytes;
}

// The archive holds the model and optimizer as nested archives
// (Module::save / Optimizer::save) beside the loop state.
absl::Status Restore(absl::string_view bytes, const CheckpointShape& expected,
                     torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                     TrainingState* state) {
  torch::serialize::InputArchive root;
  root.load_from(bytes.data(), bytes.size());
  c10::IValue value;
  root.read("format", value);
  const bool v1 = value.toStringRef() == kFormatV1;
  if (!v1 && value.toStringRef() != kFormatV2) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint format ", value.toStringRef(), ", expected ", kFormatV2));
  }
#if TORCH_VERSION_MAJOR >= 2
  // These formats hold torch::optim's own archive, whose state keys
  // LibTorch 1.13 wrote as "0x..." address strings and 2.x reads as decimal
  // numbers: every parameter's state would land on one key. Refused before
  // anything is restored.
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint format ", value.toStringRef(), " holds LibTorch 1.13's optimizer archive, which "
      "LibTorch ", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
      " cannot read back; resume it with a LibTorch 1.13 build of Loom, or start a new job"));
#endif
  root.read("model_config", value);
  if (value.toStringRef() != expected.model) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint is for model ", value.toStringRef(), ", config says ", expected.model));
  }
  root.read("step", value);
  state->step = value.toInt();
  if (v1) {
    root.read("data_cursor", value);
    if (value.toInt() % expected.global_batch != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint's data cursor ", value.toInt(),
                       " is not a multiple of global_batch ", expected.global_batch));
    }
    state->next_data_batch = value.toInt() / expected.global_batch;
    state->generation = 0;
    state->lineage = {{0, 0}};
    state->skip_batches.clear();
  } else {
    root.read("global_batch", value);
    if (value.toInt() != expected.global_batch) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint was written with global_batch ", value.toInt(),
                       ", config says ", expected.global_batch,
                       "; data batch indices would not line up"));
    }
    root.read("next_data_batch", value);
    state->next_data_batch = value.toInt();
    root.read("skip_batches", value);
    const std::vector<int64_t> ranges = value.toIntVector();
    state->skip_batches.clear();
    for (size_t i = 0; i + 1 < ranges.size(); i += 2) {
      state->skip_batches.push_back({ranges[i], ranges[i + 1]});
    }
    root.read("generation", value);
    state->generation = value.toInt();
    root.read("lineage", value);
    const std::vector<int64_t> lineage = value.toIntVector();
    state->lineage.clear();
    for (size_t i = 0; i + 1 < lineage.size(); i += 2) {
      state->lineage.emplace_back(lineage[i], lineage[i + 1]);
    }
    torch::Tensor generator_state;
    root.read("cpu_generator_state", generator_state, /*is_buffer=*/true);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(generator_state);
  }
  root.read("loss", value);
  state->loss = value.toDouble();
  root.read("has_val_loss", value);
  state->has_val_loss = value.toBool();
  root.read("val_loss", value);
  state->val_loss = value.toDouble();
  torch::serialize::InputArchive model_archive;
  root.read("model", model_archive);
  module.load(model_archive);
  torch::serialize::InputArchive optimizer_archive;
  root.read("optimizer", optimizer_archive);
  optimizer.load(optimizer_archive);
  return absl::OkStatus();
}

}  // namespace legacy_checkpoint

std::string LegacyCheckpointPath(const std::string& dir, int64_t step) {
  return (std::filesystem::path(dir) /
          absl::StrFormat("%s%08d%s", legacy_checkpoint::kPrefix, step,
                          legacy_checkpoint::kExtension))
      .string();
}

}  // namespace loom::engine
