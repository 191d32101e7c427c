// The commands about loomctl itself, all generated from the help table
// (cli/help.h): `help`, `completion bash`, and `__jobs` and `__nodes`, the hidden commands
// the completion script calls for job ids (cli/commands/commands.h).
#include <iostream>

#include "absl/time/time.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/help.h"

namespace loom::cli {

// `loomctl completion bash`: the completion script (cli/help.h).
int CmdCompletion(const Globals&, const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0] != "bash") return Usage("completion: expected `completion bash`");
  std::cout << BashCompletion();
  return 0;
}

// `loomctl help [COMMAND]`.
int CmdHelp(const Globals&, const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cout << MainUsage();
    return 0;
  }
  if (args[0] == "-h" || args[0] == "--help") {
    std::cout << CommandUsage(*FindCommand("help"));
    return 0;
  }
  const CommandHelp* c = FindCommand(args[0]);
  if (c == nullptr) return Usage("help: unknown command " + args[0]);
  std::cout << CommandUsage(*c);
  return 0;
}

// `loomctl __jobs`: job ids, one per line, for the completion script
// (silent and exit 1 when the controller cannot be asked).
int CmdJobIds(const Globals& g, const std::vector<std::string>&) {
  auto client = Client::Connect(g);
  if (!client.ok()) return 1;
  loom::v1::ListJobsRequest req;
  req.set_page_size(500);
  loom::v1::ListJobsResponse resp;
  auto ctx = (*client)->Context(absl::Seconds(2));
  if (!(*client)->stub->ListJobs(ctx.get(), req, &resp).ok()) return 1;
  for (const auto& j : resp.jobs()) std::cout << j.id() << "\n";
  return 0;
}

// `loomctl __nodes`: the registered workers' nodes, one per line.
int CmdNodeNames(const Globals& g, const std::vector<std::string>&) {
  auto client = Client::Connect(g);
  if (!client.ok()) return 1;
  loom::v1::ListWorkersResponse resp;
  auto ctx = (*client)->Context(absl::Seconds(2));
  if (!(*client)->stub->ListWorkers(ctx.get(), loom::v1::ListWorkersRequest(), &resp).ok()) {
    return 1;
  }
  for (const auto& w : resp.workers()) std::cout << w.node() << "\n";
  return 0;
}

}  // namespace loom::cli
