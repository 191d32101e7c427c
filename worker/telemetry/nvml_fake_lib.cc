// A stand-in for libnvidia-ml.so.1, built as a shared library for tests
// only: it exports the NVML entry points Loom resolves with dlsym, with
// deterministic behaviour, so nvml_test and telemetry_test run the real
// dlopen path on hosts without a GPU.
//
//   nvmlDeviceGetCount_v2               $LOOM_FAKE_NVML_DEVICES GPUs (default 2)
//   nvmlDeviceGetTotalEnergyConsumption device i starts at (i+1)·1e6 mJ and
//                                       grows by kEnergyStepMj per call
//   nvmlDeviceGetPowerUsage             250000 + 1000·i mW
//   nvmlDeviceGetName                   "NVIDIA H200" (device 0), else
//                                       "NVIDIA A100-SXM4-80GB"
// Each entry point returns the NVML code in its environment variable when
// that is set: LOOM_FAKE_NVML_INIT_RC, LOOM_FAKE_NVML_ENERGY_RC,
// LOOM_FAKE_NVML_POWER_RC (e.g. 3 = NVML_ERROR_NOT_SUPPORTED, 9 =
// NVML_ERROR_DRIVER_NOT_LOADED). Read at every call, so a test can change
// them between calls. Not thread-safe; tests call it from one thread.
#include <cstdlib>

namespace {

constexpr unsigned long long kEnergyStepMj = 7500;  // 7.5 J per reading
constexpr int kMaxDevices = 8;

struct FakeDevice {
  unsigned long long energy_mj = 0;
};
FakeDevice g_devices[kMaxDevices];
bool g_started = false;
int g_live_inits = 0;

int EnvRc(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : 0;
}

int DeviceCount() {
  const char* v = std::getenv("LOOM_FAKE_NVML_DEVICES");
  int n = v != nullptr && *v != '\0' ? std::atoi(v) : 2;
  return n < 0 ? 0 : (n > kMaxDevices ? kMaxDevices : n);
}

FakeDevice* FromHandle(void* handle) {
  auto* d = static_cast<FakeDevice*>(handle);
  return d >= g_devices && d < g_devices + kMaxDevices ? d : nullptr;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  if (int rc = EnvRc("LOOM_FAKE_NVML_INIT_RC"); rc != 0) return rc;
  if (!g_started) {
    for (int i = 0; i < kMaxDevices; ++i) g_devices[i].energy_mj = (i + 1) * 1000000ull;
    g_started = true;
  }
  ++g_live_inits;
  return 0;
}

int nvmlShutdown() {
  if (g_live_inits == 0) return 1;  // NVML_ERROR_UNINITIALIZED
  --g_live_inits;
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (g_live_inits == 0) return 1;
  if (count == nullptr) return 2;
  *count = static_cast<unsigned int>(DeviceCount());
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (g_live_inits == 0) return 1;
  if (device == nullptr || index >= static_cast<unsigned int>(DeviceCount())) return 2;
  *device = &g_devices[index];
  return 0;
}

int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* energy) {
  if (g_live_inits == 0) return 1;
  FakeDevice* d = FromHandle(device);
  if (d == nullptr || energy == nullptr) return 2;
  if (int rc = EnvRc("LOOM_FAKE_NVML_ENERGY_RC"); rc != 0) return rc;
  d->energy_mj += kEnergyStepMj;
  *energy = d->energy_mj;
  return 0;
}

int nvmlDeviceGetPowerUsage(void* device, unsigned int* power) {
  if (g_live_inits == 0) return 1;
  FakeDevice* d = FromHandle(device);
  if (d == nullptr || power == nullptr) return 2;
  if (int rc = EnvRc("LOOM_FAKE_NVML_POWER_RC"); rc != 0) return rc;
  *power = 250000u + 1000u * static_cast<unsigned int>(d - g_devices);
  return 0;
}

// Device 0 is an H200, the others A100s (names as NVML reports them).
int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  if (g_live_inits == 0) return 1;
  FakeDevice* d = FromHandle(device);
  if (d == nullptr || name == nullptr || length == 0) return 2;
  const char* text = d == g_devices ? "NVIDIA H200" : "NVIDIA A100-SXM4-80GB";
  unsigned int i = 0;
  for (; text[i] != '\0' && i + 1 < length; ++i) name[i] = text[i];
  name[i] = '\0';
  return 0;
}

const char* nvmlErrorString(int rc) {
  switch (rc) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    default: return "Unknown Error";
  }
}

// Test hook, not part of NVML: nvmlInit_v2 calls not yet matched by
// nvmlShutdown.
int loom_fake_nvml_live_inits() { return g_live_inits; }

}  // extern "C"
