// libFuzzer target: the checkpoint readers a load runs on bytes from disk:
// the manifest (MANIFEST.json, checksummed JSON) and a shard's header
// (magic, length, JSON header, tensor table). The first byte picks which,
// so one corpus holds seeds of both. Built only in the fuzz build.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "worker/engine/checkpoint/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto manifest = loom::engine::ParseManifest(bytes, "fuzz/MANIFEST.json");
    if (manifest.ok()) {
      // What it parsed serialises to a manifest that parses again.
      const std::string again = loom::engine::SerializeManifest(*manifest);
      (void)loom::engine::ParseManifest(again, "fuzz/again").ok();
    }
  } else {
    (void)loom::engine::ParseShard(bytes).ok();
  }
  return 0;
}
