// LibTorch autocast state of the calling thread, behind one small interface
// that compiles against LibTorch 1.13 (per-device functions such as
// set_cpu_enabled) and 2.4+ (set_autocast_enabled(device, ...)).
//
// Autocast state is thread-local; nothing here is shared between threads.
#ifndef LOOM_WORKER_ENGINE_AUTOCAST_H_
#define LOOM_WORKER_ENGINE_AUTOCAST_H_

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace loom::engine {

// Whether autocast is on for one device type, and to which dtype it casts.
struct AutocastState {
  bool enabled = false;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
};

// kCPU or kCUDA.
AutocastState GetAutocastState(c10::DeviceType device);
void SetAutocastState(c10::DeviceType device, const AutocastState& state);

// RAII region, as Python's `with torch.autocast(device, dtype, enabled)`:
// sets the state and bumps autocast's nesting count; on exit restores the
// previous state and, when the outermost region closes, clears autocast's
// cache of lower-precision weight copies (so that they never outlive the
// region, and later weight updates are seen).
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, AutocastState state);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  AutocastState previous_;
};

// RAII: turns autocast's weight-cast cache off (or on) and restores it.
class AutocastCacheGuard {
 public:
  explicit AutocastCacheGuard(bool enabled);
  ~AutocastCacheGuard();
  AutocastCacheGuard(const AutocastCacheGuard&) = delete;
  AutocastCacheGuard& operator=(const AutocastCacheGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_AUTOCAST_H_
