// loom-ckpt: inspect trainer checkpoints.
//   loom-ckpt digest CHECKPOINT...   one line each: <sha256 of the model> <tensors> <parameters> CHECKPOINT
// (a step directory, which is verified against its manifest first, or an
// old single-file checkpoint)
// Two checkpoints have the same digest exactly when their model parameters
// are bitwise equal. Exit 1 with a reason on stderr if a file is unreadable.
//
//   loom-ckpt verify CHECKPOINT...   re-reads every file of each checkpoint
// (a step-<9 digits> directory, or an old ckpt_<8 digits>.pt file) and checks
// it against its manifest (sidecar), as a rank does before resuming from it.
// One line each on stdout, fields separated by tabs (paths may hold spaces):
//   ok<TAB>CHECKPOINT
//   corrupt<TAB>CHECKPOINT<TAB>FILE<TAB>CHECK<TAB>MESSAGE
// where FILE is the file that failed and CHECK which check (checkpoint.h's
// kCheck* names: missing, unreadable, manifest_crc32c, manifest_content,
// size, crc32c, sha256). Exit 0 if every one verified, 1 if any did not, 2
// for bad usage (a name that is not a checkpoint's included). The
// controller runs it for `loomctl checkpoints JOB --verify`.
#include <filesystem>
#include <iostream>
#include <string>

#include "absl/strings/str_replace.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/checkpoint_inspect.h"

namespace {

constexpr char kUsage[] = "usage: loom-ckpt digest CHECKPOINT... | loom-ckpt verify CHECKPOINT...";

int Digest(int argc, char** argv) {
  int rc = 0;
  for (int i = 2; i < argc; ++i) {
    auto d = loom::engine::DigestCheckpointModel(argv[i]);
    if (!d.ok()) {
      std::cerr << "loom-ckpt: " << d.status() << std::endl;
      rc = 1;
      continue;
    }
    std::cout << d->sha256 << " " << d->tensors << " " << d->parameters << " " << argv[i]
              << std::endl;
  }
  return rc;
}

// The listing entry of a checkpoint path, as ListCheckpoints would make it
// (its step from its name), or false if the name is not a checkpoint's.
bool EntryOf(const std::string& path, loom::engine::CheckpointEntry* entry) {
  namespace fs = std::filesystem;
  const fs::path p = fs::path(path).lexically_normal();
  const fs::path dir = p.has_filename() ? p.parent_path() : p.parent_path().parent_path();
  const std::string name = (p.has_filename() ? p : p.parent_path()).filename().string();
  for (const loom::engine::CheckpointEntry& e : loom::engine::ListCheckpoints(dir.string())) {
    if (fs::path(e.path).filename().string() == name) {
      *entry = e;
      return true;
    }
  }
  // Not listed: a step directory that is gone (it verifies as missing its
  // manifest), or a name that is not a checkpoint's.
  if (name.size() == 14 && name.compare(0, 5, "step-") == 0 &&
      name.find_first_not_of("0123456789", 5) == std::string::npos) {
    *entry = {std::stoll(name.substr(5)), (dir / name).string(), -1, false};
    return true;
  }
  return false;
}

std::string OneLine(const std::string& s) {
  return absl::StrReplaceAll(s, {{"\t", " "}, {"\n", " "}});
}

int Verify(int argc, char** argv) {
  int rc = 0;
  for (int i = 2; i < argc; ++i) {
    loom::engine::CheckpointEntry entry;
    if (!EntryOf(argv[i], &entry)) {
      std::cerr << "loom-ckpt: " << argv[i]
                << ": not a checkpoint (step-<9 digits> or ckpt_<8 digits>.pt)" << std::endl;
      return 2;
    }
    loom::engine::VerificationFailure failure;
    absl::StatusOr<loom::engine::VerifiedCheckpoint> verified =
        loom::engine::VerifyCheckpoint(entry, &failure);
    if (verified.ok()) {
      std::cout << "ok\t" << OneLine(argv[i]) << "\n";
    } else {
      std::cout << "corrupt\t" << OneLine(argv[i]) << "\t" << OneLine(failure.file) << "\t"
                << failure.check << "\t" << OneLine(std::string(verified.status().message()))
                << "\n";
      rc = 1;
    }
  }
  std::cout << std::flush;
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc >= 2 ? argv[1] : "";
  if (argc < 3 || (command != "digest" && command != "verify")) {
    std::cerr << kUsage << std::endl;
    return 2;
  }
  return command == "digest" ? Digest(argc, argv) : Verify(argc, argv);
}
