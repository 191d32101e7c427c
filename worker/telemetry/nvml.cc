#include "worker/telemetry/nvml.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::telemetry {
namespace {

// The slice of nvml.h that Loom uses. nvmlReturn_t is a C enum (int-sized);
// nvmlDevice_t an opaque pointer. Values from NVML's public nvml.h.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_UNINITIALIZED = 1;
constexpr nvmlReturn_t NVML_ERROR_INVALID_ARGUMENT = 2;
constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
constexpr nvmlReturn_t NVML_ERROR_NO_PERMISSION = 4;
constexpr nvmlReturn_t NVML_ERROR_NOT_FOUND = 6;
constexpr nvmlReturn_t NVML_ERROR_DRIVER_NOT_LOADED = 9;
constexpr nvmlReturn_t NVML_ERROR_TIMEOUT = 10;
constexpr nvmlReturn_t NVML_ERROR_IRQ_ISSUE = 11;
constexpr nvmlReturn_t NVML_ERROR_LIBRARY_NOT_FOUND = 12;
constexpr nvmlReturn_t NVML_ERROR_FUNCTION_NOT_FOUND = 13;
constexpr nvmlReturn_t NVML_ERROR_GPU_IS_LOST = 15;
constexpr nvmlReturn_t NVML_ERROR_RESET_REQUIRED = 16;
constexpr nvmlReturn_t NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18;
constexpr nvmlReturn_t NVML_ERROR_MEMORY = 20;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_RESOURCES = 23;
constexpr nvmlReturn_t NVML_ERROR_NOT_READY = 27;
constexpr nvmlReturn_t NVML_ERROR_GPU_NOT_FOUND = 28;

struct DlcloseDeleter {
  void operator()(void* handle) const {
    if (handle != nullptr) dlclose(handle);
  }
};

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*device_count)(unsigned int*);
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*total_energy)(nvmlDevice_t, unsigned long long*);
  nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned int*);
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int);
  const char* (*error_string)(nvmlReturn_t);
};

namespace {

// What a person can do about `rc` from `call`, or "".
std::string Hint(nvmlReturn_t rc, const std::string& call) {
  switch (rc) {
    case NVML_ERROR_NOT_SUPPORTED:
      if (call == "nvmlDeviceGetTotalEnergyConsumption") return "pre-Volta GPU";
      if (call == "nvmlDeviceGetPowerUsage") return "this board has no power sensor";
      return "";
    case NVML_ERROR_NO_PERMISSION:
      return "this user may not query the GPU: check the permissions of /dev/nvidia*";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "the nvidia kernel module is not loaded: does nvidia-smi work?";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return "libnvidia-ml and the loaded kernel module differ in version: reload the "
             "nvidia module or reboot after a driver upgrade";
    case NVML_ERROR_GPU_IS_LOST:
      return "the GPU fell off the bus: look for Xid errors in dmesg";
    case NVML_ERROR_RESET_REQUIRED:
      return "the GPU needs a reset (nvidia-smi -r) or a reboot";
    default:
      return "";
  }
}

absl::StatusCode CodeOf(nvmlReturn_t rc) {
  switch (rc) {
    case NVML_ERROR_INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case NVML_ERROR_NOT_SUPPORTED:
      return absl::StatusCode::kUnimplemented;
    case NVML_ERROR_NO_PERMISSION:
      return absl::StatusCode::kPermissionDenied;
    case NVML_ERROR_NOT_FOUND:
    case NVML_ERROR_GPU_NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case NVML_ERROR_DRIVER_NOT_LOADED:
    case NVML_ERROR_TIMEOUT:
    case NVML_ERROR_IRQ_ISSUE:
    case NVML_ERROR_GPU_IS_LOST:
    case NVML_ERROR_RESET_REQUIRED:
    case NVML_ERROR_NOT_READY:
      return absl::StatusCode::kUnavailable;
    case NVML_ERROR_UNINITIALIZED:
    case NVML_ERROR_LIBRARY_NOT_FOUND:
    case NVML_ERROR_FUNCTION_NOT_FOUND:
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return absl::StatusCode::kFailedPrecondition;
    case NVML_ERROR_MEMORY:
    case NVML_ERROR_INSUFFICIENT_RESOURCES:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kUnknown;
  }
}

// "call: <NVML's words>[ on device N][ (hint)]".
absl::Status Error(const Nvml::Api& api, nvmlReturn_t rc, const std::string& call,
                   int device = -1) {
  const char* words = api.error_string != nullptr ? api.error_string(rc) : nullptr;
  std::string message = absl::StrCat(call, ": ",
                                     words != nullptr ? words : absl::StrCat("NVML error ", rc));
  if (device >= 0) absl::StrAppend(&message, " on device ", device);
  const std::string hint = Hint(rc, call);
  if (!hint.empty()) absl::StrAppend(&message, " (", hint, ")");
  return absl::Status(CodeOf(rc), message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Nvml>> Nvml::Open(const std::string& library) {
  std::string path = library;
  if (path.empty()) {
    const char* env = std::getenv(kLibraryEnv);
    path = env != nullptr && *env != '\0' ? env : kDefaultLibrary;
  }
  dlerror();
  std::unique_ptr<void, DlcloseDeleter> handle(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::NotFoundError(absl::StrCat(
        path, " not found: ",
        path == kDefaultLibrary ? "no NVIDIA driver on this host"
                                : absl::StrCat("check ", kLibraryEnv, " or the path given"),
        " (dlopen: ", why != nullptr ? why : "unknown error", ")"));
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle.get(), name));
    if (fn == nullptr && missing.empty()) missing = name;
  };
  resolve(api->init, "nvmlInit_v2");
  resolve(api->shutdown, "nvmlShutdown");
  resolve(api->device_count, "nvmlDeviceGetCount_v2");
  resolve(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  resolve(api->total_energy, "nvmlDeviceGetTotalEnergyConsumption");
  resolve(api->power_usage, "nvmlDeviceGetPowerUsage");
  resolve(api->name, "nvmlDeviceGetName");
  resolve(api->error_string, "nvmlErrorString");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has no ", missing,
                     ": the NVIDIA driver is too old for energy accounting; update it"));
  }
  if (nvmlReturn_t rc = api->init(); rc != NVML_SUCCESS) {
    return Error(*api, rc, "nvmlInit_v2");
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(path), handle.release(), std::move(api)));
}

