// `loomctl workers` and `queues`: the controller's registered workers and its
// queues; `cordon`, `uncordon` and `drain`: an admin's actions on a node
// (cli/commands/commands.h).
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"

namespace loom::cli {

int CmdWorkers(const Globals& g, const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("workers: takes no arguments");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::ListWorkersResponse resp;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::ListWorkers, loom::v1::ListWorkersRequest(), &resp);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"ID", "NODE", "ZONE", "RACK", "ALIVE", "CORDONED",
                                                 "SLOTS", "CPUS", "GPUS", "MEMORY", "GEMM/THREAD",
                                                 "HEARTBEAT", "METRICS"}};
  for (const auto& w : resp.workers()) {
    rows.push_back(
        {w.id(), w.node(), w.zone().empty() ? "-" : w.zone(), w.rack().empty() ? "-" : w.rack(),
         w.alive() ? "yes" : "no", w.cordoned() ? "yes" : "no",
         absl::StrCat(w.slots_used(), "/", w.slots()), absl::StrCat(w.cpus()),
         absl::StrCat(w.gpus()), absl::StrFormat("%.1f GiB", w.memory_bytes() / 1073741824.0),
         w.gemm_flops_per_second_per_thread() > 0
             ? absl::StrFormat("%.1f GFLOP/s", w.gemm_flops_per_second_per_thread() / 1e9)
             : "-",
         Ago(w.last_heartbeat_unix_ms()) + " ago", w.metrics_address()});
  }
  PrintTable(rows);
  for (const auto& w : resp.workers()) {
    if (!w.cordoned()) continue;
    std::cout << "cordoned: " << w.node() << " takes no new ranks "
              << (w.cordoned_until_unix_ms() == 0
                      ? std::string("until uncordoned")
                      : absl::StrCat("for ",
                                     std::max<int64_t>(0, (w.cordoned_until_unix_ms() -
                                                           absl::ToUnixMillis(absl::Now())) /
                                                              1000),
                                     " s more"))
              << " (" << w.cordon_reason() << ")\n";
  }
  std::cout << std::flush;
  return 0;
}

int CmdWhoAmI(const Globals& g, const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("whoami: takes no arguments");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::WhoAmIResponse resp;
  absl::Status s =
      (*client)->Call(&loom::v1::JobService::Stub::WhoAmI, loom::v1::WhoAmIRequest(), &resp);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
  } else {
    std::cout << resp.name() << " (" << resp.role() << ", by " << resp.credential() << ")"
              << std::endl;
  }
  return 0;
}

int CmdQueues(const Globals& g, const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("queues: takes no arguments");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::ListQueuesResponse resp;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::ListQueues,
                                   loom::v1::ListQueuesRequest(), &resp);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return 0;
  }
  // "4 slots, 2 gpus", "unlimited"; "-" for none.
  auto limit = [](const loom::v1::QueueLimit& l) {
    if (l.slots() < 0 && l.gpus() < 0) return std::string("unlimited");
    auto one = [](int64_t v, const char* what) {
      return v < 0 ? absl::StrCat("any ", what) : absl::StrCat(v, " ", what);
    };
    return absl::StrCat(one(l.slots(), "slots"), ", ", one(l.gpus(), "gpus"));
  };
  std::vector<std::vector<std::string>> rows = {{"QUEUE", "COHORT", "NOMINAL", "BORROW", "WEIGHT",
                                                 "PREEMPT", "USED", "RUNNING", "PENDING"}};
  for (const auto& q : resp.queues()) {
    rows.push_back({q.name(), q.cohort().empty() ? "-" : q.cohort(), limit(q.nominal_quota()),
                    q.cohort().empty() ? "-" : limit(q.borrowing_limit()),
                    absl::StrFormat("%g", q.weight()), q.preemption() ? "yes" : "no",
                    absl::StrCat(q.used().slots(), " slots, ", q.used().gpus(), " gpus"),
                    absl::StrCat(q.running_jobs()), absl::StrCat(q.pending_jobs())});
  }
  PrintTable(rows);
  std::vector<std::string> classes;
  for (const auto& [name, value] : resp.priority_classes()) {
    classes.push_back(absl::StrCat(name, "=", value));
  }
  std::sort(classes.begin(), classes.end());
  std::cout << "priority classes: " << (classes.empty() ? "none" : absl::StrJoin(classes, " "))
            << "; fair-share half-life " << resp.fair_share_half_life_seconds()
            << " s; preemption grace " << resp.preemption_grace_seconds()
            << " s, minimum run " << resp.min_run_time_seconds() << " s" << std::endl;
  return 0;
}

