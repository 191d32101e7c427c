// CPU lists in the kernel's notation ("0-3,8,10-11", as taskset -c and
// cpuset.cpus write them) and pinning the calling thread to one: how a
// daemon states which of the host's CPUs a piece of background work may use.
#ifndef LOOM_COMMON_CPU_LIST_H_
#define LOOM_COMMON_CPU_LIST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// The CPUs `list` names, ascending and without repeats. INVALID_ARGUMENT,
// quoting the bad item, for anything but comma-separated numbers and
// ascending ranges, or an empty list.
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list);

// `cpus` (ascending) in the same notation, ranges joined: "0-3,8".
std::string FormatCpuList(const std::vector<int>& cpus);

// The CPUs this process may run on now (sched_getaffinity).
std::vector<int> AllowedCpus();

// Pins the calling thread to `cpus`; threads it starts afterwards inherit
// the set. FAILED_PRECONDITION naming the CPUs when the kernel refuses
// (e.g. none of them is allowed to this process).
absl::Status PinThisThread(const std::vector<int>& cpus);

}  // namespace loom

#endif  // LOOM_COMMON_CPU_LIST_H_
