// Test helper for openmp_wait_test.cc: reports its pid and environment
// before and after ReexecWithShortOpenMpSpin, then runs one OpenMP region
// so that the runtime (with OMP_DISPLAY_ENV=VERBOSE) prints the spin count
// it actually uses. Writes with dprintf (unbuffered) because the process
// image is replaced in between.
#include <omp.h>
#include <stdio.h>
#include <unistd.h>

#include <cstdlib>

#include "worker/engine/openmp_wait.h"

int main(int argc, char** argv) {
  (void)argc;
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  dprintf(1, "start pid=%ld policy=%s spin=%s\n", static_cast<long>(getpid()),
          policy != nullptr ? policy : "(unset)", spin != nullptr ? spin : "(unset)");
  const absl::Status s = loom::engine::ReexecWithShortOpenMpSpin(argv);
  dprintf(1, "status=%s\n", s.ok() ? "OK" : std::string(s.message()).c_str());
  dprintf(1, "described=%s\n", loom::engine::OpenMpWaitPolicyDescription().c_str());
  int threads = 0;
#pragma omp parallel reduction(+ : threads)
  threads += 1;
  dprintf(1, "threads=%d\n", threads);
  return 0;
}
