// Every loomctl command, one runner each, grouped by file under
// cli/commands/ as kubectl keeps one package per verb:
//   jobs.cc         submit validate list status cancel events rollback
//   watch.cc        watch (and the follower behind submit --follow)
//   logs.cc         logs diagnose
//   checkpoints.cc  checkpoints
//   plan.cc         plan
//   workers.cc      workers
//   data.cc         data prepare
//   local.cc        local up|down|restart|status
//   users.cc        users add|remove|list
//   ca.cc           ca issue
//   model.cc        sample export
//   report.cc       report
//   completion.cc   help completion __jobs
//
// The contract of a runner: `args` are the words after the command's name
// (global flags already taken out into `g`); it writes its output to
// std::cout and returns the process's exit code: 0 success, 1 the operation
// failed (a one-line reason on stderr, Fail()), 2 a usage error (Usage()).
// `COMMAND --help` never reaches a runner: main() answers it from the help
// table (cli/help.h), which must hold an entry for every runner main()
// dispatches to, and main() refuses to start otherwise.
#ifndef LOOM_CLI_COMMANDS_COMMANDS_H_
#define LOOM_CLI_COMMANDS_COMMANDS_H_

#include <string>
#include <vector>

#include "cli/commands/common.h"

namespace loom::cli {

// What every command's runner looks like.
using Runner = int (*)(const Globals&, const std::vector<std::string>&);

// jobs.cc
int CmdSubmit(const Globals& g, const std::vector<std::string>& args);
int CmdValidate(const Globals& g, const std::vector<std::string>& args);
int CmdList(const Globals& g, const std::vector<std::string>& args);
int CmdStatus(const Globals& g, const std::vector<std::string>& args);
int CmdCancel(const Globals& g, const std::vector<std::string>& args);
int CmdEvents(const Globals& g, const std::vector<std::string>& args);
int CmdRollback(const Globals& g, const std::vector<std::string>& args);

// watch.cc
int CmdWatch(const Globals& g, const std::vector<std::string>& args);

// logs.cc
int CmdLogs(const Globals& g, const std::vector<std::string>& args);
int CmdDiagnose(const Globals& g, const std::vector<std::string>& args);

// checkpoints.cc: with --verify, exit 1 when a checkpoint failed its checks.
int CmdCheckpoints(const Globals& g, const std::vector<std::string>& args);

// plan.cc
int CmdPlan(const Globals& g, const std::vector<std::string>& args);

// workers.cc
int CmdWorkers(const Globals& g, const std::vector<std::string>& args);
// `cordon NODE`, `uncordon NODE`, `drain NODE`: an admin takes a node out of
// placement, puts it back, or moves its jobs off it (workers.cc).
int CmdCordon(const Globals& g, const std::vector<std::string>& args);
int CmdUncordon(const Globals& g, const std::vector<std::string>& args);
int CmdDrain(const Globals& g, const std::vector<std::string>& args);
int CmdQueues(const Globals& g, const std::vector<std::string>& args);
// Who the controller takes this caller for: name, role, credential.
int CmdWhoAmI(const Globals& g, const std::vector<std::string>& args);

// data.cc: `data prepare ...` (args[0] is the subcommand).
int CmdData(const Globals& g, const std::vector<std::string>& args);

// local.cc: `local status` exits 1 when no daemon, or not every one, is alive.
int CmdLocal(const Globals& g, const std::vector<std::string>& args);

// users.cc
int CmdUsers(const Globals& g, const std::vector<std::string>& args);

// ca.cc
int CmdCa(const Globals& g, const std::vector<std::string>& args);

// model.cc: on success these exec loom-ckpt and do not return.
int CmdSample(const Globals& g, const std::vector<std::string>& args);
int CmdExport(const Globals& g, const std::vector<std::string>& args);

// report.cc
int CmdReport(const Globals& g, const std::vector<std::string>& args);
int CmdSteps(const Globals& g, const std::vector<std::string>& args);

// completion.cc. CmdJobIds runs the hidden `__jobs`, which has no help
// entry: silent, and exit 1 when the controller cannot be asked.
int CmdCompletion(const Globals& g, const std::vector<std::string>& args);
int CmdHelp(const Globals& g, const std::vector<std::string>& args);
int CmdJobIds(const Globals& g, const std::vector<std::string>& args);
int CmdNodeNames(const Globals& g, const std::vector<std::string>& args);

}  // namespace loom::cli

#endif  // LOOM_CLI_COMMANDS_COMMANDS_H_
