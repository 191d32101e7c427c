// Who may call what on the controller: identities and roles.
// No gRPC here: controller_service.cc extracts the caller's bearer token
// and verified client-certificate name and asks this file.
//
// Identities. Workers and people never share a credential:
//   * a worker is either the holder of the cluster's worker token
//     (--worker_token_file; then it is not bound to a node), or presents a
//     client certificate from the cluster CA whose common name is
//     "worker:<node>" (then it may act only as the worker of that node);
//   * a person is a user of the users file (--users_file), proving it with
//     a bearer token whose SHA-256 the file holds, or with a client
//     certificate whose common name is "user:<name>". A certificate alone
//     does not make a user: the name must be in the file, so removing the
//     line revokes both the token and the certificate.
//
// The users file, one user per line ('#' starts a comment):
//     <name> <role> [sha256:<64 hex digits of SHA-256(token)>]
//   name  [A-Za-z0-9._@-]{1,64}
//   role  reader | user | admin
// Tokens are 256-bit random strings (`loomctl users add`), so a plain
// SHA-256 suffices: there is nothing to brute-force.
//
// Roles, checked per RPC (Authorize; the table is AccessRules()):
//   worker  WorkerService only
//   reader  JobService's read-only calls (GetJob, ListJobs, WatchJob,
//           WatchEvents, ListEvents, ListWorkers, GetStepMetrics, GetStepSeries,
//           ListCheckpoints, Plan, ListQueues, GetRankLog, SearchRankLogs,
//           WhoAmI, GetGoodput)
//   user    a reader that may also submit jobs, and cancel or roll back
//           the jobs it submitted (AuthorizeJobChange)
//   admin   every JobService call, on every job; only admins cordon,
//           uncordon and drain nodes
// A method missing from the table is denied to everyone.
#ifndef LOOM_CONTROLLER_SERVICE_ACCESS_H_
#define LOOM_CONTROLLER_SERVICE_ACCESS_H_

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::controller {

enum class Role { kWorker, kReader, kUser, kAdmin };

// "worker", "reader", "user", "admin".
const char* RoleName(Role role);
// A person's role: reader | user | admin.
absl::StatusOr<Role> ParseUserRole(absl::string_view text);

struct Principal {
  Role role = Role::kReader;
  // The user's name; the worker's node for a certificate worker; empty for
  // a holder of the shared worker token.
  std::string name;
  bool certificate = false;  // proven by a client certificate, not a token
  bool session = false;      // proven by a console session (opened with a token)

  // For messages and the job record: "user 'alice'", "worker 'node-3'",
  // "a worker (worker token)".
  std::string Describe() const;
};

// The method names of AccessRules, "<Service>.<Method>" as in the proto.
// Which roles may call each method.
const std::map<std::string, std::set<Role>>& AccessRules();

// OK if `who` may call `method` ("JobService.SubmitJob"); otherwise
// PERMISSION_DENIED saying who was refused what and which roles may.
absl::Status Authorize(const Principal& who, absl::string_view method);

// OK if `who` may cancel or roll back (`verb`) job `job_id` submitted by
// `submitted_by`: admins always, users their own jobs; PERMISSION_DENIED
// otherwise. A job without a recorded submitter (submitted before submitters were recorded)
// is changed by admins only.
absl::Status AuthorizeJobChange(const Principal& who, absl::string_view verb,
                                absl::string_view job_id, absl::string_view submitted_by);

// The credentials the controller accepts. Immutable; thread-safe.
class Credentials {
 public:
  // `users_text`: the users file's contents (`source` names it in errors);
  // `worker_token`: the worker token, or empty for none. INVALID_ARGUMENT
  // with "<source>:<line>: ..." for a line that does not parse, a repeated
  // name or a repeated token hash.
  static absl::StatusOr<Credentials> Parse(absl::string_view users_text, absl::string_view source,
                                           absl::string_view worker_token);

  // Who the caller is. `bearer`: the token of "authorization: Bearer <t>"
  // (empty if none); `certificate_name`: the common name of the client
  // certificate the TLS handshake verified against the cluster CA (empty if
  // none). A certificate wins over a token. UNAUTHENTICATED with a reason a
  // person can act on when neither identifies anyone.
  absl::StatusOr<Principal> Authenticate(absl::string_view bearer,
                                         absl::string_view certificate_name) const;

  // Who holds a console session opened with the token whose SHA-256 is
  // `token_sha256` (64 hex digits): that token's user with the user's role
  // now. UNAUTHENTICATED once no user has that token (the user was removed,
  // or given a new token: the session is revoked with it) or for the
  // workers' token (sessions are for people).
  absl::StatusOr<Principal> AuthenticateTokenHash(absl::string_view token_sha256) const;

  size_t users() const { return users_.size(); }
  bool has_worker_token() const { return !worker_token_sha256_.empty(); }

 private:
  struct User {
    std::string name;
    Role role;
    std::string token_sha256;  // raw 32 bytes; empty: certificate only
  };
  std::map<std::string, User> users_;                 // by name
  std::map<std::string, std::string> by_token_hash_;  // raw SHA-256 -> name
  std::string worker_token_sha256_;                   // raw 32 bytes, or empty
};

// Console sessions (controller/console/sessions.h). The console sends a
// logged-in page's session id as "x-loom-session" metadata; the session
// stands for the token it was opened with, checked again on every call.
inline constexpr char kSessionMetadataKey[] = "x-loom-session";
class SessionDirectory {
 public:
  virtual ~SessionDirectory() = default;
  // The hex SHA-256 of the token session `id` was opened with;
  // UNAUTHENTICATED (saying to log in again) when the session is unknown,
  // ended or expired.
  virtual absl::StatusOr<std::string> TokenHashOf(absl::string_view id) const = 0;
};

// The users file's line for a new user: "<name> <role> sha256:<hex>\n".
std::string UsersFileLine(absl::string_view name, Role role, absl::string_view token);

// Credentials loaded from files, reloaded when the users file changes (so a
// removed user loses access without a restart). Thread-safe.
class AccessControl {
 public:
  // Reads both files now; the error names the file. `users_file` may be
  // empty (no users: only certificate workers and the worker token).
  static absl::StatusOr<std::unique_ptr<AccessControl>> Load(std::string users_file,
                                                             std::string worker_token_file);

  absl::StatusOr<Principal> Authenticate(absl::string_view bearer,
                                         absl::string_view certificate_name) const;
  absl::StatusOr<Principal> AuthenticateTokenHash(absl::string_view token_sha256) const;

  // Re-reads the users file if its modification time or size changed. On a
  // parse error keeps the credentials in force and returns the error (the
  // caller logs it once per change).
  absl::Status ReloadIfChanged();

 private:
  AccessControl(std::string users_file, std::string worker_token) :
      users_file_(std::move(users_file)), worker_token_(std::move(worker_token)) {}

  const std::string users_file_;
  const std::string worker_token_;
  mutable std::mutex mu_;
  std::shared_ptr<const Credentials> current_;  // guarded by mu_
  std::string stamp_;                           // guarded by mu_: mtime+size seen
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_SERVICE_ACCESS_H_
