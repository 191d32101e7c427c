// A small network of Linux network namespaces for fault tests and the chaos
// benchmark: a hub namespace holding a bridge, and N member
// namespaces, each with loopback up and one veth into the bridge, addressed
// 10.77.0.<i+1>/24. Nothing is created in the caller's namespace, so a test
// never touches the host's own network; every namespace is named after the
// creating process and removed by the destructor (and by Create, for ones a
// crashed run of the same pid left). Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)
// and iproute2 + iptables.
//
// A partition is iptables DROP in a member's namespace of everything to and
// from another member's address: TCP connections hang as they do on a real
// cut network (no reset), and Heal() deletes exactly those rules. A slow
// link is a token-bucket filter (tc's tbf) on a member's veth: what leaves
// that member goes at the rate given, and Unthrottle() removes it.
#ifndef LOOM_TESTS_NETNS_LAB_H_
#define LOOM_TESTS_NETNS_LAB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::testing {

class NetnsLab {
 public:
  // `tag` (a few letters) keeps two labs of one process apart.
  static absl::StatusOr<std::unique_ptr<NetnsLab>> Create(int members,
                                                           const std::string& tag = "lab");
  ~NetnsLab();
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int i) const { return names_[i]; }
  std::string address(int i) const;
  // {"ip", "netns", "exec", name(i)}: a command line prefix.
  std::vector<std::string> prefix(int i) const;
  // "ip netns exec <name(i)> ": a shell command prefix.
  std::string shell_prefix(int i) const;

  // Drops every packet between members `i` and `j` (in i's namespace, both
  // directions). Idempotent per pair.
  absl::Status Cut(int i, int j);
  // Removes Cut(i, j)'s rules.
  absl::Status Heal(int i, int j);

  // Everything member `i` sends goes at `kbit_per_second` at most (queued
  // up to a second's worth, then dropped as a congested link does).
  absl::Status Throttle(int i, int64_t kbit_per_second);
  absl::Status Unthrottle(int i);

  // While alive, the calling thread is in member `i`'s namespace, and so
  // is every thread it starts (they keep it); the destructor puts the
  // calling thread back where it was.
  class Inside {
   public:
    ~Inside();
    Inside(const Inside&) = delete;
    Inside& operator=(const Inside&) = delete;

   private:
    friend class NetnsLab;
    explicit Inside(int previous) : previous_(previous) {}
    int previous_;
  };
  absl::StatusOr<std::unique_ptr<Inside>> Enter(int i) const;

 private:
  NetnsLab() = default;
  absl::Status Run(const std::string& command);
  std::string hub_;
  std::vector<std::string> names_;
  std::vector<std::pair<int, int>> cuts_;
};

}  // namespace loom::testing

#endif  // LOOM_TESTS_NETNS_LAB_H_
