// `loomctl users add|remove|list`: edits the controller's users file
// (controller/service/access.h) where it lies; needs no controller
// (cli/commands/commands.h).
#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "common/file_util.h"
#include "common/grpc_util.h"
#include "controller/service/access.h"

namespace loom::cli {

// `loomctl users add|remove|list`: edits the controller's users file
// (controller/service/access.h), which it re-reads on change. Run where that file
// is (the controller's host, or the Secret's source).
int CmdUsers(const Globals& g, const std::vector<std::string>& args) {
  if (args.empty()) return Usage("users: expected add, remove or list");
  const std::string verb = args[0];
  std::string path = g.home + "/users";
  std::string name;
  std::string role_text = "user";
  std::string token_out;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--users-file" && i + 1 < args.size()) {
      path = args[++i];
    } else if (args[i] == "--role" && i + 1 < args.size() && verb == "add") {
      role_text = args[++i];
    } else if (args[i] == "--token-out" && i + 1 < args.size() && verb == "add") {
      token_out = args[++i];
    } else if (name.empty() && verb != "list" && args[i].rfind("-", 0) != 0) {
      name = args[i];
    } else {
      return Usage("users: unexpected argument " + args[i]);
    }
  }
  if (verb != "add" && verb != "remove" && verb != "list") {
    return Usage("users: expected add, remove or list, got " + verb);
  }
  if (verb != "list" && name.empty()) return Usage("users " + verb + ": expected NAME");
  std::string text;
  if (access(path.c_str(), F_OK) == 0) {
    auto read = ReadFile(path);
    if (!read.ok()) return Fail(read.status());
    text = *read;
  } else if (verb != "add") {
    return Fail(absl::NotFoundError(absl::StrCat("users file ", path, " does not exist")));
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  auto first_field = [](const std::string& line) {
    std::vector<std::string> f = absl::StrSplit(line.substr(0, line.find('#')), ' ',
                                                absl::SkipWhitespace());
    return f.empty() ? std::string() : std::string(absl::StripAsciiWhitespace(f[0]));
  };
  if (verb == "list") {
    auto parsed = controller::Credentials::Parse(text, path, "");
    if (!parsed.ok()) return Fail(parsed.status());
    std::vector<std::vector<std::string>> rows = {{"NAME", "ROLE", "PROVES WITH"}};
    for (const std::string& line : lines) {
      std::vector<std::string> f = absl::StrSplit(line.substr(0, line.find('#')),
                                                  absl::ByAnyChar(" \t"), absl::SkipEmpty());
      if (f.size() < 2) continue;
      rows.push_back({f[0], f[1], f.size() == 3 ? "token or certificate" : "certificate"});
    }
    PrintTable(rows);
    return 0;
  }
  std::string token;
  if (verb == "add") {
    auto role = controller::ParseUserRole(role_text);
    if (!role.ok()) return Usage("users add: --role: " + std::string(role.status().message()));
    auto generated = GenerateToken();
    if (!generated.ok()) return Fail(generated.status());
    token = *generated;
    std::string line = controller::UsersFileLine(name, *role, token);
    line.pop_back();
    lines.push_back(line);
  } else {
    size_t before = lines.size();
    lines.erase(std::remove_if(lines.begin(), lines.end(),
                               [&](const std::string& l) { return first_field(l) == name; }),
                lines.end());
    if (lines.size() == before) {
      return Fail(absl::NotFoundError(absl::StrCat("no user '", name, "' in ", path)));
    }
  }
  std::string updated = absl::StrJoin(lines, "\n") + "\n";
  // The controller refuses a file that does not parse: so does this.
  auto parsed = controller::Credentials::Parse(updated, path, "");
  if (!parsed.ok()) return Fail(parsed.status());
  if (absl::Status w = WritePrivateFile(path, updated); !w.ok()) return Fail(w);
  if (verb == "remove") {
    std::cout << "removed user " << name << " from " << path
              << " (the controller stops accepting their token and certificate within a "
                 "second)\n";
    return 0;
  }
  if (!token_out.empty()) {
    if (absl::Status w = WritePrivateFile(token_out, token + "\n"); !w.ok()) return Fail(w);
    std::cout << "added user " << name << " (" << role_text << ") to " << path << "; token in "
              << token_out << "\n";
  } else {
    std::cout << "added user " << name << " (" << role_text << ") to " << path
              << "; their token (shown once, stored only hashed):\n"
              << token << "\n";
  }
  return 0;
}

}  // namespace loom::cli
