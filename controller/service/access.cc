#include "controller/service/access.h"

#include <sys/stat.h>

#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/grpc_util.h"
#include "common/sha256.h"

namespace loom::controller {
namespace {

constexpr absl::string_view kWorkerPrefix = "worker:";
constexpr absl::string_view kUserPrefix = "user:";
constexpr absl::string_view kHashPrefix = "sha256:";

std::string RawSha256(absl::string_view data) {
  Sha256 h;
  h.Update(data);
  Sha256::Digest d = h.Finish();
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

// Equal strings, in time that does not depend on where they differ.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '@' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string RolesText(const std::set<Role>& roles) {
  std::vector<std::string> names;
  for (Role r : roles) names.push_back(RoleName(r));
  return names.empty() ? "no one" : absl::StrJoin(names, ", ");
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kWorker: return "worker";
    case Role::kReader: return "reader";
    case Role::kUser: return "user";
    case Role::kAdmin: return "admin";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseUserRole(absl::string_view text) {
  if (text == "reader") return Role::kReader;
  if (text == "user") return Role::kUser;
  if (text == "admin") return Role::kAdmin;
  return absl::InvalidArgumentError(
      absl::StrCat("role '", text, "' is not one of reader, user, admin"));
}

std::string Principal::Describe() const {
  if (role == Role::kWorker) {
    return name.empty() ? "a worker (worker token)" : absl::StrCat("worker '", name, "'");
  }
  return absl::StrCat("user '", name, "'");
}

const std::map<std::string, std::set<Role>>& AccessRules() {
  static const auto* rules = [] {
    const std::set<Role> read = {Role::kReader, Role::kUser, Role::kAdmin};
    const std::set<Role> write = {Role::kUser, Role::kAdmin};
    const std::set<Role> worker = {Role::kWorker};
    const std::set<Role> admin = {Role::kAdmin};
    return new std::map<std::string, std::set<Role>>{
        {"JobService.SubmitJob", write},
        {"JobService.GetJob", read},
        {"JobService.ListJobs", read},
        {"JobService.CancelJob", write},  // and AuthorizeJobChange
        {"JobService.WatchJob", read},
        {"JobService.WatchEvents", read},
        {"JobService.ListEvents", read},
        {"JobService.ListWorkers", read},
        {"JobService.GetStepMetrics", read},
        {"JobService.GetStepSeries", read},
        {"JobService.ListCheckpoints", read},
        {"JobService.PlanCheckpointRetention", read},
        {"JobService.Plan", read},
        {"JobService.RollbackJob", write},  // and AuthorizeJobChange
        {"JobService.GetRankLog", read},
        {"JobService.SearchRankLogs", read},
        {"JobService.ListQueues", read},
        {"JobService.WhoAmI", read},
        {"JobService.GetGoodput", read},
        {"JobService.CordonNode", admin},
        {"JobService.UncordonNode", admin},
        {"JobService.DrainNode", admin},
        {"WorkerService.RegisterWorker", worker},
        {"WorkerService.Heartbeat", worker},
        {"WorkerService.ReportStepMetrics", worker},
        {"WorkerService.ReportRankExit", worker},
        {"WorkerService.AppendRankLogs", worker},  // and only its own ranks' logs
    };
  }();
  return *rules;
}

absl::Status Authorize(const Principal& who, absl::string_view method) {
  const auto& rules = AccessRules();
  auto it = rules.find(std::string(method));
  if (it == rules.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, ": no access rule for this method, so no one may call it"));
  }
  if (it->second.count(who.role) > 0) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      who.Describe(), " has role ", RoleName(who.role), " and may not call ", method,
      " (allowed: ", RolesText(it->second), ")"));
}

absl::Status AuthorizeJobChange(const Principal& who, absl::string_view verb,
                                absl::string_view job_id, absl::string_view submitted_by) {
  if (who.role == Role::kAdmin) return absl::OkStatus();
  if (who.role == Role::kUser && !submitted_by.empty() && who.name == submitted_by) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      who.Describe(), " may not ", verb, " job '", job_id, "': it was submitted by ",
      submitted_by.empty() ? std::string("an unrecorded submitter")
                           : absl::StrCat("'", submitted_by, "'"),
      ", and only its submitter or an admin may"));
}

