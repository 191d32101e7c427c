// Loom Console in a real browser: a real local cluster (`loomctl local up`,
// two workers) filled with jobs through loomctl, then Debian's Chromium,
// driven by playwright-core (tests/console/flows.mjs), logs in and uses
// the pages: steps arriving live on a job page, the spike and the rollback
// of a job trained on poisoned data, log search, comparing three runs,
// markup in an event shown as text, a cancel confirmed and recorded, a
// reader refused; and screenshots of every page at 1280x800 and 390x844
// under $LOOM_CONSOLE_SHOTS (default <build>/console-shots). On the HA
// cluster, a job page followed across a kill of the leader.
//
// playwright-core comes from scripts/install-deploy-deps.sh (pinned in
// tests/console/package-lock.json); without it the test fails saying so.
#include <cstdlib>
#include <filesystem>
#include <regex>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tests/cluster_fixture.h"

namespace loom {
namespace {

std::string ConsoleTools() {
  if (const char* dir = std::getenv("LOOM_CONSOLE_TOOLS_DIR")) return dir;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/loom/console-tests";
}

TEST_F(ClusterTest, ConsolePagesWorkInChromium) {
  const std::string tools = ConsoleTools();
  ASSERT_TRUE(std::filesystem::exists(tools + "/node_modules/playwright-core/index.mjs"))
      << "no playwright-core under " << tools << ": run ./scripts/install-deploy-deps.sh";
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/chromium"))
      << "no /usr/bin/chromium: run ./scripts/install-deps.sh";
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, 10));
  auto reader =
      Ctl(absl::StrCat("users add rita --role reader --token-out ", home_, "/rita.token"));
  ASSERT_EQ(reader.exit_code, 0) << reader.err;

  // Every job trains the same model on the same data; batches [60, 64)
  // are poisoned, so a job that reaches step 61 spikes there.
  constexpr int kSeqLen = 32, kGlobalBatch = 16;
  constexpr uint64_t kSeed = 7;
  ASSERT_NO_FATAL_FAILURE(PoisonDataBatches(60, 64, kSeqLen, kGlobalBatch, kSeed));
  auto spec = [&](const std::string& name, int steps, const std::string& lr,
                  const std::string& extra) {
    std::string path = absl::StrCat(home_, "/", name, ".yaml");
    std::ofstream out(path);
    out << "name: " << name << R"(
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data: {train: ["data/train_*.bin"]}
optimizer:
  adamw: {lr: )"
        << lr << R"(, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )"
        << steps << R"(, warmup_steps: 5}
batch: {global_batch: 16, micro_batch: 8}
resources: {workers: 1, ranks: 1}
checkpoint: {interval_steps: 10, keep: 10}
seed: 7
)" << extra;
    return path;
  };
  // Three short runs to compare (they end before the poison), one by one
  // two at a time on the two workers.
  std::vector<std::string> compare;
  for (const char* lr : {"0.001", "0.003", "0.01"}) {
    compare.push_back(Submit(spec(absl::StrCat("lr-", std::string(lr).substr(2)), 40, lr, "")));
  }
  for (const std::string& job : compare) {
    ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 120))
        << Status(job).DebugString();
  }
  // A job cancelled with markup in its reason: the page must show it as
  // text.
  const std::string evil = Submit(spec("evil", 100000, "0.003", ""));
  auto cancelled =
      Ctl("cancel " + evil + " --reason " + ShellQuote("<img src=x onerror=alert(1)>"));
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.err;
  // The spiky job (long enough to still run while the page watches) and a
  // long one to cancel from its page.
  const std::string spiky = Submit(
      spec("spiky", 4000, "0.003", R"(recovery: {window: 32, min_history: 16, rollback_distance: 20,
           skip_before: 10, skip_after: 10, max_rollbacks: 2, max_restarts: 0}
)"));
  const std::string long_job = Submit(spec("long", 100000, "0.003", ""));
  ASSERT_TRUE(WaitFor([&] { return Status(spiky).state() == loom::v1::RUNNING; }, 60));

  auto ready = cli::ReadReadyFile(home_ + "/run/controller.json");
  ASSERT_TRUE(ready.ok()) << ready.status();
  ASSERT_FALSE(ready->console_url.empty());
  const char* shots_env = std::getenv("LOOM_CONSOLE_SHOTS");
  const std::string shots = shots_env ? shots_env : std::string(LOOM_BIN_DIR) + "/../console-shots";
  std::filesystem::create_directories(shots);
  const std::string jobs_json =
      absl::StrCat(R"({"spiky":")", spiky, R"(","long":")", long_job, R"(","evil":")", evil,
                   R"(","compare":[")", absl::StrJoin(compare, R"(",")"), R"("]})");
  const std::string reader_token =
      std::string(absl::StripAsciiWhitespace(*ReadFile(home_ + "/rita.token")));
  auto run = RunCommand(absl::StrCat(
      "LOOM_CONSOLE_TOOLS=", ShellQuote(tools),
      " LOOM_CONSOLE_URL=", ShellQuote(ready->console_url), " LOOM_TOKEN=", ShellQuote(token_),
      " LOOM_READER_TOKEN=", ShellQuote(reader_token), " LOOM_JOBS=", ShellQuote(jobs_json),
      " LOOM_SHOTS=", ShellQuote(shots), " timeout 480 node ", LOOM_SOURCE_DIR,
      "/tests/console/flows.mjs"));
  std::cout << run.out << run.err << std::endl;
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  for (const char* page : {"jobs", "job", "compare", "queues", "workers", "plan"}) {
    for (const char* size : {"1280x800", "390x844"}) {
      EXPECT_TRUE(std::filesystem::exists(absl::StrCat(shots, "/", page, "-", size, ".png")))
          << page << " " << size;
    }
  }
}

