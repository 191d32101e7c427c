#include "worker/engine/host_allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

namespace loom::engine {
namespace {

// After the call a 128 MiB block comes from the heap, not from its own
// mmap, and freeing it keeps the memory in the process for the next one.
TEST(HostAllocator, LargeBlocksComeFromTheHeapAndStayAfterFree) {
  ASSERT_TRUE(RetainFreedHostMemory().ok());
  constexpr size_t kBytes = size_t{128} << 20;
  const size_t mmapped_before = mallinfo2().hblkhd;
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);  // touch it
  EXPECT_EQ(mallinfo2().hblkhd, mmapped_before) << "the block was mmapped on its own";
  std::free(block);
  EXPECT_GE(mallinfo2().fordblks, kBytes) << "the freed block went back to the kernel";
  // The next block of that size reuses those pages.
  char* again = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(mallinfo2().hblkhd, mmapped_before);
  std::free(again);
}

}  // namespace
}  // namespace loom::engine
