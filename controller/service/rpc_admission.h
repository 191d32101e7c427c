// What every controller RPC does before its handler's work: who the caller
// is and whether its role may call the method (AdmitCaller), whether this
// controller leads (AdmitLeader), and the RPC counters (RpcMetrics).
#ifndef LOOM_CONTROLLER_SERVICE_RPC_ADMISSION_H_
#define LOOM_CONTROLLER_SERVICE_RPC_ADMISSION_H_

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "controller/leader/leader_lease.h"
#include "controller/service/access.h"
#include "grpcpp/grpcpp.h"

namespace loom::controller {

// Counts RPCs by method and status code. Thread-safe.
class RpcMetrics {
 public:
  explicit RpcMetrics(metrics::Registry& registry);
  // Marks the start of an RPC on this thread (handlers run synchronously on
  // one thread each); Record() observes the time since then.
  static void Start();
  // Counts the RPC by method and status code and, except for streams
  // (WatchJob), observes its duration since Start() on this thread.
  void Record(const std::string& method, const grpc::Status& status);
  // The same for an RPC answered on another thread than the one that began
  // it: its duration is the time since `start`.
  void RecordSince(const std::string& method, const grpc::Status& status, absl::Time start);

 private:
  metrics::Family<metrics::Counter>& rpcs_;
  metrics::Family<metrics::Histogram>& duration_;
  std::mutex mu_;
  std::map<std::pair<std::string, int>, metrics::Counter*> counters_;  // guarded by mu_
  std::map<std::string, metrics::Histogram*> histograms_;              // guarded by mu_
};

// OK when `leadership` is null or this controller leads now; otherwise
// UNAVAILABLE naming the leader, whose address goes into `ctx`'s trailing
// metadata (kLeaderMetadataKey) for clients that follow it.
absl::Status AdmitLeader(grpc::ServerContextBase* ctx, const Leadership* leadership);

// The caller of `ctx`: its verified client certificate's common name, else
// its bearer token, else (with `sessions`) its console session, through
// `access`; then authorized for `method` ("JobService.GetJob").
// UNAUTHENTICATED / PERMISSION_DENIED otherwise.
absl::StatusOr<Principal> AdmitCaller(const grpc::ServerContextBase& ctx,
                                      const AccessControl& access, absl::string_view method,
                                      const SessionDirectory* sessions = nullptr);

// OK for an id of 1 to 256 bytes; INVALID_ARGUMENT naming `field` else.
absl::Status RequireId(const std::string& id, const char* field);

}  // namespace loom::controller

// Inside a service's handler: declares `caller`, the authenticated and
// authorized Principal, or answers the RPC with why not (through the
// service's Finish). The service has members access_, sessions_ and
// leadership_, and the handler's context is `ctx`.
#define LOOM_ADMIT(service, method)                                                              \
  RpcMetrics::Start();                                                                           \
  absl::StatusOr<Principal> caller = AdmitCaller(*ctx, *access_, service "." method, sessions_); \
  if (!caller.ok()) return Finish(method, caller.status());                                      \
  if (absl::Status led = AdmitLeader(ctx, leadership_); !led.ok()) return Finish(method, led)

#endif  // LOOM_CONTROLLER_SERVICE_RPC_ADMISSION_H_
