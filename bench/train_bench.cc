// Training throughput benchmark: Loom's engine on
// the benchmark configuration, to be compared side by side with PyTorch eager
// (bench/train_pytorch.py; bench/run.sh runs both and prints the ratio).
//
// Configuration: GPT-2-style, 4 layers, 4 heads, d_model 256, vocab 50304,
// seq 256, micro-batch = global batch = 8 sequences (2048 tokens per step),
// fp32, dropout 0, AdamW (lr 3e-4 held constant, betas 0.9/0.95, eps 1e-8,
// weight decay 0.1 on weight matrices and embeddings only), global-norm
// gradient clipping at 1.0, `threads` LibTorch threads.
//
// Training goes through the real entry point, loom::engine::Train, on a
// synthetic shard of uniformly random tokens written to a temporary
// directory: no validation, no checkpoints. Throughput is the median of
// StepMetrics::step_time_seconds over the steps after the first `warmup`
// (allocator and BLAS warm-up), as tokens per second.
//
// In the same process, and so on the same BLAS and threads:
//   sgemm: 2048x2048x2048 fp32 torch::mm, the best of 5 after one warm-up
//          (loom::telemetry::MeasureGemmFlopsPerSecond) before the first step
//          and after the last, and one after every step (SgemmSampler); the
//          best of all is the reference rate both sides are expressed
//          against (bench/run.sh takes the better of the two sides');
//   model FLOPs per token: loom::telemetry::ModelFlopsPerToken (6·N_matmul
//          plus attention, PaLM's MFU definition), so achieved FLOP/s =
//          tokens/s × FLOPs per token.
//
// Profile (profile_steps > 0): the same step, rebuilt from the engine's own
// pieces (Gpt::Hidden, FusedLinearCrossEntropy, FusedAdamW; what Train runs
// between its timers), is timed stage by stage over profile_steps steps, and
// profile_steps more run under the LibTorch profiler, the fastest of which is
// split by operator self time. The profile is informational; the headline
// figure comes from Train alone.
//
// Lockstep (TURN_IN_FIFO TURN_OUT_FIFO given): the PyTorch side runs at the
// same time and the two take turns, step by step; see Turns below.
//
// Usage: loom_train_bench [steps] [warmup] [threads] [profile_steps]
//                         [TURN_IN_FIFO TURN_OUT_FIFO]
//   defaults: 23 steps, 3 warm-up, 2 threads, 2 profile steps (0 = no
//   profile).
// Output: human-readable lines, then one machine-readable line
//   LOOM_TRAIN tokens_per_second=<x> flops_per_token=<x> sgemm_flops_per_second=<x> ...
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/cpu_gpt_config.h"
#include "common/formats/data.h"
#include "worker/engine/gpt.h"
#include "worker/engine/host_allocator.h"
#include "worker/engine/openmp_wait.h"
#include "worker/engine/ops/fused_adamw_torch.h"
#include "worker/engine/ops/fused_loss.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/trainer.h"
#include "worker/telemetry/gemm_calibration.h"
#include "worker/telemetry/telemetry.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kSgemmSize = 2048;
constexpr int kSgemmRepeats = 5;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One 2048^3 fp32 torch::mm per Sample() on tensors made once; keeps the
// best rate seen. Sampled after every training step (outside its timer), so
// the sgemm reference is the best of many moments spread over the run, not
// of two that other load on the cores may have hit.
class SgemmSampler {
 public:
  SgemmSampler()
      : a_(torch::rand({kSgemmSize, kSgemmSize})), b_(torch::rand({kSgemmSize, kSgemmSize})) {
    torch::NoGradGuard no_grad;
    c_ = torch::mm(a_, b_);  // warm-up
  }
  void Sample() {
    torch::NoGradGuard no_grad;
    const auto start = Clock::now();
    torch::mm_out(c_, a_, b_);
    const double s = Seconds(start, Clock::now());
    if (s > 0) best_ = std::max(best_, 2.0 * kSgemmSize * kSgemmSize * kSgemmSize / s);
  }
  double best() const { return best_; }

 private:
  torch::Tensor a_, b_, c_;
  double best_ = 0;
};