absl::StatusOr<Credentials> Credentials::Parse(absl::string_view users_text,
                                               absl::string_view source,
                                               absl::string_view worker_token) {
  Credentials c;
  if (!worker_token.empty()) c.worker_token_sha256_ = RawSha256(worker_token);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(users_text, '\n')) {
    ++line_number;
    auto where = [&] { return absl::StrCat(source, ":", line_number, ": "); };
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() < 2 || fields.size() > 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "expected '<name> <role> [sha256:<hex>]', got ", fields.size(), " field(s)"));
    }
    User user;
    user.name = std::string(fields[0]);
    if (!ValidName(user.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "user name '", user.name, "' must be 1-64 of [A-Za-z0-9._@-]"));
    }
    absl::StatusOr<Role> role = ParseUserRole(fields[1]);
    if (!role.ok()) return absl::InvalidArgumentError(absl::StrCat(where(), role.status().message()));
    user.role = *role;
    if (fields.size() == 3) {
      absl::string_view hex = fields[2];
      std::string raw;
      if (!absl::ConsumePrefix(&hex, kHashPrefix) || hex.size() != 64 ||
          !absl::c_all_of(hex, [](char ch) { return absl::ascii_isxdigit(ch); })) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "token hash must be 'sha256:' and 64 hex digits (loomctl users add writes it)"));
      }
      raw = absl::HexStringToBytes(absl::AsciiStrToLower(hex));
      if (c.by_token_hash_.count(raw) > 0 || raw == c.worker_token_sha256_) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "user '", user.name, "' has the same token as ",
            raw == c.worker_token_sha256_ ? std::string("the workers")
                                          : absl::StrCat("user '", c.by_token_hash_[raw], "'"),
            "; every user needs a token of their own"));
      }
      user.token_sha256 = raw;
      c.by_token_hash_[raw] = user.name;
    }
    if (c.users_.count(user.name) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "user '", user.name, "' is listed twice"));
    }
    c.users_[user.name] = std::move(user);
  }
  return c;
}

absl::StatusOr<Principal> Credentials::Authenticate(absl::string_view bearer,
                                                    absl::string_view certificate_name) const {
  if (!certificate_name.empty()) {
    absl::string_view name = certificate_name;
    if (absl::ConsumePrefix(&name, kWorkerPrefix) && ValidName(name)) {
      return Principal{Role::kWorker, std::string(name), true};
    }
    name = certificate_name;
    if (absl::ConsumePrefix(&name, kUserPrefix) && ValidName(name)) {
      auto it = users_.find(std::string(name));
      if (it == users_.end()) {
        return absl::UnauthenticatedError(absl::StrCat(
            "the client certificate names user '", name,
            "', who is not in the controller's users file (added with `loomctl users add`, or "
            "removed: revoked)"));
      }
      return Principal{it->second.role, it->second.name, true};
    }
    return absl::UnauthenticatedError(absl::StrCat(
        "the client certificate's common name '", certificate_name,
        "' is neither 'worker:<node>' nor 'user:<name>' (issue certificates with `loomctl ca`)"));
  }
  if (bearer.empty()) {
    return absl::UnauthenticatedError(
        "no credential: send a client certificate from the cluster CA, or 'authorization: "
        "Bearer <token>' (loomctl reads <home>/token or --token-file)");
  }
  const std::string hash = RawSha256(bearer);
  if (!worker_token_sha256_.empty() && ConstantTimeEqual(hash, worker_token_sha256_)) {
    return Principal{Role::kWorker, "", false};
  }
  // The map's lookup compares hashes of a high-entropy token: its timing
  // tells nothing about the token.
  auto it = by_token_hash_.find(hash);
  if (it == by_token_hash_.end()) {
    return absl::UnauthenticatedError(
        "unknown token: it is no user's and not the workers' (revoked, or mistyped; an admin "
        "adds users with `loomctl users add`)");
  }
  const User& user = users_.at(it->second);
  return Principal{user.role, user.name, false};
}

