// The benchmark (gpu_check.h), last of the checks: a ~1.3B GPT (GPT-2
// shape: 24 layers, d 2048, 16 heads, seq 2048, vocab 50304; 1.31B
// parameters with the position table) in bf16, batch 8 x 2048 tokens, 13
// steps of which 3 warm up, AdamW (lr 3e-4 held, weight decay 0.1, clipping
// at 1.0):
//   Loom: Train() on cuda:0, on a shard of uniformly random tokens (the
//         engine as a rank runs it: bf16 autocast over the blocks, the LM
//         head's products in bf16 with fp32 accumulation and the loss in
//         fp32, fused and chunked, fused AdamW through the CUDA kernel);
//   PyTorch eager: bench/gpu/gpt_eager.py, the same model, batch and
//         optimizer work in plain PyTorch (torch.autocast bf16, so its LM
//         head too is a bf16 product; the loss on the logits taken to fp32;
//         SDPA, torch.optim.AdamW's default), by $LOOM_GPU_PYTHON (default
//         python3), first, so that each side has the GPU to itself.
// Like with like: both sides multiply in bf16 everywhere autocast would and
// compute the loss in fp32; the summary states each side's head dtype, and
// the check fails if Loom's is not bf16.
// tokens/s is each side's median over the timed steps; MFU = model FLOPs per
// token (common/model_shape.h: 6 N_matmul + 12 L T d) x tokens/s / the
// board's datasheet bf16 peak (common/device_catalog.h, by NVML's product
// name; without one, the bf16 matrix-product rate measured here). Last line:
//   gpu: mfu <Loom's MFU> ratio=<Loom tokens/s / PyTorch eager tokens/s>
// Without a GPU both sides run a tiny model on the CPU for 4 steps (the
// part that keeps the script and the harness from rotting), then SKIP.
#include <stdio.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/gpu/gpu_check.h"
#include "common/device_catalog.h"
#include "common/model_shape.h"
#include "worker/engine/gpt.h"
#include "worker/telemetry/nvml.h"

#ifndef LOOM_EAGER_GPT_SCRIPT
#error "LOOM_EAGER_GPT_SCRIPT: the path of gpt_eager.py (bench/gpu/CMakeLists.txt defines it)"
#endif

