#include "tests/cpu_quota.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace loom::testing {
namespace {

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("could not write \"", text, "\" to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> CpuQuotaGroup::Create(const std::string& name,
                                                                     double fraction,
                                                                     int period_us) {
  const int quota_us = std::max(1000, static_cast<int>(fraction * period_us));
  const std::string leaf = absl::StrCat(name, "-", getpid());
  if (Exists("/sys/fs/cgroup/cgroup.controllers")) {
    // cgroup v2: the cpu controller must be enabled for the root's children.
    const std::string root = "/sys/fs/cgroup";
    std::ifstream in(root + "/cgroup.subtree_control");
    bool cpu = false;
    for (std::string controller; in >> controller;) cpu |= controller == "cpu";
    if (!cpu) {
      if (absl::Status s = WriteText(root + "/cgroup.subtree_control", "+cpu"); !s.ok()) return s;
    }
    const std::string path = absl::StrCat(root, "/", leaf);
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(absl::StrCat("mkdir ", path, ": ", std::strerror(errno)));
    }
    std::unique_ptr<CpuQuotaGroup> group(new CpuQuotaGroup(path, root));
    if (absl::Status s = WriteText(path + "/cpu.max", absl::StrCat(quota_us, " ", period_us));
        !s.ok()) {
      return s;
    }
    return group;
  }
  const std::string root = "/sys/fs/cgroup/cpu";
  if (!Exists(root + "/cpu.cfs_quota_us")) {
    return absl::FailedPreconditionError(
        "no cgroup cpu controller: neither /sys/fs/cgroup/cgroup.controllers (v2) nor "
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us (v1)");
  }
  const std::string path = absl::StrCat(root, "/", leaf);
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat("mkdir ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<CpuQuotaGroup> group(new CpuQuotaGroup(path, root));
  if (absl::Status s = WriteText(path + "/cpu.cfs_period_us", absl::StrCat(period_us)); !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteText(path + "/cpu.cfs_quota_us", absl::StrCat(quota_us)); !s.ok()) {
    return s;
  }
  return group;
}

absl::Status CpuQuotaGroup::Add(int pid) {
  return WriteText(path_ + "/cgroup.procs", absl::StrCat(pid));
}

CpuQuotaGroup::~CpuQuotaGroup() {
  // Whatever still runs in it goes back to the root group; then it can go.
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::ifstream in(path_ + "/cgroup.procs");
    std::vector<int> pids;
    for (int pid; in >> pid;) pids.push_back(pid);
    if (pids.empty()) break;
    for (int pid : pids) (void)WriteText(root_ + "/cgroup.procs", absl::StrCat(pid));
    usleep(20000);
  }
  rmdir(path_.c_str());
}

std::vector<int> ChildPids(int pid) {
  std::vector<int> children;
  DIR* d = opendir("/proc");
  if (d == nullptr) return children;
  while (dirent* e = readdir(d)) {
    const int child = std::atoi(e->d_name);
    if (child <= 0) continue;
    std::ifstream in(absl::StrCat("/proc/", child, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // "pid (comm) state ppid ...": comm may hold spaces, so read after the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid) children.push_back(child);
  }
  closedir(d);
  return children;
}

}  // namespace loom::testing