Nvml::Nvml(std::string library, void* handle, std::unique_ptr<Api> api)
    : library_(std::move(library)), handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(handle_);
}

absl::StatusOr<int> Nvml::DeviceCount() const {
  unsigned int count = 0;
  if (nvmlReturn_t rc = api_->device_count(&count); rc != NVML_SUCCESS) {
    return Error(*api_, rc, "nvmlDeviceGetCount_v2");
  }
  return static_cast<int>(count);
}

absl::StatusOr<void*> Nvml::Device(int device) const {
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPU index ", device, " is negative"));
  }
  nvmlDevice_t handle = nullptr;
  nvmlReturn_t rc = api_->handle_by_index(static_cast<unsigned int>(device), &handle);
  if (rc == NVML_ERROR_INVALID_ARGUMENT) {
    absl::StatusOr<int> count = DeviceCount();
    return absl::InvalidArgumentError(absl::StrCat(
        "nvmlDeviceGetHandleByIndex_v2: no GPU ", device, " on this host (NVML sees ",
        count.ok() ? absl::StrCat(*count) : std::string("an unknown number of"), " GPUs)"));
  }
  if (rc != NVML_SUCCESS) return Error(*api_, rc, "nvmlDeviceGetHandleByIndex_v2", device);
  return static_cast<void*>(handle);
}

absl::StatusOr<uint64_t> Nvml::TotalEnergyMillijoules(int device) const {
  absl::StatusOr<void*> handle = Device(device);
  if (!handle.ok()) return handle.status();
  unsigned long long millijoules = 0;
  nvmlReturn_t rc = api_->total_energy(static_cast<nvmlDevice_t>(*handle), &millijoules);
  if (rc != NVML_SUCCESS) {
    return Error(*api_, rc, "nvmlDeviceGetTotalEnergyConsumption", device);
  }
  return static_cast<uint64_t>(millijoules);
}

absl::StatusOr<std::string> Nvml::DeviceName(int device) const {
  absl::StatusOr<void*> handle = Device(device);
  if (!handle.ok()) return handle.status();
  char name[96] = {0};  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
  nvmlReturn_t rc = api_->name(static_cast<nvmlDevice_t>(*handle), name, sizeof(name));
  if (rc != NVML_SUCCESS) return Error(*api_, rc, "nvmlDeviceGetName", device);
  name[sizeof(name) - 1] = '\0';
  return std::string(name);
}

absl::StatusOr<uint32_t> Nvml::PowerMilliwatts(int device) const {
  absl::StatusOr<void*> handle = Device(device);
  if (!handle.ok()) return handle.status();
  unsigned int milliwatts = 0;
  nvmlReturn_t rc = api_->power_usage(static_cast<nvmlDevice_t>(*handle), &milliwatts);
  if (rc != NVML_SUCCESS) return Error(*api_, rc, "nvmlDeviceGetPowerUsage", device);
  return static_cast<uint32_t>(milliwatts);
}

}  // namespace loom::telemetry
