#include "worker/engine/autocast.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

// LibTorch 2.4 replaced the per-device functions (is_cpu_enabled,
// set_autocast_gpu_dtype, ...) by ones taking the device type, and
// deprecated the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define LOOM_AUTOCAST_BY_DEVICE 1
#else
#define LOOM_AUTOCAST_BY_DEVICE 0
#endif

namespace loom::engine {

AutocastState GetAutocastState(c10::DeviceType device) {
  TORCH_CHECK(device == c10::kCPU || device == c10::kCUDA, "autocast: unsupported device ",
              device);
  AutocastState state;
#if LOOM_AUTOCAST_BY_DEVICE
  state.enabled = at::autocast::is_autocast_enabled(device);
  state.dtype = at::autocast::get_autocast_dtype(device);
#else
  if (device == c10::kCPU) {
    state.enabled = at::autocast::is_cpu_enabled();
    state.dtype = at::autocast::get_autocast_cpu_dtype();
  } else {
    state.enabled = at::autocast::is_enabled();
    state.dtype = at::autocast::get_autocast_gpu_dtype();
  }
#endif
  return state;
}

void SetAutocastState(c10::DeviceType device, const AutocastState& state) {
  TORCH_CHECK(device == c10::kCPU || device == c10::kCUDA, "autocast: unsupported device ",
              device);
#if LOOM_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_dtype(device, state.dtype);
  at::autocast::set_autocast_enabled(device, state.enabled);
#else
  if (device == c10::kCPU) {
    at::autocast::set_autocast_cpu_dtype(state.dtype);
    at::autocast::set_cpu_enabled(state.enabled);
  } else {
    at::autocast::set_autocast_gpu_dtype(state.dtype);
    at::autocast::set_enabled(state.enabled);
  }
#endif
}

AutocastGuard::AutocastGuard(c10::DeviceType device, AutocastState state)
    : device_(device), previous_(GetAutocastState(device)) {
  SetAutocastState(device, state);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocastState(device_, previous_);
}

AutocastCacheGuard::AutocastCacheGuard(bool enabled)
    : previous_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_cache_enabled(enabled);
}

AutocastCacheGuard::~AutocastCacheGuard() { at::autocast::set_autocast_cache_enabled(previous_); }

}  // namespace loom::engine
