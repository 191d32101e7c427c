#include "worker/engine/parallel/nccl_errors.h"

#include <cstdlib>

namespace loom::engine {

std::vector<std::pair<std::string, std::string>> NcclErrorHandlingEnvironment() {
  return {
      // Work::wait() throws in the caller on a timeout or error.
      {"TORCH_NCCL_BLOCKING_WAIT", "1"},
      {"NCCL_BLOCKING_WAIT", "1"},  // LibTorch 1.13-2.1
      // No teardown from the watchdog thread (0 = NoHandling).
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"},
      {"NCCL_ASYNC_ERROR_HANDLING", "0"},  // LibTorch 1.13-2.1
      // No heartbeat monitor aborting the process (2.2-2.5).
      {"TORCH_NCCL_ENABLE_MONITORING", "0"},
  };
}

void ConfigureNcclErrorHandling() {
  for (const auto& [name, value] : NcclErrorHandlingEnvironment()) {
    ::setenv(name.c_str(), value.c_str(), /*overwrite=*/1);
  }
}

}  // namespace loom::engine