namespace {

// A node's workers after an action, as `workers` shows them.
void PrintNode(const std::string& node,
               const google::protobuf::RepeatedPtrField<loom::v1::WorkerInfo>& workers) {
  for (const auto& w : workers) {
    std::cout << node << " (" << w.id() << "): "
              << (w.cordoned() ? absl::StrCat("cordoned, ", w.cordon_reason())
                               : std::string("takes ranks"))
              << "\n";
  }
}

// Reads "NODE [--reason TEXT] [<flag> DURATION]" into `node`, `reason` and
// `seconds` (whole seconds of a duration like 90s, 10m, 2h; left alone when
// the flag is absent). `flag` empty: no duration flag.
int ParseNodeArgs(const std::string& cmd, const std::vector<std::string>& args,
                  const std::string& flag, std::string* node, std::string* reason,
                  int64_t* seconds) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--reason" && i + 1 < args.size()) {
      *reason = args[++i];
    } else if (!flag.empty() && args[i] == flag && i + 1 < args.size()) {
      absl::Duration d;
      if (!absl::ParseDuration(args[++i], &d) || d <= absl::ZeroDuration()) {
        return Usage(
            absl::StrCat(cmd, ": ", flag, " takes a duration like 90s, 10m or 2h, got ", args[i]));
      }
      *seconds = absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1)));
    } else if (node->empty() && !args[i].empty() && args[i][0] != '-') {
      *node = args[i];
    } else {
      return Usage(absl::StrCat(cmd, ": unexpected ", args[i]));
    }
  }
  if (node->empty()) return Usage(cmd + ": expected NODE");
  return 0;
}

// Calls the node action `method`; prints its reply for -o json. Returns the
// exit code, or -1 when the caller is to print the reply as text.
template <typename Method, typename Req, typename Resp>
int CallNodeAction(const Globals& g, Method method, const Req& req, Resp* resp) {
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  if (absl::Status s = (*client)->Call(method, req, resp); !s.ok()) return Fail(s);
  if (!g.json) return -1;
  std::cout << ToJson(*resp) << std::endl;
  return 0;
}

}  // namespace

int CmdCordon(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::CordonNodeRequest req;
  int64_t seconds = 0;
  std::string node, reason;
  if (int rc = ParseNodeArgs("cordon", args, "--for", &node, &reason, &seconds); rc != 0) {
    return rc;
  }
  req.set_node(node);
  req.set_reason(reason);
  req.set_seconds(seconds);
  loom::v1::CordonNodeResponse resp;
  int rc = CallNodeAction(g, &loom::v1::JobService::Stub::CordonNode, req, &resp);
  if (rc >= 0) return rc;
  PrintNode(node, resp.workers());
  return 0;
}

int CmdUncordon(const Globals& g, const std::vector<std::string>& args) {
  int64_t unused = 0;
  std::string node, reason;
  if (int rc = ParseNodeArgs("uncordon", args, "", &node, &reason, &unused); rc != 0) return rc;
  if (!reason.empty()) return Usage("uncordon: takes no --reason");
  loom::v1::UncordonNodeRequest req;
  req.set_node(node);
  loom::v1::CordonNodeResponse resp;
  int rc = CallNodeAction(g, &loom::v1::JobService::Stub::UncordonNode, req, &resp);
  if (rc >= 0) return rc;
  PrintNode(node, resp.workers());
  return 0;
}

int CmdDrain(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::DrainNodeRequest req;
  int64_t seconds = 0;
  std::string node, reason;
  if (int rc = ParseNodeArgs("drain", args, "--deadline", &node, &reason, &seconds); rc != 0) {
    return rc;
  }
  req.set_node(node);
  req.set_reason(reason);
  req.set_deadline_seconds(seconds);
  loom::v1::DrainNodeResponse resp;
  int rc = CallNodeAction(g, &loom::v1::JobService::Stub::DrainNode, req, &resp);
  if (rc >= 0) return rc;
  PrintNode(node, resp.workers());
  if (resp.moving_job_ids().empty()) {
    std::cout << "no job had ranks there\n";
  } else {
    std::cout << "saving and moving: " << absl::StrJoin(resp.moving_job_ids(), " ")
              << " (`loomctl events JOB` shows each one's DRAINED event)\n";
  }
  std::cout << std::flush;
  return 0;
}

}  // namespace loom::cli
