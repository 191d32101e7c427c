// `loomctl checkpoints JOB [--verify]`: the controller's catalog of a job's
// checkpoints, verified on disk when asked; `loomctl checkpoints gc JOB
// --dry-run`: what retention would delete (cli/commands/commands.h).
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"

namespace loom::cli {

namespace {

// `loomctl checkpoints gc JOB --dry-run`: retention's verdicts, newest
// first per tier. Exit 0 (1 when the object store could not be listed).
int CmdCheckpointsGc(const Globals& g, const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  bool dry_run = false;
  for (const std::string& a : args) {
    if (a == "--dry-run") {
      dry_run = true;
    } else if (a.rfind("--", 0) == 0) {
      return Usage("checkpoints gc: unknown flag " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 1) return Usage("checkpoints gc: expected JOB --dry-run");
  if (!dry_run) {
    return Usage(
        "checkpoints gc: retention already runs after every save (rank 0 prunes the directory, "
        "the uploading worker the object store); pass --dry-run to see its verdicts");
  }
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::PlanCheckpointRetentionRequest req;
  req.set_job_id(positional[0]);
  loom::v1::PlanCheckpointRetentionResponse resp;
  auto ctx = (*client)->Context(absl::Minutes(2));
  absl::Status s =
      (*client)->Check((*client)->stub->PlanCheckpointRetention(ctx.get(), req, &resp));
  if (!s.ok()) return Fail(s);
  const int rc = resp.remote_error().empty() ? 0 : 1;
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return rc;
  }
  std::vector<std::vector<std::string>> rows = {
      {"STEP", "TIER", "ATTEMPT", "VAL LOSS", "VERDICT", "WHY"}};
  int going = 0;
  for (const loom::v1::RetentionVerdict& v : resp.verdicts()) {
    going += v.keep() ? 0 : 1;
    rows.push_back({absl::StrCat(v.step()), v.tier(), absl::StrCat(v.generation()),
                    v.has_val_loss() ? absl::StrFormat("%.4f", v.val_loss()) : "-",
                    v.keep() ? "keep" : "delete", v.reason()});
  }
  PrintTable(rows);
  std::cout << "retention: local " << resp.local_policy();
  if (!resp.remote_policy().empty()) std::cout << "; remote " << resp.remote_policy();
  std::cout << "\n";
  for (const std::string& p : resp.protections()) std::cout << "always kept: " << p << "\n";
  if (!resp.remote_error().empty()) {
    std::cout << "object store not listed: " << resp.remote_error() << "\n";
  }
  std::cout << "dry run: " << going << " of " << resp.verdicts_size()
            << " checkpoint copies would be deleted; nothing was" << std::endl;
  return rc;
}

}  // namespace

// `loomctl checkpoints JOB [--verify]`. Exit 0; with --verify, 1 when a
// checkpoint on disk failed its checks (so scripts can act on it).
int CmdCheckpoints(const Globals& g, const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "gc") {
    return CmdCheckpointsGc(g, std::vector<std::string>(args.begin() + 1, args.end()));
  }
  std::vector<std::string> positional;
  bool verify = false;
  for (const std::string& a : args) {
    if (a == "--verify") {
      verify = true;
    } else if (a.rfind("--", 0) == 0) {
      return Usage("checkpoints: unknown flag " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 1) return Usage("checkpoints: expected JOB [--verify]");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::ListCheckpointsRequest req;
  req.set_job_id(positional[0]);
  req.set_verify(verify);
  loom::v1::ListCheckpointsResponse resp;
  // Verifying reads every byte of every checkpoint: allow it time.
  auto ctx = (*client)->Context(verify ? absl::Minutes(30) : absl::Seconds(10));
  absl::Status s = (*client)->Check((*client)->stub->ListCheckpoints(ctx.get(), req, &resp));
  if (!s.ok()) return Fail(s);
  int corrupt = 0;
  for (const auto& c : resp.checkpoints()) corrupt += c.status() == "corrupt" ? 1 : 0;
  const int rc = verify && corrupt > 0 ? 1 : 0;
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return rc;
  }
  std::vector<std::vector<std::string>> rows = {
      {"STEP", "ATTEMPT", "TIME", "SIZE", "WRITE S", "STALL S", "STATUS", "TIER", "PATH"}};
  bool any_remote = false;
  for (const auto& c : resp.checkpoints()) {
    // Where it can be restored from: its directory ("local", when the
    // status says it is there) and the object store ("remote").
    const bool local = c.status() == "committed";
    const bool remote = !c.remote_url().empty() && c.status() != "corrupt";
    any_remote = any_remote || !c.remote_url().empty();
    const std::string tier = local && remote ? "local+remote"
                             : local         ? "local"
                             : remote        ? "remote"
                                             : "-";
    rows.push_back({absl::StrCat(c.step()), absl::StrCat(c.generation()),
                    absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(c.time_unix_ms()),
                                     absl::LocalTimeZone()),
                    absl::StrFormat("%.1f MB", c.bytes() / 1e6),
                    c.write_seconds() > 0 ? absl::StrFormat("%.3f", c.write_seconds()) : "-",
                    c.stall_seconds() > 0 ? absl::StrFormat("%.3f", c.stall_seconds()) : "-",
                    c.status(), tier, c.path()});
  }
  PrintTable(rows);
  if (any_remote) {
    for (const auto& c : resp.checkpoints()) {
      if (c.remote_url().empty()) continue;
      std::cout << "step " << c.step() << ": remote copy " << c.remote_url()
                << absl::StrFormat(" (uploaded in %.1f s)", c.upload_seconds()) << "\n";
    }
  }
  for (const auto& c : resp.checkpoints()) {
    if (!c.pruned_reason().empty()) {
      std::cout << "step " << c.step() << ": pruned by retention: " << c.pruned_reason() << "\n";
    }
    if (!c.remote_pruned_reason().empty()) {
      std::cout << "step " << c.step()
                << ": remote copy pruned by retention: " << c.remote_pruned_reason() << "\n";
    }
  }
  for (const auto& c : resp.checkpoints()) {
    if (c.status() != "corrupt") continue;
    std::cout << "step " << c.step() << ": " << c.corrupt_file() << " failed its "
              << c.failed_check() << " check: " << c.error() << "\n";
  }
  if (verify) {
    std::cout << "verified: " << corrupt << " of " << resp.checkpoints_size()
              << " catalogued checkpoint(s) corrupt" << std::endl;
  }
  return rc;
}

}  // namespace loom::cli
