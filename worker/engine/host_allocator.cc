#include "worker/engine/host_allocator.h"

#include <climits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace loom::engine {

absl::Status RetainFreedHostMemory() {
#if defined(__GLIBC__)
  // No mmap per allocation: large blocks come from the heap like small ones.
  if (mallopt(M_MMAP_MAX, 0) != 1) {
    return absl::InternalError("mallopt(M_MMAP_MAX, 0) failed");
  }
  // Never give the top of the heap back (the threshold is an int).
  if (mallopt(M_TRIM_THRESHOLD, INT_MAX) != 1) {
    return absl::InternalError("mallopt(M_TRIM_THRESHOLD, INT_MAX) failed");
  }
  return absl::OkStatus();
#else
  return absl::UnimplementedError("RetainFreedHostMemory: not glibc; allocator left as it is");
#endif
}

}  // namespace loom::engine
