// How an NCCL collective's timeout or error reaches Loom: as an error in the
// thread that waits for it, never as an abort of the process.
//
// LibTorch 2.x runs a watchdog thread per NCCL process group that, on a
// timeout or a communicator error, rethrows out of its own thread
// (std::terminate: SIGABRT with no reason the supervisor can read), and a
// heartbeat monitor that aborts the process when the watchdog is stuck.
// With blocking wait, Work::wait() polls the work itself and, on a timeout,
// aborts the communicator and throws c10::Error (c10::DistBackendError on
// 2.x) in the caller; Train turns that into an INTERNAL status and the rank
// exits with it, as it does for a Gloo timeout, so the controller records
// the reason and the restart policy counts a failure.
//
// Version notes (PyTorch's ProcessGroupNCCL.hpp/.cpp): 1.13 reads
// NCCL_BLOCKING_WAIT and NCCL_ASYNC_ERROR_HANDLING; 2.2 and later read the
// TORCH_-prefixed names first (the old ones still work, with a warning);
// 2.6 creates no watchdog (and so no heartbeat monitor) under blocking
// wait. Both names are set, with async error handling off (0), which 1.13
// forces under blocking wait anyway, and the monitor off for 2.2-2.5, where
// the watchdog may still run beside blocking wait.
//
// No LibTorch here: the variables are read when a ProcessGroupNCCL is
// constructed, so ConfigureNcclErrorHandling() must run before the first
// one is, and before other threads that read the environment start.
#ifndef LOOM_WORKER_ENGINE_PARALLEL_NCCL_ERRORS_H_
#define LOOM_WORKER_ENGINE_PARALLEL_NCCL_ERRORS_H_

#include <string>
#include <utility>
#include <vector>

namespace loom::engine {

// The environment ConfigureNcclErrorHandling() sets, as (name, value).
std::vector<std::pair<std::string, std::string>> NcclErrorHandlingEnvironment();

// Sets NcclErrorHandlingEnvironment() in this process, overwriting any value
// (Loom's failure contract depends on it). Idempotent; not thread-safe
// (setenv), so call it before starting threads that read the environment.
void ConfigureNcclErrorHandling();

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARALLEL_NCCL_ERRORS_H_
