// OpenMP wait policy of a training process (issue 6, the fused step).
//
// A CPU training step alternates between two thread pools on the same cores:
// LibTorch's element-wise and reduction operators (and Loom's kernels) run on
// the OpenMP team, the matrix products on OpenBLAS's own threads. By default
// GNU OpenMP lets the team's threads spin for a while after each parallel
// region, and on a machine with as many threads as cores that spinning takes
// the cores from the BLAS threads of the matrix product that follows. On
// issue 6's configuration (2 threads, 2 cores) the transformer blocks'
// forward + backward ran 1.75x faster with the team waiting passively
// (median 0.455 -> 0.26 s per step, same binary; bench/train: 1594 -> 1788
// tok/s).
//
// GNU OpenMP (and LLVM's) read OMP_WAIT_POLICY once, when the runtime is
// loaded, so a process cannot change it for itself afterwards. A process
// that exists to train calls ReexecWithPassiveOpenMpWait first thing in
// main: when the environment leaves the policy open, it sets
// OMP_WAIT_POLICY=PASSIVE and replaces itself with a fresh image of the same
// executable and arguments (same pid, same open files), which the runtime
// then starts with. A policy the user chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT
// in the environment) is kept as it is.
#ifndef LOOM_WORKER_ENGINE_OPENMP_WAIT_H_
#define LOOM_WORKER_ENGINE_OPENMP_WAIT_H_

#include <string>

#include "absl/status/status.h"

namespace loom::engine {

// Which policy the process runs with and why, for its log, e.g.
// "OMP_WAIT_POLICY=PASSIVE (set by loom-rank)" or
// "OMP_WAIT_POLICY=active (from the environment)".
std::string OpenMpWaitPolicyDescription();

// True when the environment already decides how OpenMP threads wait
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, even to an empty string).
bool OpenMpWaitPolicyChosen();

// Call before any other thread starts and before anything is written to
// stdout/stderr through a buffer (the re-executed image starts with empty
// buffers). If the environment has chosen a policy: returns OK and does
// nothing. Otherwise sets OMP_WAIT_POLICY=PASSIVE and LOOM_OPENMP_WAIT_SET=1
// and execs /proc/self/exe with `argv`; returns only if that fails (Internal,
// with errno's message: the process then goes on with the runtime's default
// policy, which is slower but correct). argv must be main's, null-terminated.
absl::Status ReexecWithPassiveOpenMpWait(char** argv);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPENMP_WAIT_H_
