// parallel: the largest GPT that trains under a fixed per-rank memory limit
// on 4 ranks, with pure data parallelism and with the best layout the
// planner finds (./bench/run.sh parallel).
//
// Starts a real local Loom (controller + 2 workers of 2 slots, each worker
// lending 2 x LIMIT, so LIMIT per rank), prepares byte-level text, and for a
// family of GPTs (n_layer 8, d_model a multiple of 64, n_head = d_model / 64,
// seq_len 64, vocabulary 256) finds the widest model that trains
//   * with `parallelism: {data: 4}` (every rank holds the whole model), and
//   * with `parallelism: {auto: true}` (tensor, pipeline, ZeRO: the
//     controller's plan among what the engine executes, placed by the
//     scheduler).
// `loomctl -o json plan` gives an upper bound on the width (it searches
// every layout, executed or not); from there the bench submits narrower
// and narrower specs (the controller refuses those no executable layout
// fits) and trains the first it accepts for a few steps, sampling
// the peak resident memory (VmHWM) of every loom-rank process. A model
// counts as training under the limit only if its job SUCCEEDED and no rank's
// peak RSS (LibTorch, buffers and all) exceeded LIMIT; otherwise the next
// narrower model is tried. Last line:
//   parallel: <layout> trains <N2> params vs <N1> with DP under <limit> ratio=<N2/N1>
//
// Usage: loom_parallel_bench BIN_DIR [limit_gib=2] [steps=3]
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loom/v1/service.pb.h"
#include "tests/test_util.h"

