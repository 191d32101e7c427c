// Mixed precision and activation checkpointing benchmark:
// training tokens/s and peak memory of one GPT in fp32, bf16
// and bf16 with activation checkpointing, side by side in one run.
//
// Configuration: GPT-2-style, d_model 512, 8 layers, 8 heads, seq 256,
// vocab 50304, batch 4 sequences (1024 tokens per step), dropout 0, AdamW
// (FusedAdamW, fp32 master weights and moments in every mode), `threads`
// LibTorch threads; checkpointing keeps every block's input only
// (activation_checkpointing 1, the placement that saves most memory here).
//
// Each configuration trains in its own child process (this binary run again
// with --child), through the real entry point loom::engine::Train on a shard
// of uniformly random tokens, so that one configuration's allocations cannot
// lower another's high-water mark. Per configuration:
//   tokens/s          tokens per step / the median StepMetrics step time over
//                     the steps after the first `warmup`;
//   peak tensor bytes the high-water mark of live LibTorch CPU storage over
//                     the whole run (CpuMemoryMeter: weights, gradients,
//                     AdamW moments, activations, loss buffers);
//   peak RSS          the child's ru_maxrss (wait4), which also holds the
//                     libraries and the allocator's retained pages.
//   activation memory one instrumented forward + backward after training
//                     (Gpt::Loss, then backward): tensor bytes held from
//                     forward to backward (live after the loss minus live
//                     before), and the peak of that step above its start.
// The configurations run one after another (fp32, bf16, bf16+ckpt), so load
// from other processes falls on them unevenly; the median step resists
// short disturbances only.
//
// Usage: loom_precision_bench [steps] [warmup] [threads] [d_model] [n_layer]
//                             [vocab] [batch]
//   defaults: 6 steps, 2 warm-up, 2 threads, 512, 8, 50304, 4.
//
// At batch 4 the training peak is set by what does not scale with the batch
// (weights, gradients and AdamW moments, 16 bytes per parameter, and the
// [vocab, d] gradient buffers of the tied embedding / LM head, live at the
// end of backward when the activations are already freed), so checkpointing
// shows in the activation bytes and RSS far more than in that peak; the
// summary line reports both.
//
// Output: a table, ratios against fp32, and last
//   precision: bf16 <x>x fp32 tok/s, bf16+ckpt activation mem <y>x fp32
//   (training peak: ...) ratio=<x>
#include <spawn.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/engine/cpu_memory_meter.h"
#include "common/formats/data.h"
#include "worker/engine/gpt.h"
#include "worker/engine/openmp_wait.h"
#include "worker/engine/trainer.h"

extern char** environ;

