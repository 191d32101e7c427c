// recovery: time from spike detection to the first resumed training step.
//
// Starts a real local Loom (controller + 2 workers), poisons data batches
// [60, 64) of a real text corpus with random bytes, and trains a small GPT
// with automatic recovery. From the job's event stream it takes the time the
// controller declared the spike and the time of the first step of the
// rolled-back attempt, and reports that gap, also as a multiple of the median
// training step (the ratio is what is comparable across machines).
//
// Usage: loom_recovery_bench BIN_DIR
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/local_cluster.h"
#include "common/file_util.h"
#include "loom/v1/service.grpc.pb.h"
#include "tests/test_util.h"
#include "common/formats/data.h"

namespace {

int Die(const std::string& msg) {
  std::cerr << "recovery bench: " << msg << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Die("usage: loom_recovery_bench BIN_DIR");
  using loom::testing::RunCommand;
  const std::string bin = argv[1];
  const std::string home = loom::testing::MakeTempDir("loom_recovery_bench");
  const std::string ctl = absl::StrCat(bin, "/loomctl --home ", home, " ");
  auto up = RunCommand(ctl + "local up --workers 2");
  if (up.exit_code != 0) return Die(up.err);
  const loom::testing::RunOnExit down(ctl + "local down");

  auto prep = RunCommand(ctl + "data prepare --input /usr/share/games/fortunes/fortunes "
                               "/usr/share/games/fortunes/literature "
                               "/usr/share/games/fortunes/riddles --out " + home + "/data");
  if (prep.exit_code != 0) return Die(prep.err);
  constexpr int kSeqLen = 32, kGlobalBatch = 16;
  constexpr uint64_t kSeed = 7;
  std::string shard = home + "/data/train_000000.bin";
  auto tokens = loom::engine::ReadShard(shard);
  if (!tokens.ok()) return Die(tokens.status().ToString());
  auto dataset = loom::engine::TokenDataset::FromShards({*tokens}, kSeqLen);
  if (!dataset.ok()) return Die(dataset.status().ToString());
  std::mt19937 rng(99);
  for (int64_t d = 60; d < 64; ++d) {
    for (int j = 0; j < kGlobalBatch; ++j) {
      int64_t sample = dataset->SampleAt(kSeed, d * kGlobalBatch + j);
      for (int k = 0; k <= kSeqLen; ++k) (*tokens)[sample * kSeqLen + k] = rng() % 256;
    }
  }
  if (!loom::engine::WriteShard(shard, *tokens).ok()) return Die("cannot rewrite the shard");
  std::ofstream(home + "/spiky.yaml") << R"(name: spiky
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data: {train: ["data/train_*.bin"]}
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 120, warmup_steps: 5}
batch: {global_batch: 16, micro_batch: 8}
resources: {workers: 2, ranks: 2}
checkpoint: {interval_steps: 10, keep: 2}
seed: 7
recovery: {window: 32, min_history: 16, rollback_distance: 20, skip_before: 10,
           skip_after: 10, max_rollbacks: 2, max_restarts: 0}
)";
  auto submit = RunCommand(ctl + "submit " + home + "/spiky.yaml");
  if (submit.exit_code != 0) return Die(submit.err);
  std::string job = std::string(absl::StripAsciiWhitespace(submit.out)).substr(10);

  auto info = loom::cli::ReadReadyFile(home + "/run/controller.json");
  auto token = loom::ReadFile(home + "/token");
  if (!info.ok() || !token.ok()) return Die("no controller");
  auto stub = loom::v1::JobService::NewStub(
      *loom::cli::LocalControllerChannel(home, info->grpc_address));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization",
                  "Bearer " + std::string(absl::StripAsciiWhitespace(*token)));
  loom::v1::WatchJobRequest req;
  req.set_job_id(job);
  req.set_include_history(true);
  auto reader = stub->WatchJob(&ctx, req);
  loom::v1::JobEvent e;
  int64_t spike_ms = -1, resumed_ms = -1, spike_step = 0, resumed_step = 0, resume_target = 0;
  std::vector<double> step_seconds;
  loom::v1::Job last;
  while (reader->Read(&e)) {
    last = e.job();
    if (e.has_recovery() && e.recovery().kind() == loom::v1::RecoveryEvent::SPIKE && spike_ms < 0) {
      spike_ms = e.time_unix_ms();
      spike_step = e.recovery().step();
    }
    if (e.has_recovery() && e.recovery().kind() == loom::v1::RecoveryEvent::ROLLBACK) {
      resume_target = e.recovery().resume_step();
    }
    if (e.has_step() && e.step().step() > 0) {
      if (e.job().generation() == 0) step_seconds.push_back(e.step().step_time_seconds());
      if (e.job().generation() == 1 && resumed_ms < 0) {
        resumed_ms = e.time_unix_ms();
        resumed_step = e.step().step();
      }
    }
  }
  reader->Finish();
  // The job's recovery event log, as an operator sees it.
  std::cout << "event log (loomctl events " << job << "):" << std::endl;
  if (std::system((ctl + "events " + job).c_str()) != 0) std::cout << "  (loomctl events failed)\n";
  if (last.state() != loom::v1::SUCCEEDED) return Die("job ended " + last.reason());
  if (spike_ms < 0 || resumed_ms < 0) return Die("no spike/rollback observed");
  std::sort(step_seconds.begin(), step_seconds.end());
  double median_step = step_seconds[step_seconds.size() / 2];
  double recovery_s = (resumed_ms - spike_ms) / 1000.0;
  std::cout << absl::StrFormat(
                   "spike at step %d, rolled back to the checkpoint at step %d, first resumed "
                   "step %d\n"
                   "median training step %.4f s; %d steps of work redone\n",
                   spike_step, resume_target, resumed_step, median_step,
                   spike_step - resume_target)
            << absl::StrFormat("recovery: %.2f s from spike detection to the first resumed step "
                               "ratio=%.0f steps\n",
                               recovery_s, recovery_s / median_step);
  return 0;
}
