// Checkpoint layout, listing, verification and retention, without LibTorch
// (checkpoint_files.h). The manifest format is in checkpoint_manifest.cc,
// versions 1/2 in checkpoint_legacy.cc, restore in checkpoint_restore.cc.
#include "common/formats/checkpoint_files.h"

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
#include "common/formats/checkpoint_legacy.h"

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
  absl::StatusOr<CheckpointManifest> manifest = ReadManifest(checkpoint_path);
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

}  // namespace

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& checkpoint_path) {
  const std::string path = (fs::path(checkpoint_path) / kManifestFileName).string();
  absl::StatusOr<std::string> bytes = ReadFileWithCrc(path, nullptr);
  if (!bytes.ok()) return bytes.status();
  return ParseManifest(*bytes, path);
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

bool CheckpointEntryOfPath(const std::string& path, CheckpointEntry* entry) {
  const fs::path p = fs::path(path).lexically_normal();
  const fs::path dir = p.has_filename() ? p.parent_path() : p.parent_path().parent_path();
  const std::string name = (p.has_filename() ? p : p.parent_path()).filename().string();
  for (const CheckpointEntry& e : ListCheckpoints(dir.string())) {
    if (fs::path(e.path).filename().string() == name) {
      *entry = e;
      return true;
    }
  }
  // Not listed: a step directory that is gone (it verifies as missing its
  // manifest), or a name that is not a checkpoint's.
  const int64_t step = StepOfDirectoryName(name);
  if (step < 0) return false;
  *entry = {step, (dir / name).string(), -1, false};
  return true;
}

}  // namespace loom::engine