absl::StatusOr<Principal> Credentials::AuthenticateTokenHash(absl::string_view token_sha256) const {
  if (token_sha256.size() != 64 || !absl::c_all_of(token_sha256, absl::ascii_isxdigit)) {
    return absl::UnauthenticatedError("the session's token hash is not 64 hex digits");
  }
  const std::string hash = absl::HexStringToBytes(absl::AsciiStrToLower(token_sha256));
  auto it = by_token_hash_.find(hash);
  if (it == by_token_hash_.end()) {
    return absl::UnauthenticatedError(
        "the token this console session was opened with is no user's any more (revoked or "
        "replaced): log in again with a current token");
  }
  const User& user = users_.at(it->second);
  return Principal{user.role, user.name, false};
}

std::string UsersFileLine(absl::string_view name, Role role, absl::string_view token) {
  return absl::StrCat(name, " ", RoleName(role), " ", kHashPrefix, Sha256Hex(token), "\n");
}

namespace {

// mtime (ns) and size: enough to see an edit or an atomic replace.
std::string FileStamp(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":", st.st_size, ":",
                      st.st_ino);
}

absl::StatusOr<std::shared_ptr<const Credentials>> ReadCredentials(const std::string& users_file,
                                                                   const std::string& token) {
  std::string text;
  if (!users_file.empty()) {
    // Token hashes are not secrets, but who has which role is the admins'
    // business: the same mode rule as for token files.
    struct stat st;
    if (stat(users_file.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("users file ", users_file, " does not exist"));
    }
    if (st.st_mode & (S_IWOTH | S_IWGRP)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "users file ", users_file, " is writable by others: run chmod 600 ", users_file));
    }
    absl::StatusOr<std::string> read = ReadFile(users_file);
    if (!read.ok()) return read.status();
    text = std::move(*read);
  }
  absl::StatusOr<Credentials> parsed = Credentials::Parse(text, users_file, token);
  if (!parsed.ok()) return parsed.status();
  return std::make_shared<const Credentials>(std::move(*parsed));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AccessControl>> AccessControl::Load(std::string users_file,
                                                                   std::string worker_token_file) {
  std::string token;
  if (!worker_token_file.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(worker_token_file);
    if (!read.ok()) return read.status();
    token = std::move(*read);
  }
  std::unique_ptr<AccessControl> access(new AccessControl(std::move(users_file), token));
  access->stamp_ = FileStamp(access->users_file_);
  absl::StatusOr<std::shared_ptr<const Credentials>> creds =
      ReadCredentials(access->users_file_, access->worker_token_);
  if (!creds.ok()) return creds.status();
  access->current_ = std::move(*creds);
  return access;
}

absl::StatusOr<Principal> AccessControl::Authenticate(absl::string_view bearer,
                                                      absl::string_view certificate_name) const {
  std::shared_ptr<const Credentials> creds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    creds = current_;
  }
  return creds->Authenticate(bearer, certificate_name);
}

absl::StatusOr<Principal> AccessControl::AuthenticateTokenHash(
    absl::string_view token_sha256) const {
  std::shared_ptr<const Credentials> creds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    creds = current_;
  }
  return creds->AuthenticateTokenHash(token_sha256);
}

absl::Status AccessControl::ReloadIfChanged() {
  if (users_file_.empty()) return absl::OkStatus();
  const std::string stamp = FileStamp(users_file_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stamp == stamp_) return absl::OkStatus();
    stamp_ = stamp;
  }
  absl::StatusOr<std::shared_ptr<const Credentials>> creds =
      ReadCredentials(users_file_, worker_token_);
  if (!creds.ok()) {
    return absl::Status(creds.status().code(),
                        absl::StrCat(creds.status().message(),
                                     " (the users in force before this change stay in force)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  current_ = std::move(*creds);
  return absl::OkStatus();
}

}  // namespace loom::controller
