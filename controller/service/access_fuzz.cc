// libFuzzer target: the users file parser (Credentials::Parse) and
// authentication against what it parsed. The input is split at its first
// two NUL bytes into the users file, a bearer token and a certificate name
// (missing parts are empty). Checked beyond "no crash, no UB":
//  * Authenticate never answers OK with a worker role for a bearer token
//    other than the worker token, nor a user role for a name not in the file;
//  * the line UsersFileLine writes for a new user parses, alone or appended
//    to a file that parsed, and its token then authenticates as that user
//    with that role (what `loomctl users add` relies on).
// Built only in the fuzz build (scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "controller/service/access.h"

namespace {

using loom::controller::Credentials;
using loom::controller::Principal;
using loom::controller::Role;

[[noreturn]] void Die(const std::string& what) {
  std::cerr << what << std::endl;
  std::abort();
}

// A name ValidName accepts, derived from arbitrary bytes (never empty).
std::string NameFrom(absl::string_view bytes) {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@-";
  std::string name = "n";
  for (size_t i = 0; i < bytes.size() && name.size() < 64; ++i) {
    name += kAlphabet[static_cast<unsigned char>(bytes[i]) % (sizeof(kAlphabet) - 1)];
  }
  return name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t first = input.find('\0');
  const absl::string_view users = input.substr(0, first);
  absl::string_view bearer, cert;
  if (first != absl::string_view::npos) {
    absl::string_view rest = input.substr(first + 1);
    const size_t second = rest.find('\0');
    bearer = rest.substr(0, second);
    if (second != absl::string_view::npos) cert = rest.substr(second + 1);
  }
  constexpr absl::string_view kWorkerToken = "the-workers-token-0123456789abcdef";

  absl::StatusOr<Credentials> parsed = Credentials::Parse(users, "users", kWorkerToken);
  if (parsed.ok()) {
    absl::StatusOr<Principal> who = parsed->Authenticate(bearer, cert);
    if (who.ok()) {
      if (who->role == Role::kWorker && !who->certificate && bearer != kWorkerToken) {
        Die("a bearer token other than the workers' authenticated as a worker");
      }
      if (who->role != Role::kWorker && who->name.empty()) Die("a person without a name");
      if (who->role != Role::kWorker &&
          users.find(who->name) == absl::string_view::npos) {
        Die(absl::StrCat("user '", who->name, "' authenticated but is not in the file"));
      }
    }
  }

  // The writer's line parses and authenticates as written.
  const std::string name = NameFrom(bearer.substr(0, 32));
  const std::string token = absl::StrCat("tok-", cert, "-", name);
  const Role role = size % 3 == 0 ? Role::kReader : size % 3 == 1 ? Role::kUser : Role::kAdmin;
  const std::string line = loom::controller::UsersFileLine(name, role, token);
  for (const std::string& text :
       {line, parsed.ok() ? absl::StrCat(users, users.empty() || users.back() == '\n' ? "" : "\n",
                                         line)
                          : std::string()}) {
    if (text.empty()) continue;
    absl::StatusOr<Credentials> again = Credentials::Parse(text, "users", kWorkerToken);
    if (!again.ok()) {
      // Appending may collide with a name already in the file; alone it
      // must parse.
      if (text == line) Die(absl::StrCat("UsersFileLine wrote a line that does not parse: ", line,
                                         again.status().ToString()));
      continue;
    }
    absl::StatusOr<Principal> who = again->Authenticate(token, "");
    if (!who.ok() || who->name != name || who->role != role || who->certificate) {
      Die(absl::StrCat("the token of '", name, "' does not authenticate as written: ",
                       who.ok() ? who->Describe() : who.status().ToString()));
    }
  }
  return 0;
}
