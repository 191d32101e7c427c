// Following a job as it runs, shared by `loomctl watch` and
// `loomctl submit --follow`, and the end-of-job summary that `loomctl
// status` prints too.
#ifndef LOOM_CLI_COMMANDS_WATCH_H_
#define LOOM_CLI_COMMANDS_WATCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "cli/commands/common.h"
#include "loom/v1/service.pb.h"

namespace loom::cli {

// Prints the job's summary (steps, losses, throughput, checkpoints) to
// std::cout; with a client, also the live workers' metrics addresses.
// `client` may be null; it is not owned.
void PrintSummary(const loom::v1::Job& job, Client* client);

// Streams the job's events (WatchJob) until it ends, calling `on_event`
// with each: from after `after_seq` when given (the history replay
// otherwise). While the controller is UNAVAILABLE (restarting, or a leader
// gone and a standby taking over) it reconnects, to the new leader when
// there are several controllers, for up to a minute, resuming after the
// last logged event it gave: every logged event comes once, in order,
// across a failover; live steps may miss some. *last_job: the job as the
// last event had it. The stream's error, or OK once the job has ended.
absl::Status FollowJob(Client* client, const std::string& job_id,
                       std::optional<int64_t> after_seq,
                       const std::function<void(const loom::v1::JobEvent&)>& on_event,
                       loom::v1::Job* last_job);

// Streams the job's events until it ends (FollowJob, history included):
// progress lines (a redrawn bar on a terminal), or one JSON event per line
// when `json`; then the summary (not with `json`). Returns 0 when the job
// SUCCEEDED, 1 otherwise (the reason on stderr). `client` is not owned and
// must outlive the call.
int Watch(Client* client, const std::string& job_id, bool json);

}  // namespace loom::cli

#endif  // LOOM_CLI_COMMANDS_WATCH_H_
