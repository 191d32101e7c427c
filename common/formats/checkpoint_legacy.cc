#include "common/formats/checkpoint_legacy.h"

#include <algorithm>
#include <filesystem>


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

}  // namespace legacy_checkpoint

std::string LegacyCheckpointPath(const std::string& dir, int64_t step) {
  return (std::filesystem::path(dir) /
          absl::StrFormat("%s%08d%s", legacy_checkpoint::kPrefix, step,
                          legacy_checkpoint::kExtension))
      .string();
}

}  // namespace loom::engine
