// `loomctl sample` and `loomctl export`: what a job's trained model does,
// run by loom-ckpt (built beside loomctl) on a committed checkpoint that
// the controller names (cli/commands/commands.h). On success these do not
// return: loomctl is replaced by loom-ckpt.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "common/status_macros.h"

namespace loom::cli {
namespace {

// A job's committed checkpoint (step S, or the newest when S < 0) and its
// data directory (where `data prepare` put the tokenizer), from the
// controller.
struct JobCheckpoint {
  int64_t step = 0;
  std::string path;
  std::string data_dir;
};
absl::StatusOr<JobCheckpoint> ResolveCheckpoint(const Globals& g, const std::string& job,
                                                int64_t step) {
  absl::StatusOr<loom::v1::Job> got = FetchJob(g, job);
  if (!got.ok()) return got.status();
  if (got->spec().data().train_size() == 0) {
    return absl::FailedPreconditionError("the job's spec names no training data");
  }
  JobCheckpoint out;
  out.data_dir = std::filesystem::path(got->spec().data().train(0)).parent_path().string();
  auto client = Client::Connect(g);
  if (!client.ok()) return client.status();
  loom::v1::ListCheckpointsRequest list;
  list.set_job_id(job);
  loom::v1::ListCheckpointsResponse listed;
  RETURN_IF_ERROR((*client)->Call(&loom::v1::JobService::Stub::ListCheckpoints, list, &listed));
  const loom::v1::CheckpointInfo* chosen = nullptr;
  std::vector<std::string> committed;
  for (const auto& c : listed.checkpoints()) {
    if (c.status() != "committed") continue;
    committed.push_back(absl::StrCat(c.step()));
    if (step >= 0 ? c.step() == step : (chosen == nullptr || c.step() > chosen->step())) {
      chosen = &c;
    }
  }
  if (chosen == nullptr) {
    return absl::NotFoundError(
        committed.empty()
            ? absl::StrCat("job ", job, " has no committed checkpoint yet")
            : absl::StrCat("job ", job, " has no committed checkpoint at step ", step,
                           "; committed: ", absl::StrJoin(committed, ", ")));
  }
  out.step = chosen->step();
  out.path = chosen->path();
  return out;
}

// Replaces loomctl with loom-ckpt (built beside it) running `args`.
int ExecCheckpointTool(std::vector<std::string> args) {
  args.insert(args.begin(), SelfDir() + "/loom-ckpt");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  return Fail(absl::FailedPreconditionError(absl::StrCat(
      "cannot run ", argv[0], ": ", strerror(errno), " (loom-ckpt is built beside loomctl)")));
}

}  // namespace

// `loomctl sample JOB [--step S] --prompt TEXT [--tokens N] [--temperature T]
// [--top-k K] [--seed X]`: runs `loom-ckpt sample` on the job's newest
// committed checkpoint (or step S) with its data's tokenizer. The
// checkpoint and data must be readable here: a local cluster, or a worker
// pod.
int CmdSample(const Globals& g, const std::vector<std::string>& args) {
  std::string job;
  int64_t step = -1;
  std::vector<std::string> pass;  // flags for loom-ckpt sample
  bool have_prompt = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--step" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &step) || step < 0) return Usage("--step: a step >= 0");
    } else if ((a == "--prompt" || a == "--tokens" || a == "--temperature" || a == "--top-k" ||
                a == "--seed") &&
               i + 1 < args.size()) {
      have_prompt = have_prompt || a == "--prompt";
      pass.push_back(a);
      pass.push_back(args[++i]);
    } else if (!a.empty() && a[0] == '-') {
      return Usage("sample: unknown flag " + a);
    } else if (job.empty()) {
      job = a;
    } else {
      return Usage("sample: one job at a time");
    }
  }
  if (job.empty() || !have_prompt) return Usage("sample: expected JOB --prompt TEXT");
  absl::StatusOr<JobCheckpoint> c = ResolveCheckpoint(g, job, step);
  if (!c.ok()) return Fail(c.status());
  std::cerr << "sampling " << job << " at step " << c->step << " (" << c->path << ")" << std::endl;
  std::vector<std::string> tool = {"sample", c->path, "--tokenizer", c->data_dir};
  tool.insert(tool.end(), pass.begin(), pass.end());
  return ExecCheckpointTool(tool);
}

// `loomctl export JOB [--step S] --out DIR`: the job's newest committed
// checkpoint (or step S) in Hugging Face's layout, by `loom-ckpt export`.
int CmdExport(const Globals& g, const std::vector<std::string>& args) {
  std::string job, out;
  int64_t step = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--step" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &step) || step < 0) return Usage("--step: a step >= 0");
    } else if (a == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (!a.empty() && a[0] == '-') {
      return Usage("export: unknown flag " + a);
    } else if (job.empty()) {
      job = a;
    } else {
      return Usage("export: one job at a time");
    }
  }
  if (job.empty() || out.empty()) return Usage("export: expected JOB --out DIR");
  absl::StatusOr<JobCheckpoint> c = ResolveCheckpoint(g, job, step);
  if (!c.ok()) return Fail(c.status());
  return ExecCheckpointTool({"export", c->path, "--tokenizer", c->data_dir, "--out", out});
}

}  // namespace loom::cli
