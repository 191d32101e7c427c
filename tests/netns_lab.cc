#include "tests/netns_lab.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace loom::testing {

absl::Status NetnsLab::Run(const std::string& command) {
  CommandResult r = RunCommand(command);
  if (r.exit_code == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "`", command, "` exited ", r.exit_code, ": ", r.err, r.out,
      geteuid() != 0 ? " (network namespaces need root: run the fault tests as root, as CI does)"
                     : ""));
}

absl::StatusOr<std::unique_ptr<NetnsLab>> NetnsLab::Create(int members, const std::string& tag) {
  std::unique_ptr<NetnsLab> lab(new NetnsLab());
  const std::string base = absl::StrCat("loom-", tag, "-", ::getpid());
  lab->hub_ = base + "-hub";
  // Leftovers of a crashed run with this pid.
  RunCommand(absl::StrCat("ip netns del ", lab->hub_, " 2>/dev/null"));
  for (int i = 0; i < members; ++i) {
    RunCommand(absl::StrCat("ip netns del ", base, "-", i, " 2>/dev/null"));
  }
  absl::Status s = lab->Run(absl::StrCat("ip netns add ", lab->hub_));
  if (!s.ok()) return s;
  const std::string hub = absl::StrCat("ip -n ", lab->hub_, " ");
  for (const std::string& step :
       {hub + "link set lo up", hub + "link add br0 type bridge", hub + "link set br0 up"}) {
    if (s = lab->Run(step); !s.ok()) return s;
  }
  for (int i = 0; i < members; ++i) {
    const std::string name = absl::StrCat(base, "-", i);
    if (s = lab->Run("ip netns add " + name); !s.ok()) return s;
    lab->names_.push_back(name);
    const std::string in = absl::StrCat("ip -n ", name, " ");
    for (const std::string& step : {
             absl::StrCat(hub, "link add v", i, " type veth peer name eth0 netns ", name),
             absl::StrCat(hub, "link set v", i, " master br0"),
             absl::StrCat(hub, "link set v", i, " up"),
             in + "link set lo up",
             absl::StrCat(in, "addr add ", lab->address(i), "/24 dev eth0"),
             in + "link set eth0 up",
         }) {
      if (s = lab->Run(step); !s.ok()) return s;
    }
  }
  return lab;
}

NetnsLab::~NetnsLab() {
  // Processes still inside keep a namespace alive but lose its name; the
  // veths go with their namespaces.
  for (const std::string& name : names_) RunCommand("ip netns del " + name);
  if (!hub_.empty()) RunCommand("ip netns del " + hub_);
}

std::string NetnsLab::address(int i) const { return absl::StrCat("10.77.0.", i + 1); }

std::vector<std::string> NetnsLab::prefix(int i) const {
  return {"ip", "netns", "exec", names_[i]};
}

std::string NetnsLab::shell_prefix(int i) const {
  return absl::StrCat("ip netns exec ", names_[i], " ");
}

absl::Status NetnsLab::Cut(int i, int j) {
  if (std::find(cuts_.begin(), cuts_.end(), std::make_pair(i, j)) != cuts_.end()) {
    return absl::OkStatus();
  }
  const std::string ipt = shell_prefix(i) + "iptables -w ";
  absl::Status s = Run(absl::StrCat(ipt, "-A INPUT -s ", address(j), " -j DROP"));
  if (s.ok()) s = Run(absl::StrCat(ipt, "-A OUTPUT -d ", address(j), " -j DROP"));
  if (s.ok()) cuts_.emplace_back(i, j);
  return s;
}

absl::Status NetnsLab::Heal(int i, int j) {
  auto it = std::find(cuts_.begin(), cuts_.end(), std::make_pair(i, j));
  if (it == cuts_.end()) return absl::OkStatus();
  const std::string ipt = shell_prefix(i) + "iptables -w ";
  absl::Status s = Run(absl::StrCat(ipt, "-D INPUT -s ", address(j), " -j DROP"));
  if (s.ok()) s = Run(absl::StrCat(ipt, "-D OUTPUT -d ", address(j), " -j DROP"));
  if (s.ok()) cuts_.erase(it);
  return s;
}

absl::Status NetnsLab::Throttle(int i, int64_t kbit_per_second) {
  // Bucket and queue: an eighth of a second's bytes (at least a few
  // full-size packets) may pass at once; a second's worth may wait.
  const int64_t bytes_per_second = kbit_per_second * 1000 / 8;
  return Run(absl::StrCat("ip netns exec ", names_[i], " tc qdisc replace dev eth0 root tbf rate ",
                          kbit_per_second, "kbit burst ",
                          std::max<int64_t>(bytes_per_second / 8, 8192), " limit ",
                          std::max<int64_t>(bytes_per_second, 16384)));
}

absl::Status NetnsLab::Unthrottle(int i) {
  return Run(absl::StrCat("ip netns exec ", names_[i], " tc qdisc del dev eth0 root"));
}

absl::StatusOr<std::unique_ptr<NetnsLab::Inside>> NetnsLab::Enter(int i) const {
  const int previous = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (previous < 0) return absl::InternalError(absl::StrCat("open own netns: ", strerror(errno)));
  const std::string path = "/var/run/netns/" + names_[i];
  const int target = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (target < 0 || setns(target, CLONE_NEWNET) != 0) {
    const int err = errno;
    if (target >= 0) close(target);
    close(previous);
    return absl::FailedPreconditionError(
        absl::StrCat("enter network namespace ", names_[i], ": ", strerror(err)));
  }
  close(target);
  return std::unique_ptr<Inside>(new Inside(previous));
}

NetnsLab::Inside::~Inside() {
  setns(previous_, CLONE_NEWNET);
  close(previous_);
}

}  // namespace loom::testing