// Lockstep with the PyTorch side (bench/train_pytorch.py --turn-in/--turn-out).
// On a host whose cores other work shares, that load comes and goes; two
// sides run one after the other would each see different load, and their
// ratio would measure it. In lockstep the two processes take turns, one byte
// through a pair of FIFOs passing the turn: each side's timed work (a
// training step; the sgemm runs, glued to the first and last step; the
// profile) runs only while it holds the turn, so the other side is idle and
// both see the same background load, step by step. Both sides must take the
// same number of turns; this side takes the first.
class Turns {
 public:
  // Empty paths: no lockstep (Acquire and Release do nothing).
  Turns(const std::string& in_path, const std::string& out_path) {
    if (in_path.empty()) return;
    // O_RDWR: opening a FIFO this way does not wait for the other end, and
    // keeps a reader on `out`, so a write never raises SIGPIPE.
    in_ = open(in_path.c_str(), O_RDWR | O_CLOEXEC);
    out_ = open(out_path.c_str(), O_RDWR | O_CLOEXEC);
    if (in_ < 0 || out_ < 0) std::perror("open turn FIFO");
  }
  ~Turns() {
    if (in_ >= 0) close(in_);
    if (out_ >= 0) close(out_);
  }
  Turns(const Turns&) = delete;
  Turns& operator=(const Turns&) = delete;

  bool ok() const { return in_ >= 0 && out_ >= 0; }
  bool enabled() const { return in_ >= 0 || out_ >= 0; }

  // Waits (up to kTimeoutSeconds: the other side's turn is one step) for
  // the turn. False if it did not come.
  bool Acquire() {
    if (!enabled()) return true;
    pollfd fd{in_, POLLIN, 0};
    if (poll(&fd, 1, kTimeoutSeconds * 1000) != 1) return false;
    char byte;
    return read(in_, &byte, 1) == 1;
  }
  bool Release() {
    if (!enabled()) return true;
    const char byte = 't';
    return write(out_, &byte, 1) == 1;
  }

 private:
  static constexpr int kTimeoutSeconds = 600;
  int in_ = -1, out_ = -1;
};

// OpenBLAS's kernel set ("Haswell", "SkylakeX", ...), when the BLAS that
// LibTorch resolved is OpenBLAS. Its DYNAMIC_ARCH build picks kernels by
// CPU model and falls back to generic "Prescott" (SSE3) kernels on CPUs it
// does not know, whatever their vector units; OPENBLAS_CORETYPE overrides.
std::string BlasCoreName() {
  using CoreName = char* (*)();
  auto fn = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return fn != nullptr ? std::string("OpenBLAS ") + fn() : "not OpenBLAS";
}

// An event's start and duration in microseconds: LibTorch 1.13's KinetoEvent
// reports them in microseconds, 2.x's in nanoseconds only.
uint64_t StartUs(const torch::autograd::profiler::KinetoEvent& e) {
#if TORCH_VERSION_MAJOR >= 2
  return e.startNs() / 1000;
#else
  return e.startUs();
#endif
}
double DurationUs(const torch::autograd::profiler::KinetoEvent& e) {
#if TORCH_VERSION_MAJOR >= 2
  return static_cast<double>(e.durationNs()) / 1000.0;
#else
  return static_cast<double>(e.durationUs());
#endif
}

// Operator self time (total minus the time of nested operators) summed by
// operator name, over the events of a profiler result. Events are nested per
// thread by their [start, start + duration) intervals.
std::map<std::string, double> SelfSecondsByName(
    const std::vector<torch::autograd::profiler::KinetoEvent>& events) {
  std::map<uint64_t, std::vector<size_t>> by_thread;
  for (size_t i = 0; i < events.size(); ++i) {
    by_thread[events[i].startThreadId()].push_back(i);
  }
  std::map<std::string, double> self;
  for (auto& [thread, indices] : by_thread) {
    std::sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
      if (StartUs(events[a]) != StartUs(events[b])) {
        return StartUs(events[a]) < StartUs(events[b]);
      }
      return DurationUs(events[a]) > DurationUs(events[b]);
    });
    std::vector<double> child_us(events.size(), 0);
    std::vector<size_t> stack;
    for (size_t i : indices) {
      const uint64_t start = StartUs(events[i]);
      while (!stack.empty() &&
             StartUs(events[stack.back()]) + DurationUs(events[stack.back()]) <= start) {
        stack.pop_back();
      }
      if (!stack.empty()) child_us[stack.back()] += DurationUs(events[i]);
      stack.push_back(i);
    }
    for (size_t i : indices) {
      const double us = std::max(0.0, DurationUs(events[i]) - child_us[i]);
      self[events[i].name()] += us * 1e-6;
    }
  }
  return self;
}

