// Following a job as it runs, shared by `loomctl watch` and
// `loomctl submit --follow`, and the end-of-job summary that `loomctl
// status` prints too.
#ifndef LOOM_CLI_COMMANDS_WATCH_H_
#define LOOM_CLI_COMMANDS_WATCH_H_

#include <string>

#include "cli/commands/common.h"
#include "loom/v1/service.pb.h"

namespace loom::cli {

// Prints the job's summary (steps, losses, throughput, checkpoints) to
// std::cout; with a client, also the live workers' metrics addresses.
// `client` may be null; it is not owned.
void PrintSummary(const loom::v1::Job& job, Client* client);

// Streams the job's events (WatchJob, history included) until it ends:
// progress lines (a redrawn bar on a terminal), or one JSON event per line
// when `json`; then the summary (not with `json`). While the controller is
// UNAVAILABLE it reconnects, a second apart, up to 30 times. Returns 0 when
// the job SUCCEEDED, 1 otherwise (the reason on stderr). `client` is not
// owned and must outlive the call.
int Watch(Client* client, const std::string& job_id, bool json);

}  // namespace loom::cli

#endif  // LOOM_CLI_COMMANDS_WATCH_H_