namespace {

using loom::testing::RunCommand;

constexpr int kLayers = 8;
constexpr int kSeqLen = 64;
constexpr int kVocab = 256;
constexpr int kHeadDim = 64;

int Die(const std::string& msg) {
  std::cerr << "parallel bench: " << msg << std::endl;
  return 1;
}

// Parameters of the GPT (gpt.h): per block 12 d^2 + 13 d, embeddings
// (tied) V d + s d, final LayerNorm 2 d.
int64_t Parameters(int64_t d) {
  return kLayers * (12 * d * d + 13 * d) + kVocab * d + kSeqLen * d + 2 * d;
}

std::string Spec(const std::string& name, int d, const std::string& parallelism, int steps) {
  return absl::StrCat("name: ", name, "\nmodel:\n  gpt: {n_layer: ", kLayers,
                      ", n_head: ", d / kHeadDim, ", d_model: ", d, ", seq_len: ", kSeqLen,
                      ", vocab_size: ", kVocab, R"(}
data: {train: ["data/train_*.bin"]}
optimizer:
  adamw: {lr: 0.0003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: )", steps, R"(, warmup_steps: 1}
batch: {global_batch: 8, micro_batch: 1}
resources: {workers: 2, ranks: 4}
parallelism: )", parallelism, R"(
recovery: {disable_spike_detection: true}
seed: 5
)");
}

// The peak RSS (VmHWM, bytes) of every loom-rank process alive now, by pid.
std::map<int, int64_t> RankPeaks() {
  std::map<int, int64_t> peaks;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return peaks;
  while (dirent* entry = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::ifstream cmdline(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string argv0;
    std::getline(cmdline, argv0, '\0');
    if (!absl::EndsWith(argv0, "/loom-rank")) continue;
    std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
    std::string line;
    while (std::getline(status, line)) {
      if (!absl::StartsWith(line, "VmHWM:")) continue;
      std::istringstream fields(line.substr(6));
      int64_t kib = 0;
      fields >> kib;
      peaks[pid] = kib * 1024;
    }
  }
  closedir(proc);
  return peaks;
}

struct Trained {
  bool submitted = false;  // false: refused at submit (nothing ran)
  std::string layout;      // the job's plan, as `loomctl status` prints it
  bool succeeded = false;
  int64_t peak_rss = 0;  // the largest rank's, bytes
  int ranks_seen = 0;
  double seconds = 0;
};

// Submits `spec` and follows it to the end, sampling every rank's peak RSS.
Trained Train(const std::string& ctl, const std::string& spec_path, const std::string& name) {
  std::atomic<bool> done{false};
  std::map<int, int64_t> peaks;
  std::thread sampler([&] {
    while (!done.load()) {
      for (const auto& [pid, bytes] : RankPeaks()) peaks[pid] = std::max(peaks[pid], bytes);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  auto run = RunCommand(ctl + "submit --follow " + spec_path);
  done = true;
  sampler.join();
  Trained t;
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  t.succeeded = run.exit_code == 0;
  if (!t.succeeded) std::cerr << name << ": " << run.out << run.err << std::endl;
  t.submitted = !absl::StrContains(run.err, "INVALID_ARGUMENT") &&
                !absl::StrContains(run.err, "UNIMPLEMENTED");
  for (const auto& [pid, bytes] : peaks) t.peak_rss = std::max(t.peak_rss, bytes);
  t.ranks_seen = static_cast<int>(peaks.size());
  // The layout the controller planned and ran: the row after "chosen
  // (parallelism.auto)" or "evaluated (spec)" in `loomctl status`.
  // `submit` prints "submitted <job id>" first.
  std::string id = name + "-1";
  const size_t at = run.out.find("submitted ");
  if (at != std::string::npos) {
    const size_t end = run.out.find_first_of(" \n", at + 10);
    id = run.out.substr(at + 10, end == std::string::npos ? std::string::npos : end - at - 10);
  }
  auto status = RunCommand(ctl + "status " + id);
  std::istringstream lines(status.out);
  std::string line;
  while (std::getline(lines, line)) {
    if (!absl::StrContains(line, "chosen (parallelism.auto)") &&
        !absl::StrContains(line, "evaluated (spec)")) {
      continue;
    }
    if (std::getline(lines, line)) {
      t.layout = std::string(absl::StripAsciiWhitespace(line.substr(0, std::min<size_t>(line.size(), 64))));
    }
    break;
  }
  return t;
}

// `loomctl plan`'s verdict on `spec`: for a pinned layout, whether it fits;
// for auto, whether any layout fits (among all the planner knows, executed
// or not: an upper bound for the search).
bool Fits(const std::string& ctl, const std::string& spec_path, bool automatic) {
  auto plan = RunCommand(ctl + "-o json plan " + spec_path);
  if (plan.exit_code != 0) return false;
  loom::v1::PlanResponse planned;
  if (!google::protobuf::util::JsonStringToMessage(plan.out, &planned).ok()) return false;
  const loom::v1::PlannedLayout& p = automatic ? planned.chosen() : planned.spec_layout();
  return p.fits();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Die("usage: loom_parallel_bench BIN_DIR [limit_gib] [steps]");
  const std::string bin = argv[1];
  const double limit_gib = argc > 2 ? std::atof(argv[2]) : 2.0;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  if (!(limit_gib > 0) || steps < 1) return Die("limit_gib must be > 0, steps >= 1");
  const int64_t limit = static_cast<int64_t>(limit_gib * (int64_t{1} << 30));
  const std::string home = loom::testing::MakeTempDir("loom_parallel_bench");
  const std::string ctl = absl::StrCat(bin, "/loomctl --home ", home, " ");
  auto up = RunCommand(ctl + absl::StrFormat("local up --workers 2 --slots 2 --memory %.4f",
                                             2 * limit_gib));
  if (up.exit_code != 0) return Die(up.err);
  const loom::testing::RunOnExit down(ctl + "local down");
  auto prep = RunCommand(ctl + "data prepare --input /usr/share/games/fortunes/fortunes "
                               "/usr/share/games/fortunes/literature --out " + home + "/data");
  if (prep.exit_code != 0) return Die(prep.err);

  struct Result {
    int d = 0;
    Trained trained;
    std::string planned;
  };
  // Widest d the planner accepts, then trained; narrower on a failure.
  auto largest = [&](const std::string& kind, const std::string& parallelism,
                     bool automatic) -> Result {
    int widest = 0;
    for (int d = kHeadDim; d <= 8192; d += kHeadDim) {
      const std::string path = absl::StrCat(home, "/", kind, "-plan.yaml");
      std::ofstream(path) << Spec(kind + "plan", d, parallelism, steps);
      if (!Fits(ctl, path, automatic)) break;
      widest = d;
    }
    // `loomctl plan` searches every layout; a job runs only what the engine
    // executes, so the controller may refuse a width the plan accepted:
    // refusals cost nothing and do not count as tries.
    for (int d = widest, tries = 0; d >= kHeadDim && tries < 3; d -= kHeadDim) {
      const std::string name = absl::StrCat(kind, d);
      const std::string path = absl::StrCat(home, "/", name, ".yaml");
      std::ofstream(path) << Spec(name, d, parallelism, steps);
      Result r{d, Train(ctl, path, name), ""};
      if (!r.trained.submitted) continue;
      ++tries;
      r.planned = r.trained.layout;
      std::printf("%-4s d_model %5d  %6.1fM params  ran [%s]  %s, peak RSS %.2f GiB of %.2f "
                  "(%d ranks sampled), %.0f s\n",
                  kind.c_str(), d, Parameters(d) / 1e6, r.planned.c_str(),
                  r.trained.succeeded ? "SUCCEEDED" : "FAILED",
                  r.trained.peak_rss / double(int64_t{1} << 30), limit_gib, r.trained.ranks_seen,
                  r.trained.seconds);
      std::fflush(stdout);
      if (r.trained.succeeded && r.trained.peak_rss <= limit && r.trained.ranks_seen == 4) {
        return r;
      }
    }
    return Result{};
  };

  const Result dp = largest("dp", "{data: 4}", false);
  if (dp.d == 0) return Die("no model trains under the limit with pure data parallelism");
  const Result best = largest("auto", "{auto: true}", true);
  if (best.d == 0) return Die("no model trains under the limit with the planner's layout");
  const double ratio = double(Parameters(best.d)) / Parameters(dp.d);
  std::printf("parallel: %s trains %.1fM params vs %.1fM with DP under %.3g GiB per rank "
              "ratio=%.2f\n",
              best.planned.c_str(), Parameters(best.d) / 1e6, Parameters(dp.d) / 1e6, limit_gib,
              ratio);
  return 0;
}