// Coarse class of an ATen operator, for the profile summary (by name
// prefix; the first match wins).
std::string OpClass(const std::string& name) {
  static const std::vector<std::pair<std::string, std::string>> kClasses = {
      {"aten::addmm", "matmul"},
      {"aten::mm", "matmul"},
      {"aten::bmm", "matmul"},
      {"aten::_log_softmax", "LM loss: log_softmax + nll, fwd + bwd"},
      {"aten::nll_loss", "LM loss: log_softmax + nll, fwd + bwd"},
      {"aten::zero_", "zero-fill (zero_grad, grad buffers)"},
      {"aten::fill_", "zero-fill (zero_grad, grad buffers)"},
      {"aten::_softmax", "attention softmax, fwd + bwd"},
      {"aten::gelu", "gelu, fwd + bwd"},
      {"aten::native_layer_norm", "layer_norm, fwd + bwd"},
      {"aten::embedding", "embedding, fwd + bwd"},
      {"aten::copy_", "copy / dtype conversion"},
      {"aten::_to_copy", "copy / dtype conversion"},
      {"aten::clone", "copy / dtype conversion"},
      {"aten::sum", "reductions (sum)"},
  };
  static const std::vector<std::string> kElementwise = {
      "aten::add", "aten::mul", "aten::div", "aten::sqrt", "aten::addcdiv",
      "aten::addcmul", "aten::pow", "aten::lerp", "aten::sub", "aten::neg",
      "aten::masked_fill", "aten::maximum", "aten::where"};
  for (const auto& [prefix, cls] : kClasses) {
    if (name.rfind(prefix, 0) == 0) return cls;
  }
  for (const std::string& prefix : kElementwise) {
    if (name.rfind(prefix, 0) == 0) {
      return "elementwise (AdamW, clip, residuals, grad accumulation)";
    }
  }
  return "other (dispatch, views, autograd bookkeeping)";
}

