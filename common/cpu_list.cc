#include "common/cpu_list.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loom {

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list) {
  std::vector<int> cpus;
  if (list.empty()) return absl::InvalidArgumentError("an empty CPU list: write e.g. 2-3 or 0,4");
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    const std::vector<absl::string_view> ends = absl::StrSplit(item, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    const bool ok = absl::SimpleAtoi(ends[0], &first) && first >= 0 &&
                    (ends.size() == 1 ? (last = first, true)
                                      : absl::SimpleAtoi(ends[1], &last) && last >= first) &&
                    last < CPU_SETSIZE;
    // SimpleAtoi takes "+1" and " 1"; a CPU list has digits only.
    const bool digits = std::all_of(item.begin(), item.end(),
                                    [](char c) { return (c >= '0' && c <= '9') || c == '-'; });
    if (!ok || !digits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", item, "\" in CPU list \"", list,
          "\" is not a CPU or an ascending range of them (write e.g. 2-3 or 0,4, below ",
          CPU_SETSIZE, ")"));
    }
    for (int c = first; c <= last; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ",", cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

absl::Status PinThisThread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  // 0: the calling thread (sched_setaffinity acts on one thread).
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run on CPUs ", FormatCpuList(cpus), ": ", std::strerror(errno),
                     " (this process may use ", FormatCpuList(AllowedCpus()), ")"));
  }
  return absl::OkStatus();
}

}  // namespace loom
