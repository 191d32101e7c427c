#include "worker/blas_info.h"

#include <dlfcn.h>
#include <link.h>
#include <limits.h>
#include <stdlib.h>

namespace loom::worker {

BlasInfo DetectBlas() {
  BlasInfo info;
  void* handle = dlopen("libblas.so.3", RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) {
    info.vendor = "unknown";
    return info;
  }
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name) {
    char resolved[PATH_MAX];
    info.path = realpath(map->l_name, resolved) ? resolved : map->l_name;
  }
  dlclose(handle);
  const std::string& p = info.path;
  if (p.find("openblas") != std::string::npos) {
    info.vendor = "openblas";
  } else if (p.find("blis") != std::string::npos) {
    info.vendor = "blis";
  } else if (p.find("mkl") != std::string::npos) {
    info.vendor = "mkl";
  } else if (p.find("atlas") != std::string::npos) {
    info.vendor = "atlas";
  } else if (p.find("/blas/") != std::string::npos) {
    info.vendor = "reference";  // Debian's netlib BLAS lives in .../blas/
  } else {
    info.vendor = "unknown";
  }
  info.optimized = info.vendor == "openblas" || info.vendor == "blis" || info.vendor == "mkl";
  return info;
}

int SetBlasThreads(int threads) {
  if (threads < 1) threads = 1;
  // RTLD_DEFAULT: the definition the process's own calls resolve to (the
  // BLAS LibTorch was linked against), not another copy dlopen could find.
  using SetFn = void (*)(int);
  using GetFn = int (*)();
  if (auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
    auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    return get != nullptr ? get() : threads;
  }
  using BlisSetFn = void (*)(long);  // NOLINT(runtime/int): BLIS's dim_t
  using BlisGetFn = long (*)();      // NOLINT(runtime/int)
  if (auto set = reinterpret_cast<BlisSetFn>(dlsym(RTLD_DEFAULT, "bli_thread_set_num_threads"))) {
    set(threads);
    auto get = reinterpret_cast<BlisGetFn>(dlsym(RTLD_DEFAULT, "bli_thread_get_num_threads"));
    return get != nullptr ? static_cast<int>(get()) : threads;
  }
  return 0;
}

}  // namespace loom::worker
