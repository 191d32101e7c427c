// loomctl's commands described once: the top-level usage, each command's own
// `--help`, and the bash completion script are all generated from
// Commands(), and loomctl's dispatcher refuses to start when a command it
// runs has no entry here (or an entry has no runner), so help and behaviour
// cannot drift apart silently.
#ifndef LOOM_CLI_HELP_H_
#define LOOM_CLI_HELP_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace loom::cli {

// What a positional argument is, for completion.
enum class ArgKind { kNone, kFile, kDir, kJob, kNode };

struct CommandHelp {
  std::string name;                     // "submit"; "local" for a command with subcommands
  std::vector<std::string> synopsis;    // forms after "loomctl ", one per line
  std::string summary;                  // one line, for the command list
  std::string details;                  // what it does, its flags, an example
  std::vector<std::string> subcommands;  // "up", "down", ... (empty if none)
  std::vector<std::string> flags;        // every flag it takes, for completion
  ArgKind positional = ArgKind::kNone;
};

// Every command loomctl runs, in the order `loomctl --help` lists them.
const std::vector<CommandHelp>& Commands();

// The entry for `name`, or null.
const CommandHelp* FindCommand(absl::string_view name);

// `loomctl --help`: synopsis, the command list and the global flags.
std::string MainUsage();

// `loomctl COMMAND --help`: "usage: loomctl ..." lines, then the details.
std::string CommandUsage(const CommandHelp& command);

// True when `args` (a command's arguments) ask for its help: -h or --help
// anywhere, or "help" as the first.
bool WantsHelp(const std::vector<std::string>& args);

// `loomctl completion bash`: a script for bash-completion (source it, or put
// it in /etc/bash_completion.d/loomctl). Completes commands, subcommands,
// flags, files and directories where a command takes them, and job ids from
// the controller (`loomctl __jobs`) where a command takes a JOB.
std::string BashCompletion();

// The global flags, for usage and completion.
const std::vector<std::string>& GlobalFlags();

}  // namespace loom::cli

#endif  // LOOM_CLI_HELP_H_
