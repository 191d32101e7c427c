// A minimal binding to NVIDIA's management library (NVML), loaded at run time
// with dlopen so the build needs neither the CUDA toolkit nor NVML headers:
// the few types and entry points used are declared in nvml.cc.
//
// Only what energy accounting needs: device count, the board's total-energy
// counter and its power draw.
#ifndef LOOM_WORKER_TELEMETRY_NVML_H_
#define LOOM_WORKER_TELEMETRY_NVML_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::telemetry {

// Thread safety: once Open() has returned, every const method may be called
// from any number of threads at once (NVML itself is thread-safe and the
// object holds no mutable state). Destruction must not race with calls.
// Several Nvml objects may live at once: nvmlInit_v2/nvmlShutdown are
// reference counted by NVML, and dlopen/dlclose by the dynamic loader.
class Nvml {
 public:
  // The driver's library; the environment variable kLibraryEnv overrides it
  // when Open() is given no path.
  static constexpr const char* kDefaultLibrary = "libnvidia-ml.so.1";
  static constexpr const char* kLibraryEnv = "LOOM_NVML_LIBRARY";

  // Loads `library` (a file name searched the dlopen way, or a path; empty:
  // $LOOM_NVML_LIBRARY, else kDefaultLibrary), resolves the entry points and
  // calls nvmlInit_v2. Errors:
  //   NOT_FOUND            the library cannot be loaded (no NVIDIA driver)
  //   FAILED_PRECONDITION  an entry point is missing (driver too old)
  //   UNAVAILABLE etc.     nvmlInit_v2 failed; the message says why, e.g.
  //                        "nvmlInit_v2: Driver Not Loaded (...)".
  static absl::StatusOr<std::unique_ptr<Nvml>> Open(const std::string& library = "");

  // nvmlShutdown, then dlclose.
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The library as given to dlopen.
  const std::string& library() const { return library_; }

  // Number of GPUs NVML sees (all of them, not only CUDA_VISIBLE_DEVICES).
  absl::StatusOr<int> DeviceCount() const;

  // nvmlDeviceGetTotalEnergyConsumption: millijoules the board has used
  // since the driver was last loaded. Volta and newer; older GPUs give
  // UNIMPLEMENTED "... Not Supported on device N (pre-Volta GPU)".
  absl::StatusOr<uint64_t> TotalEnergyMillijoules(int device) const;

  // nvmlDeviceGetPowerUsage: the board's power draw in milliwatts (on most
  // boards an average over about one second, ±5% of the reading).
  absl::StatusOr<uint32_t> PowerMilliwatts(int device) const;

  // nvmlDeviceGetName: the board's product name, e.g. "NVIDIA H200" or
  // "NVIDIA A100-SXM4-80GB".
  absl::StatusOr<std::string> DeviceName(int device) const;

  struct Api;  // resolved entry points; defined in nvml.cc

 private:
  Nvml(std::string library, void* handle, std::unique_ptr<Api> api);
  // The NVML handle of GPU `device`, as an opaque pointer.
  absl::StatusOr<void*> Device(int device) const;

  std::string library_;
  void* handle_;  // from dlopen; owned
  std::unique_ptr<Api> api_;
};

}  // namespace loom::telemetry

#endif  // LOOM_WORKER_TELEMETRY_NVML_H_