namespace {

using loom::engine::GptConfig;
using loom::engine::Precision;

struct BenchOptions {
  int steps = 6;
  int warmup = 2;
  int threads = 2;
  int d_model = 512;
  int n_layer = 8;
  int vocab = 50304;
  int batch = 4;
  int n_head = 8;
  int seq_len = 256;
};

struct Mode {
  const char* name;
  Precision precision;
  int activation_checkpointing;
};

constexpr Mode kModes[] = {
    {"fp32", Precision::kFp32, 0},
    {"bf16", Precision::kBf16, 0},
    {"bf16+ckpt", Precision::kBf16, 1},
};

loom::engine::TrainerConfig MakeConfig(const BenchOptions& o, const Mode& mode,
                                       const std::string& shard) {
  loom::engine::TrainerConfig c;
  c.model.n_layer = o.n_layer;
  c.model.n_head = o.n_head;
  c.model.d_model = o.d_model;
  c.model.seq_len = o.seq_len;
  c.model.vocab_size = o.vocab;
  c.model.dropout = 0;
  c.model.precision = mode.precision;
  c.model.activation_checkpointing = mode.activation_checkpointing;
  c.optimizer.lr = 3e-4;
  c.optimizer.grad_clip = 1.0;
  c.schedule.total_steps = o.warmup + o.steps;
  c.schedule.warmup_steps = 0;
  c.schedule.min_lr_ratio = 1.0;
  c.global_batch = o.batch;
  c.micro_batch = o.batch;
  c.seed = 7;
  c.eval_batches = 0;
  c.train_shards = {shard};
  return c;
}

// The child: trains one mode and prints one machine-readable line.
int RunChild(const BenchOptions& o, const Mode& mode, const std::string& shard) {
  loom::engine::CpuMemoryMeter& meter = loom::engine::CpuMemoryMeter::Install();
  torch::set_num_threads(o.threads);
  std::vector<loom::v1::StepMetrics> steps;
  loom::engine::TrainerCallbacks callbacks;
  callbacks.on_step = [&steps](const loom::v1::StepMetrics& r) { steps.push_back(r); };
  meter.ResetPeak();
  absl::StatusOr<loom::engine::TrainResult> result =
      loom::engine::Train(MakeConfig(o, mode, shard), nullptr, callbacks);
  if (!result.ok()) {
    std::cerr << mode.name << ": " << result.status() << std::endl;
    return 1;
  }
  std::vector<double> times;
  for (size_t i = o.warmup; i < steps.size(); ++i) times.push_back(steps[i].step_time_seconds());
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const double tokens_per_step = static_cast<double>(o.batch) * o.seq_len;
  const int64_t train_peak = meter.peak_bytes();

  // One instrumented forward + backward of the same model and batch shape
  // (Gpt::Loss, what Train runs between its compute timers): the tensor
  // bytes autograd holds from forward to backward (live after the loss
  // minus live before it; includes the fused loss's [V, d] and [N, d]
  // gradient buffers, the same in every mode) and the peak above the start.
  const loom::engine::TrainerConfig config = MakeConfig(o, mode, shard);
  torch::manual_seed(config.seed);
  loom::engine::Gpt model(config.model);
  const torch::Tensor idx = torch::randint(0, o.vocab, {o.batch, o.seq_len}, torch::kLong);
  const torch::Tensor targets = torch::randint(0, o.vocab, {o.batch, o.seq_len}, torch::kLong);
  const int64_t before = meter.current_bytes();
  meter.ResetPeak();
  torch::Tensor loss = model->Loss(idx, targets);
  const int64_t held = meter.current_bytes() - before;
  loss.backward();
  const int64_t step_peak = meter.peak_bytes() - before;
  absl::PrintF("PRECISION_CHILD tokens_per_second=%.3f peak_tensor_bytes=%d first_loss=%.5f "
               "last_loss=%.5f fastest_step_seconds=%.4f forward_held_bytes=%d "
               "fwd_bwd_peak_bytes=%d\n",
               tokens_per_step / median, train_peak, steps.front().loss(), steps.back().loss(),
               times.front(), held, step_peak);
  std::fflush(stdout);
  return 0;
}

struct ChildResult {
  double tokens_per_second = 0;
  double peak_tensor_bytes = 0;
  double peak_rss_bytes = 0;
  double first_loss = 0;
  double last_loss = 0;
  double forward_held_bytes = 0;
  double fwd_bwd_peak_bytes = 0;
};

double Field(const std::string& line, const std::string& key) {
  for (absl::string_view part : absl::StrSplit(line, ' ')) {
    if (absl::ConsumePrefix(&part, key + "=")) {
      double v = 0;
      if (absl::SimpleAtod(part, &v)) return v;
    }
  }
  return -1;
}

// Runs `self --child MODE ...`, returns its result line's fields and peak RSS.
bool SpawnChild(const char* self, const std::vector<std::string>& args, ChildResult* out) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return false;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(self));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, self, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    return false;
  }
  std::string output;
  char buffer[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof buffer)) > 0) output.append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::StartsWith(line, "PRECISION_CHILD ")) continue;
    const std::string l(line);
    out->tokens_per_second = Field(l, "tokens_per_second");
    out->peak_tensor_bytes = Field(l, "peak_tensor_bytes");
    out->first_loss = Field(l, "first_loss");
    out->last_loss = Field(l, "last_loss");
    out->forward_held_bytes = Field(l, "forward_held_bytes");
    out->fwd_bwd_peak_bytes = Field(l, "fwd_bwd_peak_bytes");
    out->peak_rss_bytes = static_cast<double>(usage.ru_maxrss) * 1024;  // KiB on Linux
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // As loom-rank runs the engine (openmp_wait.h); the children inherit the
  // environment, so every configuration runs with the same policy.
  (void)loom::engine::ReexecWithShortOpenMpSpin(argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string child_mode, shard;
  if (args.size() >= 3 && args[0] == "--child") {
    child_mode = args[1];
    shard = args[2];
    args.erase(args.begin(), args.begin() + 3);
  }
  BenchOptions o;
  int* slots[] = {&o.steps, &o.warmup, &o.threads, &o.d_model, &o.n_layer, &o.vocab, &o.batch};
  for (size_t i = 0; i < args.size() && i < std::size(slots); ++i) {
    if (!absl::SimpleAtoi(args[i], slots[i]) || *slots[i] < (i == 1 ? 0 : 1)) {
      std::cerr << "usage: loom_precision_bench [steps] [warmup] [threads] [d_model] [n_layer] "
                   "[vocab] [batch]"
                << std::endl;
      return 2;
    }
  }
  if (o.d_model % o.n_head != 0) o.n_head = 1;

  if (!child_mode.empty()) {
    for (const Mode& mode : kModes) {
      if (child_mode == mode.name) return RunChild(o, mode, shard);
    }
    std::cerr << "unknown mode " << child_mode << std::endl;
    return 2;
  }

  // Same as the worker does for its ranks (worker/worker_main.cc): OpenBLAS
  // does not know these CPUs and would fall back to generic kernels.
  if (getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx512f")) {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
  }
  char pattern[] = "/tmp/loom_precision_benchXXXXXX";
  if (mkdtemp(pattern) == nullptr) return 1;
  const std::string dir = pattern;
  const std::string shard_path = dir + "/train_000000.bin";
  {
    const int64_t tokens = int64_t{o.warmup + o.steps + 1} * o.batch * o.seq_len + 1;
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> token(0, o.vocab - 1);
    std::vector<uint16_t> data(tokens);
    for (uint16_t& t : data) t = static_cast<uint16_t>(token(rng));
    absl::Status written = loom::engine::WriteShard(shard_path, data);
    if (!written.ok()) {
      std::cerr << written << std::endl;
      return 1;
    }
  }
  GptConfig shape = MakeConfig(o, kModes[0], shard_path).model;
  absl::PrintF("GPT d_model %d, %d layers, %d heads, seq %d, vocab %d (%.1fM parameters), "
               "batch %d, %d threads, OPENBLAS_CORETYPE=%s; %d timed steps after %d warm-up\n",
               o.d_model, o.n_layer, o.n_head, o.seq_len, o.vocab,
               loom::engine::GptParameterCount(shape) / 1e6, o.batch, o.threads,
               getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(unset)", o.steps,
               o.warmup);

  std::vector<ChildResult> results;
  std::vector<std::string> passthrough;
  for (int* slot : slots) passthrough.push_back(std::to_string(*slot));
  const char* self = "/proc/self/exe";
  for (const Mode& mode : kModes) {
    std::vector<std::string> child_args = {"--child", mode.name, shard_path};
    child_args.insert(child_args.end(), passthrough.begin(), passthrough.end());
    ChildResult r;
    if (!SpawnChild(self, child_args, &r)) {
      std::cerr << "the " << mode.name << " run failed" << std::endl;
      std::filesystem::remove_all(dir);
      return 1;
    }
    absl::PrintF("%-10s %7.1f tok/s  training peak: tensors %7.1f MiB, RSS %7.1f MiB;  "
                 "one step: held fwd->bwd %6.1f MiB, peak %6.1f MiB;  loss %.4f -> %.4f\n",
                 mode.name, r.tokens_per_second, r.peak_tensor_bytes / (1 << 20),
                 r.peak_rss_bytes / (1 << 20), r.forward_held_bytes / (1 << 20),
                 r.fwd_bwd_peak_bytes / (1 << 20), r.first_loss, r.last_loss);
    std::fflush(stdout);
    results.push_back(r);
  }
  std::filesystem::remove_all(dir);

  const ChildResult& fp32 = results[0];
  for (size_t i = 1; i < results.size(); ++i) {
    absl::PrintF("%-10s vs fp32: tok/s %.2fx; training peak tensors %.2fx, RSS %.2fx; held "
                 "fwd->bwd %.2fx, step peak %.2fx\n",
                 kModes[i].name, results[i].tokens_per_second / fp32.tokens_per_second,
                 results[i].peak_tensor_bytes / fp32.peak_tensor_bytes,
                 results[i].peak_rss_bytes / fp32.peak_rss_bytes,
                 results[i].forward_held_bytes / fp32.forward_held_bytes,
                 results[i].fwd_bwd_peak_bytes / fp32.fwd_bwd_peak_bytes);
  }
  const ChildResult& bf16 = results[1];
  const ChildResult& ckpt = results[2];
  const double speed = bf16.tokens_per_second / fp32.tokens_per_second;
  absl::PrintF("precision: bf16 %.2fx fp32 tok/s, bf16+ckpt activation mem %.2fx fp32 "
               "(training peak: tensors %.2fx, RSS %.2fx) at %.2fx fp32 tok/s ratio=%.2f\n",
               speed, ckpt.forward_held_bytes / fp32.forward_held_bytes,
               ckpt.peak_tensor_bytes / fp32.peak_tensor_bytes,
               ckpt.peak_rss_bytes / fp32.peak_rss_bytes,
               ckpt.tokens_per_second / fp32.tokens_per_second, speed);
  return 0;
}
