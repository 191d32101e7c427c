// OpenMP wait policy of a training process (the fused step).
//
// A CPU training step alternates between two thread pools on the same cores:
// LibTorch's element-wise and reduction operators, its bf16 matrix products
// (oneDNN) and Loom's kernels run on the OpenMP team; the fp32 matrix
// products run on OpenBLAS's own threads. After each parallel region GNU
// OpenMP lets the team spin for GOMP_SPINCOUNT iterations (300000 by
// default, several milliseconds) before it sleeps, and on a machine with as
// many threads as cores that spinning takes the cores from the BLAS threads
// of the matrix product that follows. Not spinning at all
// (OMP_WAIT_POLICY=PASSIVE) fixes that but makes every one of oneDNN's many
// short regions wake sleeping threads. Measured on the benchmark configurations
// (2 threads, 2 cores; medians; the environment variable in front of
// ./bench/run.sh sets the policy of the Loom side; one run per cell, and
// runs on these hosts differ by ~10%):
//
//   policy                 bench train: forward +    bench precision: tok/s
//                          backward stages, d 256    fp32 / bf16, d 512
//   GOMP_SPINCOUNT=300000  0.479 s                   477 / 475
//     (the default)
//   GOMP_SPINCOUNT=30000   0.301 s                   665 / 465
//   GOMP_SPINCOUNT=10000                             670 / 424
//   OMP_WAIT_POLICY=       0.262 s                   611 / 368
//     PASSIVE (no spin)
//
// so a training process spins kTrainingSpinCount iterations: long enough for
// back-to-back OpenMP regions, short enough to be off the cores when a BLAS
// call starts.
//
// GNU OpenMP reads these settings once, when it is loaded, so a process
// cannot change them for itself afterwards. A process that exists to train
// calls ReexecWithShortOpenMpSpin first thing in main: when the environment
// leaves the policy open, it sets GOMP_SPINCOUNT and replaces itself with a
// fresh image of the same executable and arguments (same pid, same open
// files), which the runtime then starts with. A policy the user chose
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment) is kept as it is.
#ifndef LOOM_WORKER_ENGINE_OPENMP_WAIT_H_
#define LOOM_WORKER_ENGINE_OPENMP_WAIT_H_

#include <string>

#include "absl/status/status.h"

namespace loom::engine {

// Spin iterations of an idle OpenMP thread before it sleeps, in a training
// process (see the table above).
inline constexpr int kTrainingSpinCount = 30000;

// Which policy the process runs with and why, for its log, e.g.
// "GOMP_SPINCOUNT=30000 (set by Loom)" or
// "OMP_WAIT_POLICY=active (from the environment)".
std::string OpenMpWaitPolicyDescription();

// True when the environment already decides how OpenMP threads wait
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, even to an empty string).
bool OpenMpWaitPolicyChosen();

// Call before any other thread starts and before anything is written to
// stdout/stderr through a buffer (the re-executed image starts with empty
// buffers). If the environment has chosen a policy: returns OK and does
// nothing. Otherwise sets GOMP_SPINCOUNT=kTrainingSpinCount and
// LOOM_OPENMP_WAIT_SET=1 and execs /proc/self/exe with `argv`; returns only
// if that fails (Internal, with errno's message: the process then goes on
// with the runtime's default, which is slower but correct). argv must be
// main's, null-terminated.
absl::Status ReexecWithShortOpenMpSpin(char** argv);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPENMP_WAIT_H_
