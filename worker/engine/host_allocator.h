// Host memory policy of a training process (the fused step).
//
// glibc's malloc serves every request above M_MMAP_THRESHOLD (at most
// 32 MiB) with a fresh mmap and returns it with munmap on free. A training
// step allocates and frees the same large temporaries every step — on the
// benchmark configuration the fused loss's [rows × vocab] chunk (268 MB), the LM
// head's weight gradient (51 MB), activations — so each step page-faults
// ~320 MB back in and the kernel zeroes it: ~0.13 s of a ~1.3 s step
// (bench/train: 1553 -> 1724 tok/s with the policy below, same binary).
//
// RetainFreedHostMemory makes malloc take every block from its heaps (no
// per-allocation mmap) and never trim freed memory back to the kernel, so
// the second step reuses the first step's pages. The process's resident set
// stays at its peak, which a training process reaches every step anyway.
// Process-wide and not reversible: call it once, early, from a process that
// exists to train (loom-rank, the training benchmarks), not from a library
// user's process. Thread-safe (mallopt takes the arena locks).
#ifndef LOOM_WORKER_ENGINE_HOST_ALLOCATOR_H_
#define LOOM_WORKER_ENGINE_HOST_ALLOCATOR_H_

#include "absl/status/status.h"

namespace loom::engine {

// OK, or Unimplemented when the C library is not glibc, or Internal when
// glibc refuses a setting.
absl::Status RetainFreedHostMemory();

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_HOST_ALLOCATOR_H_
