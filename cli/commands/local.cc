// `loomctl local up|down|restart|status`: a cluster of local processes
// under --home (cli/local_cluster.h) (cli/commands/commands.h).
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <system_error>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/local_cluster.h"
#include "common/json_writer.h"

namespace loom::cli {

int CmdLocal(const Globals& g, const std::vector<std::string>& args) {
  if (args.empty()) return Usage("local: expected up, down, restart or status");
  const std::string& sub = args[0];
  if (sub == "up") {
    LocalClusterOptions o;
    o.home = g.home;
    o.bin_dir = SelfDir();
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--workers" && i + 1 < args.size()) {
        if (!absl::SimpleAtoi(args[++i], &o.workers)) return Usage("--workers: not a number");
      } else if (args[i] == "--slots" && i + 1 < args.size()) {
        if (!absl::SimpleAtoi(args[++i], &o.slots_per_worker)) return Usage("--slots: not a number");
      } else if (args[i] == "--memory" && i + 1 < args.size()) {
        double gib = 0;
        if (!absl::SimpleAtod(args[++i], &gib) || !(gib > 0)) {
          return Usage("--memory: GiB per worker, > 0");
        }
        o.memory_bytes_per_worker = static_cast<uint64_t>(gib * (uint64_t{1} << 30));
      } else if (args[i] == "--gpus" && i + 1 < args.size()) {
        o.gpus_per_worker = args[++i];
        int count = 0;
        if (o.gpus_per_worker != "auto" &&
            (!absl::SimpleAtoi(o.gpus_per_worker, &count) || count < 0)) {
          return Usage("--gpus: a count or auto");
        }
      } else if (args[i] == "--worker-timeout" && i + 1 < args.size()) {
        if (!absl::SimpleAtod(args[++i], &o.worker_timeout_s)) {
          return Usage("--worker-timeout: not a number");
        }
      } else if (args[i] == "--queues" && i + 1 < args.size()) {
        std::error_code ec;
        o.queues_file = std::filesystem::absolute(args[++i], ec).string();
      } else if (args[i] == "--notice-url" && i + 1 < args.size()) {
        o.notice_url = args[++i];
        if (!absl::StartsWith(o.notice_url, "http://")) {
          return Usage("--notice-url: http://host[:port]/path, {node} for each worker's node");
        }
      } else if (args[i] == "--warm-ranks" && i + 1 < args.size()) {
        if (!absl::SimpleAtoi(args[++i], &o.warm_ranks) || o.warm_ranks < 0 || o.warm_ranks > 64) {
          return Usage("--warm-ranks: 0 to 64 per worker");
        }
      } else if (args[i] == "--ha") {
        o.ha = true;
      } else if (args[i] == "--store" && i + 1 < args.size()) {
        const std::string store = args[++i];
        if (store != "sqlite" && store != "postgres") return Usage("--store: sqlite or postgres");
        o.postgres = store == "postgres";
      } else if (args[i] == "--data-root" && i + 1 < args.size()) {
        std::error_code ec;
        o.data_roots.push_back(std::filesystem::absolute(args[++i], ec).string());
      } else {
        return Usage("local up: unexpected " + args[i]);
      }
    }
    auto daemons = LocalUp(o);
    if (!daemons.ok()) return Fail(daemons.status());
    // Wait until every worker has registered, so a submit right after runs.
    auto client = Client::Connect(g);
    if (!client.ok()) return Fail(client.status());
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    int alive = 0;
    while (absl::Now() < deadline) {
      loom::v1::ListWorkersResponse resp;
      auto ctx = (*client)->Context();
      alive = 0;
      if ((*client)->stub->ListWorkers(ctx.get(), {}, &resp).ok()) {
        for (const auto& w : resp.workers()) alive += w.alive() ? 1 : 0;
      }
      if (alive >= o.workers) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (alive < o.workers) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          alive, " of ", o.workers, " workers registered; see ", g.home, "/logs")));
    }
    for (const auto& d : *daemons) {
      std::cout << absl::StrFormat(
          "%-13s pid %-7d %s%s%s%s\n", d.name, d.pid,
          d.grpc_address.empty() ? "" : "grpc " + d.grpc_address + "  ",
          d.metrics_address.empty() ? "" : "metrics http://" + d.metrics_address + "/metrics",
          d.console_url.empty() ? "" : "  console " + d.console_url,
          d.role.empty() || d.role == "database" ? "" : "  " + d.role);
    }
    std::cout << "local cluster up: state in " << g.home << ", token in " << g.home << "/token"
              << std::endl;
    return 0;
  }
  if (sub == "restart") {
    // loomctl local restart controller|worker-<i> [--kill]
    if (args.size() < 2) {
      return Usage(
          "local restart: expected controller (controller-<i> with --ha), worker-<i> "
          "or postgres");
    }
    bool kill_first = false;
    for (size_t i = 2; i < args.size(); ++i) {
      if (args[i] == "--kill") {
        kill_first = true;
      } else {
        return Usage("local restart: unexpected " + args[i]);
      }
    }
    auto d = LocalRestart(g.home, args[1], kill_first);
    if (!d.ok()) return Fail(d.status());
    std::cout << absl::StrFormat(
        "%-13s pid %-7d %s%s\n", d->name, d->pid,
        d->grpc_address.empty() ? "" : "grpc " + d->grpc_address + "  ",
        d->metrics_address.empty() ? "" : "metrics http://" + d->metrics_address + "/metrics");
    std::cout << "restarted " << d->name << std::endl;
    return 0;
  }
  if (sub == "down") {
    absl::Status s = LocalDown(g.home);
    if (!s.ok()) return Fail(s);
    std::cout << "local cluster down" << std::endl;
    return 0;
  }
  if (sub == "status") {
    auto daemons = LocalStatus(g.home);
    if (daemons.empty()) {
      std::cout << "no local cluster under " << g.home << std::endl;
      return 1;
    }
    bool all = true;
    for (const auto& d : daemons) all &= d.alive;
    if (g.json) {
      // [{"name", "pid", "alive", "role", "grpc_address", "metrics_address",
      //   "console_url", "log"}]
      JsonWriter w;
      w.BeginArray();
      for (const DaemonInfo& d : daemons) {
        w.BeginObject();
        w.Field("name", d.name);
        w.Field("pid", d.pid);
        w.Field("alive", d.alive);
        w.Field("role", d.role);
        w.Field("grpc_address", d.grpc_address);
        w.Field("metrics_address", d.metrics_address);
        w.Field("console_url", d.console_url);
        w.Field("log", d.log_path);
        w.EndObject();
      }
      w.EndArray();
      std::cout << w.Finish();
      return all ? 0 : 1;
    }
    std::vector<std::vector<std::string>> rows = {
        {"DAEMON", "PID", "ALIVE", "ROLE", "GRPC", "METRICS", "CONSOLE"}};
    for (const auto& d : daemons) {
      rows.push_back({d.name, absl::StrCat(d.pid), d.alive ? "yes" : "no",
                      d.role.empty() ? "-" : d.role, d.grpc_address.empty() ? "-" : d.grpc_address,
                      d.metrics_address.empty() ? "-" : d.metrics_address,
                      d.console_url.empty() ? "-" : d.console_url});
    }
    PrintTable(rows);
    return all ? 0 : 1;
  }
  return Usage("local: unknown subcommand " + sub);
}

}  // namespace loom::cli
