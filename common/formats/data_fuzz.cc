// libFuzzer target: the llm.c token shard reader (ReadShard) on arbitrary
// file contents, through an in-memory file, and the dataset built from
// what it accepts. Built only in the fuzz build.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/formats/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("shard", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  auto tokens = loom::engine::ReadShard("/proc/self/fd/" + std::to_string(fd));
  close(fd);
  if (!tokens.ok()) return 0;
  std::vector<std::vector<uint16_t>> shards;
  shards.push_back(std::move(*tokens));
  (void)loom::engine::TokenDataset::FromShards(std::move(shards), 8).ok();
  return 0;
}