// Times the engine's step stage by stage over `steps` steps, then runs
// `steps` more under the LibTorch profiler, one at a time, and splits the
// fastest of them by operator self time. On shared cores, other load makes
// some steps slower; the per-stage minimum and the fastest profiled step are
// the least disturbed, and are what this reports (the median too, for
// stages).
void Profile(const loom::engine::TrainerConfig& config, const torch::Tensor& inputs,
             const torch::Tensor& targets, int steps) {
  torch::manual_seed(config.seed);
  loom::engine::Gpt model(config.model);
  model->train();
  const std::vector<torch::Tensor> parameters = model->parameters();
  auto made = loom::engine::MakeFusedAdamW(
      *model, torch::optim::AdamWOptions(config.optimizer.lr)
                  .betas(std::make_tuple(config.optimizer.beta1, config.optimizer.beta2))
                  .eps(config.optimizer.eps)
                  .weight_decay(config.optimizer.weight_decay));
  if (!made.ok()) {
    std::fprintf(stderr, "profile: %s\n", made.status().ToString().c_str());
    return;
  }
  std::unique_ptr<loom::engine::FusedAdamW> optimizer = *std::move(made);
  loom::engine::AdamWStepOptions step_options;
  step_options.max_grad_norm = config.optimizer.grad_clip;

  // The body of Train's step (trainer.cc) for one micro-batch, with a clock
  // read between stages: gradients set to none; the blocks' forward; the
  // fused LM head + loss (whose forward also computes its own gradients);
  // backward through the blocks; the fused AdamW step (norm, clip, update).
  const std::vector<std::string> stages = {"zero_grad", "forward", "loss", "backward",
                                           "optimizer"};
  std::map<std::string, std::vector<double>> seconds;
  auto step = [&](bool record) {
    auto t0 = Clock::now();
    for (const torch::Tensor& p : parameters) {
      torch::Tensor p_mutable = p;
      p_mutable.mutable_grad() = torch::Tensor();
    }
    auto t1 = Clock::now();
    torch::Tensor hidden = model->Hidden(inputs);
    auto t2 = Clock::now();
    torch::Tensor loss = loom::engine::FusedLinearCrossEntropy(
        hidden, model->named_parameters()["wte.weight"], targets);
    auto t3 = Clock::now();
    loss.backward();
    (void)loss.item<double>();
    auto t4 = Clock::now();
    loom::engine::SetLearningRate(*optimizer, config.optimizer.lr);
    (void)optimizer->Step(step_options);
    auto t5 = Clock::now();
    if (!record) return;
    const Clock::time_point t[] = {t0, t1, t2, t3, t4, t5};
    for (size_t i = 0; i < stages.size(); ++i) {
      seconds[stages[i]].push_back(Seconds(t[i], t[i + 1]));
    }
  };
  step(false);  // warm-up: allocator, BLAS buffers
  for (int i = 0; i < steps; ++i) step(true);

  double total_min = 0, total_median = 0;
  for (const std::string& s : stages) {
    total_min += *std::min_element(seconds[s].begin(), seconds[s].end());
    total_median += Median(seconds[s]);
  }
  std::printf("loom profile, stages over %d steps: minimum (sum %.3f s) and median "
              "(sum %.3f s) per stage:\n", steps, total_min, total_median);
  for (const std::string& s : stages) {
    const double lo = *std::min_element(seconds[s].begin(), seconds[s].end());
    const double m = Median(seconds[s]);
    std::printf("  %-10s min %7.3f s %5.1f%%   median %7.3f s %5.1f%%\n", s.c_str(), lo,
                100 * lo / total_min, m, 100 * m / total_median);
  }

  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  const impl::ProfilerConfig profiler_config(impl::ProfilerState::KINETO);
  try {
    prof::prepareProfiler(profiler_config, {impl::ActivityType::CPU});
    double best_seconds = 0;
    std::unique_ptr<prof::ProfilerResult> best;
    for (int i = 0; i < steps; ++i) {
      prof::enableProfiler(profiler_config, {impl::ActivityType::CPU});
      const auto start = Clock::now();
      step(false);
      const double step_seconds = Seconds(start, Clock::now());
      std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
      if (!best || step_seconds < best_seconds) {
        best = std::move(result);
        best_seconds = step_seconds;
      }
    }
    std::map<std::string, double> self = SelfSecondsByName(best->events());
    double profiled = 0;
    std::map<std::string, double> by_class;
    std::vector<std::pair<double, std::string>> ops;
    for (const auto& [name, s] : self) {
      profiled += s;
      by_class[OpClass(name)] += s;
      ops.emplace_back(s, name);
    }
    std::sort(ops.rbegin(), ops.rend());
    std::printf("loom profile, operators (fastest of %d steps under the LibTorch profiler, "
                "%.3f s; self time, %.3f s attributed):\n",
                steps, best_seconds, profiled);
    std::vector<std::pair<double, std::string>> classes;
    for (const auto& [cls, s] : by_class) classes.emplace_back(s, cls);
    std::sort(classes.rbegin(), classes.rend());
    for (const auto& [s, cls] : classes) {
      std::printf("  class %-56s %7.3f s  %5.1f%%\n", cls.c_str(), s, 100 * s / profiled);
    }
    for (size_t i = 0; i < ops.size() && i < 15; ++i) {
      std::printf("  op    %-56s %7.3f s  %5.1f%%\n", ops[i].second.c_str(), ops[i].first,
                  100 * ops[i].first / profiled);
    }
  } catch (const c10::Error& e) {
    std::printf("loom profile, operators: LibTorch profiler unavailable: %s\n",
                e.what_without_backtrace());
  }
}

}  // namespace

