// loomctl: the Loom command-line client.
//
//   loomctl [global flags] COMMAND [args]
// Exit codes: 0 success; 1 the operation failed (one-line reason on stderr);
// 2 usage error. A followed/watched job that ends other than SUCCEEDED
// exits 1.
//
// This file is main() only: it parses the global flags into Globals and
// dispatches to the command's runner (cli/commands/commands.h), answering
// `COMMAND --help` from the help table (cli/help.h) that also drives the
// usage and the completion script.
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/help.h"

namespace loom::cli {
namespace {

// The runner of every command of Commands() (cli/help.h), by name.
const std::map<std::string, Runner>& Runners() {
  static const auto* runners = new std::map<std::string, Runner>{
      {"local", CmdLocal},
      {"users", CmdUsers},
      {"ca", CmdCa},
      {"submit", CmdSubmit},
      {"validate", CmdValidate},
      {"list", CmdList},
      {"status", CmdStatus},
      {"watch", CmdWatch},
      {"cancel", CmdCancel},
      {"workers", CmdWorkers},
      {"cordon", CmdCordon},
      {"uncordon", CmdUncordon},
      {"drain", CmdDrain},
      {"events", CmdEvents},
      {"plan", CmdPlan},
      {"rollback", CmdRollback},
      {"checkpoints", CmdCheckpoints},
      {"diagnose", CmdDiagnose},
      {"data", CmdData},
      {"completion", CmdCompletion},
      {"help", CmdHelp},
      {"sample", CmdSample},
      {"export", CmdExport},
      {"report", CmdReport},
      {"logs", CmdLogs},
      {"queues", CmdQueues},
      {"whoami", CmdWhoAmI},
      {"steps", CmdSteps},
  };
  return *runners;
}

// Every runner has its help and every help its runner: a command added to
// one and not the other stops loomctl with this message (the CLI tests run
// loomctl, so they fail on it).
bool RunnersMatchHelp() {
  bool ok = true;
  for (const auto& [name, runner] : Runners()) {
    if (FindCommand(name) == nullptr) {
      std::cerr << "loomctl: internal error: command " << name << " has no help (cli/help.cc)\n";
      ok = false;
    }
  }
  for (const CommandHelp& c : Commands()) {
    if (Runners().count(c.name) == 0) {
      std::cerr << "loomctl: internal error: help for " << c.name << " but no such command\n";
      ok = false;
    }
  }
  return ok;
}

}  // namespace
}  // namespace loom::cli

int main(int argc, char** argv) {
  using namespace loom::cli;
  Globals g;
  const char* env_home = getenv("LOOM_HOME");
  const char* user_home = getenv("HOME");
  g.home = env_home ? env_home : std::string(user_home ? user_home : "/tmp") + "/.loom";
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    if (!rest.empty()) {
      // Global output flag may also follow the command.
      if (a == "-o") {
        std::string v;
        if (!value(&v)) return Usage("-o needs a value");
        g.json = v == "json";
        if (v != "json" && v != "table") return Usage("-o: expected table or json");
        continue;
      }
      rest.push_back(a);
      continue;
    }
    if (a == "--home") {
      if (!value(&g.home)) return Usage("--home needs a value");
    } else if (a == "--controller") {
      if (!value(&g.controller)) return Usage("--controller needs a value");
    } else if (a == "--token-file") {
      if (!value(&g.token_file)) return Usage("--token-file needs a value");
    } else if (a == "--tls") {
      // TLS is the default; kept so that older command lines still work.
    } else if (a == "--plaintext") {
      g.plaintext = true;
    } else if (a == "--tls-ca") {
      if (!value(&g.tls_ca)) return Usage("--tls-ca needs a value");
    } else if (a == "--tls-cert") {
      if (!value(&g.tls_cert)) return Usage("--tls-cert needs a value");
    } else if (a == "--tls-key") {
      if (!value(&g.tls_key)) return Usage("--tls-key needs a value");
    } else if (a == "-o") {
      std::string v;
      if (!value(&v)) return Usage("-o needs a value");
      if (v != "json" && v != "table") return Usage("-o: expected table or json");
      g.json = v == "json";
    } else if (a == "-h" || a == "--help") {
      std::cout << MainUsage();
      return 0;
    } else if (a.rfind("-", 0) == 0) {
      return Usage("unknown flag " + a);
    } else {
      rest.push_back(a);
    }
  }
  if (!RunnersMatchHelp()) return 70;
  if (rest.empty()) {
    std::cerr << MainUsage();
    return 2;
  }
  std::string cmd = rest[0];
  std::vector<std::string> args(rest.begin() + 1, rest.end());
  if (g.plaintext && (!g.tls_ca.empty() || !g.tls_cert.empty())) {
    return Usage("--plaintext cannot go with --tls-ca or --tls-cert");
  }
  if (g.tls_cert.empty() != g.tls_key.empty()) {
    return Usage("--tls-cert and --tls-key go together");
  }
  if (cmd == "__jobs") return CmdJobIds(g, args);
  if (cmd == "__nodes") return CmdNodeNames(g, args);
  auto runner = Runners().find(cmd);
  if (runner == Runners().end()) return Usage("unknown command " + cmd);
  if (cmd != "help" && WantsHelp(args)) {
    std::cout << CommandUsage(*FindCommand(cmd));
    return 0;
  }
  return runner->second(g, args);
}