namespace loom::gpu_check {
namespace {

struct Shape {
  int layers, d_model, heads, seq_len, vocab, batch, steps, warmup;
};
constexpr Shape kFull{24, 2048, 16, 2048, 50304, 8, 13, 3};
constexpr Shape kTiny{2, 64, 2, 64, 512, 4, 4, 1};

struct Side {
  std::string error;  // "" when it ran
  double tokens_per_second = 0;
  double first_loss = 0, last_loss = 0;
  double peak_bytes = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// PyTorch eager: runs the script and reads its line
//   EAGER tokens_per_second=<x> ... loss_first=<x> loss_last=<x> peak_allocated_bytes=<n> ...
Side RunEager(const Shape& s, const std::string& device, const std::string& dtype) {
  const char* python = std::getenv("LOOM_GPU_PYTHON");
  const std::string command = absl::StrFormat(
      "'%s' '%s' --device %s --dtype %s --layers %d --d-model %d --heads %d --seq-len %d "
      "--vocab %d --batch %d --steps %d --warmup %d 2>&1",
      python && *python ? python : "python3", LOOM_EAGER_GPT_SCRIPT, device, dtype, s.layers,
      s.d_model, s.heads, s.seq_len, s.vocab, s.batch, s.steps, s.warmup);
  Side side;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    side.error = "cannot start the PyTorch eager side";
    return side;
  }
  std::string output;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  bool found = false;
  for (absl::string_view l : absl::StrSplit(output, '\n')) {
    if (!absl::StartsWith(l, "EAGER ")) continue;
    found = true;
    for (absl::string_view field : absl::StrSplit(l.substr(6), ' ')) {
      const std::vector<std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      if (kv.size() != 2) continue;
      double value = 0;
      if (!absl::SimpleAtod(kv[1], &value)) continue;
      if (kv[0] == "tokens_per_second") side.tokens_per_second = value;
      if (kv[0] == "loss_first") side.first_loss = value;
      if (kv[0] == "loss_last") side.last_loss = value;
      if (kv[0] == "peak_allocated_bytes") side.peak_bytes = value;
    }
  }
  std::printf("%s", output.c_str());  // the script's own lines, into this check's log
  if (status != 0 || !found || !(side.tokens_per_second > 0)) {
    side.error = absl::StrCat("the PyTorch eager side failed (exit ", status, ")");
  }
  return side;
}

engine::TrainerConfig LoomConfig(const Shape& s, const std::string& shard,
                                 const std::string& device, engine::Precision precision) {
  engine::TrainerConfig c;
  c.model.n_layer = s.layers;
  c.model.d_model = s.d_model;
  c.model.n_head = s.heads;
  c.model.seq_len = s.seq_len;
  c.model.vocab_size = s.vocab;
  c.model.dropout = 0.0;
  c.model.precision = precision;
  c.optimizer.lr = 3e-4;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.grad_clip = 1.0;
  c.schedule.total_steps = s.steps;
  c.schedule.warmup_steps = 0;
  c.schedule.min_lr_ratio = 1.0;
  c.global_batch = s.batch;
  c.micro_batch = s.batch;
  c.eval_batches = 0;
  c.train_shards = {shard};
  c.device = device;
  return c;
}

Side RunLoom(const Shape& s, const std::string& device, engine::Precision precision) {
  Side side;
  ScratchDir dir;
  const size_t tokens = 2 * static_cast<size_t>(s.steps) * s.batch * (s.seq_len + 1);
  absl::StatusOr<std::string> shard = WriteRandomShard(dir.path(), 9, tokens, s.vocab);
  if (!shard.ok()) {
    side.error = shard.status().ToString();
    return side;
  }
  const RunResult run = TrainOneRank(LoomConfig(s, *shard, device, precision),
                                     /*parameters=*/false);
  if (!run.status.ok() || run.steps.size() != static_cast<size_t>(s.steps)) {
    side.error = run.status.ok() ? "Train reported too few steps" : run.status.ToString();
    return side;
  }
  std::vector<double> rates;
  for (const loom::v1::StepMetrics& m : run.steps) {
    if (m.step() > s.warmup) rates.push_back(m.tokens_per_second());
    side.peak_bytes = std::max<double>(side.peak_bytes, m.device_memory_peak_bytes());
  }
  side.tokens_per_second = Median(rates);
  side.first_loss = run.steps.front().loss();
  side.last_loss = run.steps.back().loss();
  return side;
}

// The bf16 matrix-product rate: 8192^3 products, median of 10 after 3.
double MeasuredBf16Flops() {
  const int64_t n = 8192;
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA, 0);
  const torch::Tensor a = torch::randn({n, n}, bf16), b = torch::randn({n, n}, bf16);
  torch::Tensor c = torch::empty({n, n}, bf16);
  for (int i = 0; i < 3; ++i) torch::mm_out(c, a, b);
  std::vector<double> seconds;
  for (int i = 0; i < 10; ++i) {
    torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    torch::mm_out(c, a, b);
    torch::cuda::synchronize();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * n * n * n / Median(seconds);
}

// The datasheet bf16 peak of GPU 0 and its name; 0 when NVML or the
// catalog cannot say (`why` then does).
double DatasheetBf16Flops(std::string* name, std::string* why) {
  absl::StatusOr<std::unique_ptr<telemetry::Nvml>> nvml = telemetry::Nvml::Open();
  absl::StatusOr<std::string> product =
      nvml.ok() ? (*nvml)->DeviceName(0) : absl::StatusOr<std::string>(nvml.status());
  absl::StatusOr<DeviceSpec> spec =
      product.ok() ? LookupDeviceByProductName(*product)
                   : absl::StatusOr<DeviceSpec>(product.status());
  if (!spec.ok()) {
    *why = spec.status().ToString();
    return 0;
  }
  *name = absl::StrCat(*product, " (", spec->name, ")");
  return spec->PeakFlops(MatmulPrecision::kBf16);
}

std::string Describe(const char* who, const Side& side, double flops_per_token, double peak) {
  return absl::StrFormat("%s %.0f tok/s, MFU %.3f (%.0f TFLOP/s), peak allocated %.1f GiB, loss "
                         "%.3f -> %.3f",
                         who, side.tokens_per_second, flops_per_token * side.tokens_per_second /
                                                          peak,
                         flops_per_token * side.tokens_per_second / 1e12,
                         side.peak_bytes / (1024.0 * 1024.0 * 1024.0), side.first_loss,
                         side.last_loss);
}

}  // namespace

int CheckBench(const std::vector<std::string>&) {
  Report report("bench");
  if (!CudaAvailable()) {
    // Both sides on a tiny model, on the CPU: they run and report.
    const Side eager = RunEager(kTiny, "cpu", "fp32");
    const Side loom = RunLoom(kTiny, "cpu", engine::Precision::kFp32);
    report.Part("cpu-smoke", eager.error.empty() && loom.error.empty(),
                absl::StrFormat("a %d-layer d%d GPT on the CPU, %d steps: Loom %s, PyTorch eager "
                                "%s (figures of a tiny model, not a benchmark)",
                                kTiny.layers, kTiny.d_model, kTiny.steps,
                                loom.error.empty()
                                    ? absl::StrFormat("%.0f tok/s", loom.tokens_per_second)
                                    : loom.error,
                                eager.error.empty()
                                    ? absl::StrFormat("%.0f tok/s", eager.tokens_per_second)
                                    : eager.error));
    return report.SkipNoCuda();
  }
  const Shape s = kFull;
  engine::TrainerConfig shape_only = LoomConfig(s, "", "cuda:0", engine::Precision::kBf16);
  const double parameters = static_cast<double>(engine::GptParameterCount(shape_only.model));
  const double flops_per_token = ModelFlopsPerToken(engine::ShapeOf(shape_only.model));
  std::string name, why;
  const double datasheet = DatasheetBf16Flops(&name, &why);
  const double measured = MeasuredBf16Flops();
  const double peak = datasheet > 0 ? datasheet : measured;
  // What Loom's engine will do with this config, not what this file hopes.
  const c10::ScalarType loom_head = engine::HeadMatmulDtype(shape_only.model, /*on_cuda=*/true);
  const bool like_with_like = loom_head == torch::kBFloat16;
  report.Note(absl::StrFormat(
      "like with like: LM head products in %s (Loom) and bf16 (PyTorch eager, autocast), loss in "
      "fp32 on both sides%s",
      c10::toString(loom_head), like_with_like ? "" : " -- NOT the same work"));
  report.Note(absl::StrFormat(
      "GPT %.2fB parameters (L%d d%d h%d T%d V%d), batch %d x %d tokens, bf16, %d steps (%d "
      "warm-up); %.2f GFLOP per token; peak %s; bf16 mm 8192^3 measured %.0f TFLOP/s",
      parameters / 1e9, s.layers, s.d_model, s.heads, s.seq_len, s.vocab, s.batch, s.seq_len,
      s.steps, s.warmup, flops_per_token / 1e9,
      datasheet > 0 ? absl::StrFormat("%.0f TFLOP/s datasheet bf16 of %s", datasheet / 1e12, name)
                    : absl::StrCat("the measured rate (no datasheet figure: ", why, ")"),
      measured / 1e12));
  const Side eager = RunEager(s, "cuda", "bf16");
  if (!eager.error.empty()) return report.Fail(eager.error);
  report.Note(Describe("PyTorch eager", eager, flops_per_token, peak));
  const Side loom = RunLoom(s, "cuda:0", engine::Precision::kBf16);
  if (!loom.error.empty()) return report.Fail(absl::StrCat("Loom: ", loom.error));
  report.Note(Describe("Loom", loom, flops_per_token, peak));
  const double mfu = flops_per_token * loom.tokens_per_second / peak;
  const double ratio = loom.tokens_per_second / eager.tokens_per_second;
  const bool finite = std::isfinite(loom.last_loss) && std::isfinite(eager.last_loss);
  const int status = report.Finish(
      finite && like_with_like,
      absl::StrFormat("Loom %.0f tok/s MFU %.3f; PyTorch eager %.0f tok/s MFU %.3f; ratio %.3f "
                      "(both: bf16 blocks and LM head, fp32 loss)%s",
                      loom.tokens_per_second, mfu, eager.tokens_per_second,
                      flops_per_token * eager.tokens_per_second / peak, ratio,
                      like_with_like ? "" : "; Loom's LM head is not bf16: not like with like"));
  std::printf("gpu: mfu %.3f ratio=%.3f\n", mfu, ratio);
  return status;
}

}  // namespace loom::gpu_check
