// `loomctl report JOB --out FILE`: the job, its step metrics and
// checkpoints as one HTML page (cli/report.h) (cli/commands/commands.h).
#include <iostream>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/report.h"
#include "common/file_util.h"

namespace loom::cli {

// `loomctl report JOB --out FILE`: the job as one self-contained HTML page
// (cli/report.h).
int CmdReport(const Globals& g, const std::vector<std::string>& args) {
  std::string job, out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (!args[i].empty() && args[i][0] == '-') {
      return Usage("report: unknown flag " + args[i]);
    } else if (job.empty()) {
      job = args[i];
    } else {
      return Usage("report: one job at a time");
    }
  }
  if (job.empty() || out.empty()) return Usage("report: expected JOB --out FILE");
  absl::StatusOr<loom::v1::Job> got = FetchJob(g, job);
  if (!got.ok()) return Fail(got.status());
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::GetStepMetricsRequest steps_req;
  steps_req.set_job_id(job);
  loom::v1::GetStepMetricsResponse steps;
  if (absl::Status s =
          (*client)->Call(&loom::v1::JobService::Stub::GetStepMetrics, steps_req, &steps);
      !s.ok()) {
    return Fail(s);
  }
  loom::v1::ListCheckpointsRequest ckpt_req;
  ckpt_req.set_job_id(job);
  loom::v1::ListCheckpointsResponse ckpts;
  if (absl::Status s =
          (*client)->Call(&loom::v1::JobService::Stub::ListCheckpoints, ckpt_req, &ckpts);
      !s.ok()) {
    return Fail(s);
  }
  const std::string html = RenderJobReport(
      *got, std::vector<loom::v1::StepMetrics>(steps.steps().begin(), steps.steps().end()),
      std::vector<loom::v1::CheckpointInfo>(ckpts.checkpoints().begin(), ckpts.checkpoints().end()));
  if (absl::Status s = WriteFileAtomically(out, html); !s.ok()) return Fail(s);
  std::cout << "wrote " << out << " (" << html.size() / 1024 << " KiB, " << steps.steps_size()
            << " step reports, " << got->events_size() << " events, " << ckpts.checkpoints_size()
            << " checkpoints); open it in a browser, it needs no network" << std::endl;
  return 0;
}

}  // namespace loom::cli
