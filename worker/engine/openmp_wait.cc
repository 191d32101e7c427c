#include "worker/engine/openmp_wait.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

constexpr char kSetByLoom[] = "LOOM_OPENMP_WAIT_SET";

}  // namespace

bool OpenMpWaitPolicyChosen() {
  return std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr;
}

std::string OpenMpWaitPolicyDescription() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (policy == nullptr && spin == nullptr) {
    return "the OpenMP runtime's default (threads spin before they sleep)";
  }
  std::string out;
  if (policy != nullptr) out = absl::StrCat("OMP_WAIT_POLICY=", policy);
  if (spin != nullptr) absl::StrAppend(&out, out.empty() ? "" : " ", "GOMP_SPINCOUNT=", spin);
  const char* set = std::getenv(kSetByLoom);
  absl::StrAppend(&out, set != nullptr && std::strcmp(set, "1") == 0 ? " (set by Loom)"
                                                                       : " (from the environment)");
  return out;
}

absl::Status ReexecWithShortOpenMpSpin(char** argv) {
  if (OpenMpWaitPolicyChosen()) return absl::OkStatus();
  if (argv == nullptr || argv[0] == nullptr) {
    return absl::InvalidArgumentError("ReexecWithShortOpenMpSpin: no argv");
  }
  const std::string spin = std::to_string(kTrainingSpinCount);
  // Both set before exec, so the new image never comes back here.
  if (setenv("GOMP_SPINCOUNT", spin.c_str(), 1) != 0 || setenv(kSetByLoom, "1", 1) != 0) {
    return absl::InternalError(
        absl::StrCat("ReexecWithShortOpenMpSpin: setenv: ", std::strerror(errno)));
  }
  execv("/proc/self/exe", argv);
  const int err = errno;
  // Still the old image, whose OpenMP runtime has read the old policy: say
  // so truthfully in OpenMpWaitPolicyDescription.
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kSetByLoom);
  return absl::InternalError(absl::StrCat("cannot re-execute /proc/self/exe with GOMP_SPINCOUNT=",
                                          spin, " (", std::strerror(err),
                                          "); OpenMP threads keep the runtime's default spinning"));
}

}  // namespace loom::engine
