// The controllers a worker reports to: one, or an active/standby set sharing
// one database, and which of them it talks to now.
//
// Every call goes to Current(). After it, After() looks at the answer: an
// unreachable controller (UNAVAILABLE, DEADLINE_EXCEEDED) sends the next
// call to the leader the answer named (a standby's trailing metadata
// "loom-leader", when that address is one of ours), else to the next
// address in turn. Accept() fences decisions: an answer from an older
// leader epoch than the newest this worker has seen is refused (its
// commands are not run) and the link moves on, so a controller that lost
// its lease while paused or cut off cannot start, stop or move a rank once
// a newer leader has spoken. The fence holds for as long as the newest
// epoch keeps answering: after kEpochMemory without an answer from it, an
// older epoch is taken again (a controller whose database was replaced
// starts over at epoch 1; a stale leader steps down long before that).
// Thread-safe.
#ifndef LOOM_WORKER_CONTROLLER_LINK_H_
#define LOOM_WORKER_CONTROLLER_LINK_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/v1/service.grpc.pb.h"

namespace loom::worker {

class ControllerLink {
 public:
  using Stub = loom::v1::WorkerService::StubInterface;
  static constexpr std::chrono::seconds kEpochMemory{60};
  // `stubs[i]` reaches `addresses[i]`; at least one of each, as many of each.
  ControllerLink(std::vector<std::string> addresses, std::vector<std::shared_ptr<Stub>> stubs);
  // One controller.
  explicit ControllerLink(std::shared_ptr<Stub> stub);

  struct Target {
    Stub* stub;
    int index;
  };
  Target Current();
  // After a call made through `used` ended with `status` (`ctx`: its
  // context, for the trailing metadata).
  void After(const Target& used, const grpc::Status& status, const grpc::ClientContext& ctx);
  // True when an answer from `used` under `epoch` may be acted on (and then
  // records it as the newest seen, if it is); false when it is older.
  bool Accept(const Target& used, int64_t epoch);
  int64_t newest_epoch();
  std::string address(int index) const { return addresses_[index]; }
  size_t size() const { return addresses_.size(); }

 private:
  void MoveOnLocked(int from, const std::string& hint);

  const std::vector<std::string> addresses_;
  const std::vector<std::shared_ptr<Stub>> stubs_;
  std::mutex mu_;
  int current_ = 0;                                       // guarded by mu_
  int64_t newest_epoch_ = 0;                              // guarded by mu_
  std::chrono::steady_clock::time_point newest_heard_{};  // guarded by mu_
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_CONTROLLER_LINK_H_
