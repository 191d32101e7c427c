// A CPU-quota cgroup a test creates, to make a real process slow: the
// processes moved into it share at most `fraction` of one CPU (cgroup v2's
// cpu.max, or v1's cpu.cfs_quota_us under /sys/fs/cgroup/cpu). Needs root.
// Destroying it moves what is left in it back to the root group and removes
// it.
#ifndef LOOM_TESTS_CPU_QUOTA_H_
#define LOOM_TESTS_CPU_QUOTA_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::testing {

class CpuQuotaGroup {
 public:
  // `name` is unique to the test (the pid is appended). `period_us` is the
  // scheduler's accounting period: a short one (10 ms) spreads the
  // throttling evenly over steps of a few tens of milliseconds.
  static absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> Create(const std::string& name,
                                                               double fraction,
                                                               int period_us = 10000);
  ~CpuQuotaGroup();
  CpuQuotaGroup(const CpuQuotaGroup&) = delete;
  CpuQuotaGroup& operator=(const CpuQuotaGroup&) = delete;

  // Moves process `pid` (every thread of it) into the group; children it
  // starts later are born there.
  absl::Status Add(int pid);
  // The group's folder.
  const std::string& path() const { return path_; }

 private:
  CpuQuotaGroup(std::string path, std::string root)
      : path_(std::move(path)), root_(std::move(root)) {}
  std::string path_;  // the group's folder
  std::string root_;  // the hierarchy's root, where processes go back to
};

// Pids of the processes whose parent is `pid`.
std::vector<int> ChildPids(int pid);

}  // namespace loom::testing

#endif  // LOOM_TESTS_CPU_QUOTA_H_