int main(int argc, char** argv) {
  // As loom-rank runs the engine: OpenMP threads spin only briefly
  // (openmp_wait.h; same pid, so run.sh's wait and kill still apply). An
  // OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment is kept.
  const absl::Status openmp_wait = loom::engine::ReexecWithShortOpenMpSpin(argv);
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 23;
  const int64_t warmup = argc > 2 ? std::atoll(argv[2]) : 3;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const int profile_steps = argc > 4 ? std::atoi(argv[4]) : 2;
  if (steps <= warmup || warmup < 0 || threads < 1 || profile_steps < 0 || argc == 6 ||
      argc > 7) {
    std::fprintf(stderr, "usage: %s [steps > warmup] [warmup >= 0] [threads >= 1] "
                 "[profile_steps >= 0] [TURN_IN_FIFO TURN_OUT_FIFO]\n", argv[0]);
    return 2;
  }
  Turns turns(argc > 6 ? argv[5] : "", argc > 6 ? argv[6] : "");
  if (turns.enabled() && !turns.ok()) return 1;
  torch::set_num_threads(threads);
  // As loom-rank runs the engine: freed host memory is kept for the next
  // step (host_allocator.h). TRAIN_DEFAULT_ALLOCATOR=1 leaves glibc's
  // default, to measure what the policy is worth.
  const char* default_allocator = std::getenv("TRAIN_DEFAULT_ALLOCATOR");
  if (default_allocator == nullptr || std::string(default_allocator) != "1") {
    const absl::Status retained = loom::engine::RetainFreedHostMemory();
    std::printf("host allocator: %s\n",
                retained.ok() ? "freed memory retained (as loom-rank)"
                              : retained.ToString().c_str());
  } else {
    std::printf("host allocator: glibc default (TRAIN_DEFAULT_ALLOCATOR=1)\n");
  }
  std::printf("openmp wait: %s\n", openmp_wait.ok()
                                       ? loom::engine::OpenMpWaitPolicyDescription().c_str()
                                       : openmp_wait.ToString().c_str());
  const loom::engine::TrainerConfig config = loom::bench::CpuBenchGptConfig(steps);
  const int64_t tokens_per_step = int64_t{config.global_batch} * config.model.seq_len;

  // Reference rate: measured before the first step and after the last, in
  // the same turns (the cores may be shared with other work; the better of
  // the two is the less disturbed).
  double sgemm_before = 0, sgemm_after = 0;
  auto measure_sgemm = [] {
    return loom::telemetry::MeasureGemmFlopsPerSecond(kSgemmSize, kSgemmRepeats);
  };
  if (!turns.enabled()) sgemm_before = measure_sgemm();
  const double flops_per_token =
      loom::telemetry::ModelFlopsPerToken(loom::engine::ShapeOf(config.model));
  std::printf("model: %lld parameters, %.1f MFLOP per token (6*N_matmul + attention), "
              "%lld tokens per step\n",
              static_cast<long long>(loom::engine::GptParameterCount(config.model)),
              flops_per_token / 1e6, static_cast<long long>(tokens_per_step));

  // One shard of exactly steps * global_batch samples of random tokens, so
  // every step reads fresh data.
  std::string work = (fs::temp_directory_path() / "loom_train_bench.XXXXXX").string();
  if (mkdtemp(work.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> token(0, config.model.vocab_size - 1);
  std::vector<uint16_t> tokens(static_cast<size_t>(steps * tokens_per_step + 1));
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(token(rng));
  const std::string shard = (fs::path(work) / "train_000000.bin").string();
  if (absl::Status s = loom::engine::WriteShard(shard, tokens); !s.ok()) {
    std::fprintf(stderr, "WriteShard: %s\n", s.ToString().c_str());
    fs::remove_all(work);
    return 1;
  }

  loom::engine::TrainerConfig train = config;
  train.train_shards = {shard};
  std::vector<double> step_seconds;
  std::vector<double> losses;
  loom::engine::TrainerCallbacks callbacks;
  bool turn_lost = false;
  // should_stop runs before each step's timer starts, on_step after it
  // stops: the turn covers the step and nothing of the other side's.
  callbacks.should_stop = [&] {
    if (!turns.Acquire()) {
      turn_lost = true;
      return true;
    }
    if (turns.enabled() && step_seconds.empty()) sgemm_before = measure_sgemm();
    return false;
  };
  SgemmSampler sampler;
  callbacks.on_step = [&](const loom::v1::StepMetrics& r) {
    step_seconds.push_back(r.step_time_seconds());
    losses.push_back(r.loss());
    sampler.Sample();
    if (turns.enabled() && r.step() == steps) sgemm_after = measure_sgemm();
    if (!turns.Release()) turn_lost = true;
  };
  absl::StatusOr<loom::engine::TrainResult> result =
      loom::engine::Train(train, nullptr, callbacks);
  if (!result.ok() || turn_lost) {
    std::fprintf(stderr, "Train: %s%s\n", result.status().ToString().c_str(),
                 turn_lost ? " (lockstep with the PyTorch side broke: it did not pass the "
                             "turn back in time, or exited)" : "");
    fs::remove_all(work);
    return 1;
  }
  if (static_cast<int64_t>(step_seconds.size()) != steps) {
    std::fprintf(stderr, "expected %lld step reports, got %zu\n", static_cast<long long>(steps),
                 step_seconds.size());
    fs::remove_all(work);
    return 1;
  }
  if (!turns.enabled()) sgemm_after = measure_sgemm();
  const double sgemm = std::max({sgemm_before, sgemm_after, sampler.best()});
  std::printf("sgemm: %.1f GFLOP/s (%dx%dx%d fp32 torch::mm, %d threads; best of %d before "
              "training %.1f, of %d after %.1f, of one after each step %.1f; BLAS: %s)\n",
              sgemm / 1e9, kSgemmSize, kSgemmSize, kSgemmSize, threads, kSgemmRepeats,
              sgemm_before / 1e9, kSgemmRepeats, sgemm_after / 1e9, sampler.best() / 1e9,
              BlasCoreName().c_str());
  const std::vector<double> measured(step_seconds.begin() + warmup, step_seconds.end());
  const double median_seconds = Median(measured);
  const double tokens_per_second = tokens_per_step / median_seconds;
  const double flops = tokens_per_second * flops_per_token;
  std::printf("loom: %.1f tok/s, median step %.3f s over %zu steps (min %.3f, max %.3f; "
              "%lld warm-up), %.1f GFLOP/s = %.1f%% of sgemm; loss %.3f -> %.3f\n",
              tokens_per_second, median_seconds, measured.size(),
              *std::min_element(measured.begin(), measured.end()),
              *std::max_element(measured.begin(), measured.end()), static_cast<long long>(warmup),
              flops / 1e9, 100 * flops / sgemm, losses.front(), losses.back());

  if (profile_steps > 0) {
    // The first data batch of the shard in file order: sample b is tokens
    // [b*T, b*T + T] (windows of T + 1 with stride T, see TokenDataset).
    std::vector<int64_t> window(tokens.begin(), tokens.begin() + tokens_per_step + 1);
    torch::Tensor all = torch::tensor(window, torch::kLong);
    torch::Tensor inputs = all.narrow(0, 0, tokens_per_step)
                               .view({config.global_batch, config.model.seq_len});
    torch::Tensor targets = all.narrow(0, 1, tokens_per_step)
                                .view({config.global_batch, config.model.seq_len});
    if (!turns.Acquire()) {
      std::fprintf(stderr, "lockstep with the PyTorch side broke before the profile\n");
      fs::remove_all(work);
      return 1;
    }
    Profile(config, inputs, targets, profile_steps);
    turns.Release();
  }
  fs::remove_all(work);

  std::printf("LOOM_TRAIN tokens_per_second=%.3f flops_per_token=%.1f "
              "sgemm_flops_per_second=%.1f median_step_seconds=%.6f min_step_seconds=%.6f "
              "tokens_per_step=%lld steps=%zu threads=%d\n",
              tokens_per_second, flops_per_token, sgemm, median_seconds,
              *std::min_element(measured.begin(), measured.end()),
              static_cast<long long>(tokens_per_step), measured.size(), threads);
  return 0;
}
