#include "controller/service/rpc_admission.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace loom::controller {

absl::Status RequireId(const std::string& id, const char* field) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  if (id.size() > 256) return absl::InvalidArgumentError(absl::StrCat(field, ": too long"));
  return absl::OkStatus();
}

namespace {
// When the RPC being handled on this thread started (RpcMetrics::Start).
absl::Time& RpcStartTime() {
  thread_local absl::Time start = absl::InfinitePast();
  return start;
}
}  // namespace

RpcMetrics::RpcMetrics(metrics::Registry& registry)
    : rpcs_(metrics::BuildCounter()
                .Name("loom_controller_rpcs_total")
                .Help("RPCs handled by the controller, by method and status code.")
                .Register(registry)),
      duration_(metrics::BuildHistogram()
                    .Name("loom_controller_rpc_duration_seconds")
                    .Help("Time to handle a unary RPC, by method (streams excluded).")
                    .Register(registry)) {}

void RpcMetrics::Start() { RpcStartTime() = absl::Now(); }

void RpcMetrics::Record(const std::string& method, const grpc::Status& status) {
  RecordSince(method, status, RpcStartTime());
  RpcStartTime() = absl::InfinitePast();
}

void RpcMetrics::RecordSince(const std::string& method, const grpc::Status& status,
                             absl::Time start) {
  static const char* kCodes[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  int code = status.error_code();
  if (code < 0 || code > 16) code = 2;  // UNKNOWN
  // The series are looked up once per (method, code): building label sets
  // and a histogram's buckets on every RPC was a tenth of the controller's
  // time under load.
  metrics::Counter* counter = nullptr;
  metrics::Histogram* histogram = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& c = counters_[{method, code}];
    if (c == nullptr) c = &rpcs_.Add({{"method", method}, {"code", kCodes[code]}});
    counter = c;
    if (method != "WatchJob" && method != "WatchEvents") {  // streams: no duration
      auto& h = histograms_[method];
      if (h == nullptr) {
        h = &duration_.Add({{"method", method}}, metrics::ExponentialBuckets(0.0001, 4, 10));
      }
      histogram = h;
    }
  }
  counter->Increment();
  if (histogram != nullptr && start != absl::InfinitePast()) {
    histogram->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
}

absl::StatusOr<Principal> AdmitCaller(const grpc::ServerContextBase& ctx,
                                      const AccessControl& access, absl::string_view method,
                                      const SessionDirectory* sessions) {
  std::string certificate_name;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    // Set only for a client certificate the handshake verified against the
    // cluster CA (--tls_client_ca).
    for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
      certificate_name.assign(cn.data(), cn.size());
    }
  }
  std::string bearer;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&value, "Bearer ") || value.empty()) {
      return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
    }
    bearer = std::string(value);
  }
  absl::StatusOr<Principal> caller;
  if (auto it = md.find(kSessionMetadataKey);
      sessions != nullptr && bearer.empty() && certificate_name.empty() && it != md.end()) {
    // A console page's session: the user of the token it was opened with,
    // if that token is still theirs.
    absl::StatusOr<std::string> token_hash =
        sessions->TokenHashOf(absl::string_view(it->second.data(), it->second.size()));
    if (!token_hash.ok()) return token_hash.status();
    caller = access.AuthenticateTokenHash(*token_hash);
    if (caller.ok()) caller->session = true;
  } else {
    caller = access.Authenticate(bearer, certificate_name);
  }
  if (!caller.ok()) return caller.status();
  if (absl::Status allowed = Authorize(*caller, method); !allowed.ok()) return allowed;
  return caller;
}

absl::Status AdmitLeader(grpc::ServerContextBase* ctx, const Leadership* leadership) {
  if (leadership == nullptr) return absl::OkStatus();
  std::string leader_address;
  absl::Status s = leadership->Admit(&leader_address);
  if (!s.ok() && !leader_address.empty()) {
    ctx->AddTrailingMetadata(kLeaderMetadataKey, leader_address);
  }
  return s;
}

}  // namespace loom::controller
