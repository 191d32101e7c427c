// `loomctl workers`: the controller's registered workers
// (cli/commands/commands.h).
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NODE", "ZONE", "RACK", "ALIVE", "SLOTS", "CPUS", "GPUS", "MEMORY", "GEMM/THREAD",
       "HEARTBEAT", "METRICS"}};
  for (const auto& w : resp.workers()) {
    rows.push_back({w.id(), w.node(), w.zone().empty() ? "-" : w.zone(),
                    w.rack().empty() ? "-" : w.rack(), w.alive() ? "yes" : "no",
                    absl::StrCat(w.slots_used(), "/", w.slots()), absl::StrCat(w.cpus()),
                    absl::StrCat(w.gpus()), absl::StrFormat("%.1f GiB", w.memory_bytes() / 1073741824.0),
                    w.gemm_flops_per_second_per_thread() > 0
                        ? absl::StrFormat("%.1f GFLOP/s", w.gemm_flops_per_second_per_thread() / 1e9)
                        : "-",
                    Ago(w.last_heartbeat_unix_ms()) + " ago", w.metrics_address()});
  }
  PrintTable(rows);
  return 0;
}

}  // namespace loom::cli