// The HA cluster (`local up --ha`): a job page open at the leader's console
// while the test kills the leader (kill -9) goes on at the new leader's by
// itself, with no missing step and no reload (tests/console/ha_flow.mjs).
TEST_F(ClusterTest, ConsolePageFollowsTheLeaderAcrossAKill) {
  const std::string tools = ConsoleTools();
  ASSERT_TRUE(std::filesystem::exists(tools + "/node_modules/playwright-core/index.mjs"))
      << "no playwright-core under " << tools << ": run ./scripts/install-deploy-deps.sh";
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/chromium"))
      << "no /usr/bin/chromium: run ./scripts/install-deps.sh";
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, /*worker_timeout_s=*/10, "--ha"));
  auto leader = cli::ReadReadyFile(home_ + "/run/controller-0.json");
  auto standby = cli::ReadReadyFile(home_ + "/run/controller-1.json");
  ASSERT_TRUE(leader.ok() && standby.ok());
  ASSERT_EQ(leader->role, "active");
  ASSERT_FALSE(leader->console_url.empty());
  ASSERT_FALSE(standby->console_url.empty());
  // Few enough steps that the chart's buckets are single steps (about
  // 1,200 px), each slow enough (a wider model) that the job is still
  // running well after the failover. The page submits it, once the browser
  // is up and logged in (the spec as loomctl validate writes it: defaults
  // applied, data paths absolute), so that a slow browser start cannot let
  // the job end before the kill.
  constexpr int kSteps = 600;
  const std::string spec = home_ + "/followed.yaml";
  std::ofstream(spec) << "name: followed\n"
                      << absl::StrFormat(R"(model:
  gpt: {n_layer: 4, n_head: 4, d_model: 160, seq_len: 128, vocab_size: 256}
data: {train: ["data/train_*.bin"]}
optimizer:
  adamw: {lr: 0.001, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: %d, warmup_steps: 5}
batch: {global_batch: 16, micro_batch: 8}
resources: {workers: 2, ranks: 2}
checkpoint: {interval_steps: 50, keep: 2}
seed: 7
recovery: {disable_spike_detection: true, max_restarts: 0}
)",
                                         kSteps);
  auto spec_json = Ctl("-o json validate " + spec);
  ASSERT_EQ(spec_json.exit_code, 0) << spec_json.err;
  const char* shots_env = std::getenv("LOOM_CONSOLE_SHOTS");
  const std::string shots = shots_env ? shots_env : std::string(LOOM_BIN_DIR) + "/../console-shots";
  std::filesystem::create_directories(shots);
  auto run = RunCommand(absl::StrCat(
      "LOOM_CONSOLE_TOOLS=", ShellQuote(tools),
      " LOOM_CONSOLE_URL=", ShellQuote(leader->console_url),
      " LOOM_PEER_URL=", ShellQuote(standby->console_url), " LOOM_TOKEN=", ShellQuote(token_),
      " LOOM_SPEC_JSON=", ShellQuote(spec_json.out), " LOOM_JOB_STEPS=", kSteps,
      " LOOM_LEADER_PID=", leader->pid, " LOOM_SHOTS=", ShellQuote(shots), " timeout 400 node ",
      LOOM_SOURCE_DIR, "/tests/console/ha_flow.mjs"));
  std::cout << run.out << run.err << std::endl;
  std::smatch submitted;
  ASSERT_TRUE(std::regex_search(run.out, submitted, std::regex("submitted (\\S+) through")))
      << run.out << run.err;
  const std::string job = submitted[1];
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err << Status(job).DebugString();
  // The job itself lost nothing either (loomctl follows the leader).
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.state(), loom::v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.restarts(), 0);
  EXPECT_EQ(done.summary().last_step(), kSteps);
}

}  // namespace
}  // namespace loom
