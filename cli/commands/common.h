// What several loomctl commands share: the global flags (Globals), the
// controller client, the exit-code helpers and the table/JSON printers.
//
// Exit codes, for every command: 0 success; Fail() prints a one-line reason
// on stderr and returns 1; Usage() prints the usage hint and returns 2.
// Output goes to std::cout, diagnostics to std::cerr. Nothing here is
// thread-safe: loomctl runs one command on its main thread.
#ifndef LOOM_CLI_COMMANDS_COMMON_H_
#define LOOM_CLI_COMMANDS_COMMON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "loom/v1/service.grpc.pb.h"

namespace loom::cli {

// The global flags, parsed once by main() (cli/loomctl_main.cc) and read by
// every command.
struct Globals {
  std::string home;
  std::string controller;
  std::string token_file;
  bool plaintext = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  bool json = false;
};

// Failure with a one-line reason and exit code 1.
int Fail(const absl::Status& s);
// A usage error: the message and a pointer to the help; exit code 2.
int Usage(const std::string& msg);

// The directory of the running loomctl binary ("." when unknown); the
// daemons and loom-ckpt are built beside it.
std::string SelfDir();

// `m` as indented JSON with the proto field names (the -o json output).
std::string ToJson(const google::protobuf::Message& m);
// The same on one line (a stream of events, one a line).
std::string ToJsonLine(const google::protobuf::Message& m);

// "-" for JOB_STATE_UNSPECIFIED, else the enum name.
std::string StateName(loom::v1::JobState s);
std::string KindName(loom::v1::RecoveryEvent::Kind k);

// How long ago `unix_ms` was, as "42s", "7m" or "3h"; "-" when unset (<= 0).
std::string Ago(int64_t unix_ms);

// Prints rows as aligned columns (two spaces apart) to std::cout.
void PrintTable(const std::vector<std::vector<std::string>>& rows);

// A connection to the controller's JobService, with the caller's token.
class Client {
 public:
  // The addresses are --controller (several, comma-separated, for
  // controllers sharing one database), or the local cluster's under --home;
  // the token --token-file, or <home>/token unless a client certificate
  // alone proves who the caller is. TLS unless --plaintext, trusting
  // --tls-ca or <home>/tls/ca.pem when present. UNAVAILABLE when no address
  // is known. With several, it finds the one that leads first (one cheap
  // call to each at most), and Call follows a change of leader.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const Globals& g);

  // A fresh context carrying the token; no deadline when `timeout` is
  // infinite.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10));

  // One unary call with a fresh context (token, 10 s deadline). With
  // several controllers, an UNAVAILABLE answer (a standby, or a leader
  // gone) sends it again to the leader the answer named, or to the next
  // controller, for up to kFollowBudget while a failover completes.
  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (loom::v1::JobService::Stub::*method)(grpc::ClientContext*,
                                                                       const Request&, Response*),
                    const Request& request, Response* response) {
    const absl::Time give_up = absl::Now() + kFollowBudget;
    for (int attempt = 0;; ++attempt) {
      auto ctx = Context();
      grpc::Status s = ((*stub).*method)(ctx.get(), request, response);
      // One controller: only a standby's answer (it is about to lead) is
      // worth waiting out; a controller that is down fails at once.
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
          (stubs.size() < 2 && !FromStandby(s)) || absl::Now() >= give_up) {
        return Check(s);
      }
      Follow(*ctx, attempt);
    }
  }

  // `s` as an absl::Status; UNAVAILABLE names the controller's address.
  absl::Status Check(const grpc::Status& s);
  // An answer of a controller that does not lead (yet, or any more).
  static bool FromStandby(const grpc::Status& s);
  // After an UNAVAILABLE answer to `ctx`: points stub/address at the leader
  // it named, else at the next controller (pausing a moment after each
  // round, while no controller leads yet).
  void Follow(const grpc::ClientContext& ctx, int attempt);

  static constexpr absl::Duration kFollowBudget = absl::Seconds(10);

  std::string address;  // the controller calls go to now
  std::string token;
  loom::v1::JobService::Stub* stub = nullptr;  // stubs[current]
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<loom::v1::JobService::Stub>> stubs;
  size_t current = 0;
};

// Connects and reads one job.
absl::StatusOr<loom::v1::Job> FetchJob(const Globals& g, const std::string& job_id);

}  // namespace loom::cli

#endif  // LOOM_CLI_COMMANDS_COMMON_H_
