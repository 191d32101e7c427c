// What the GPU checks share (gpu_check.h): reporting, scratch space, data,
// the small GPT, and training runs through Train / TrainWithGroups.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <thread>

#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/gpu_check.h"
#include "common/formats/data.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/trainer.h"

namespace loom::gpu_check {

namespace fs = std::filesystem;

// --- Report ---------------------------------------------------------------

namespace {

// `text` on one line (LibTorch's messages may span several).
std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

bool Report::Part(const std::string& part, bool ok, const std::string& detail) {
  std::printf("PART %s/%s: %s %s\n", check_.c_str(), part.c_str(), ok ? "PASS" : "FAIL",
              OneLine(detail).c_str());
  std::fflush(stdout);
  if (!ok) failed_parts_.push_back(part);
  return ok;
}

void Report::Note(const std::string& text) const {
  std::printf("%s: %s\n", check_.c_str(), text.c_str());
  std::fflush(stdout);
}

int Report::Verdict(const char* verdict, int exit_status, const std::string& detail) {
  std::printf("CHECK %s: %s %s\n", check_.c_str(), verdict, OneLine(detail).c_str());
  std::fflush(stdout);
  return exit_status;
}

int Report::Pass(const std::string& detail) {
  if (!failed_parts_.empty()) return Fail(detail);
  return Verdict("PASS", kExitPass, detail);
}

int Report::Fail(const std::string& detail) {
  std::string parts;
  for (const std::string& p : failed_parts_) absl::StrAppend(&parts, parts.empty() ? "" : ", ", p);
  return Verdict("FAIL", kExitFail,
                 parts.empty() ? detail : absl::StrCat(detail, " (failed parts: ", parts, ")"));
}

int Report::SkipNoCuda() {
  if (!failed_parts_.empty()) return Fail("a part that needs no GPU failed");
  return Verdict("SKIP", kExitSkip, NoCudaReason());
}

bool CudaAvailable() { return torch::cuda::is_available() && torch::cuda::device_count() > 0; }

std::string NoCudaReason() {
#if LOOM_HAVE_TORCH_CUDA
  return "no CUDA device: this LibTorch has CUDA but sees no GPU";
#else
  return "no CUDA device: this build's LibTorch has no CUDA support";
#endif
}

// --- Scratch space and data -----------------------------------------------

ScratchDir::ScratchDir() {
  const char* tmp = getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/loom_gpu_check.XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("loom_gpu_check: mkdtemp");
    std::exit(kExitFail);
  }
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

absl::StatusOr<std::string> WriteTextShard(const std::string& dir, uint32_t seed,
                                           size_t tokens) {
  static const char* const kSubjects[] = {"the cat", "a dog", "my friend", "the old man", "she",
                                          "we"};
  static const char* const kVerbs[] = {"sees", "likes", "walks to", "paints", "finds",
                                       "reads about"};
  static const char* const kObjects[] = {"the river", "a small house", "the moon",
                                         "green apples", "the market", "a letter"};
  std::mt19937 rng(seed);
  auto pick = [&rng](const char* const* words) {
    return words[std::uniform_int_distribution<int>(0, 5)(rng)];
  };
  std::string text;
  while (text.size() < tokens) {
    absl::StrAppend(&text, pick(kSubjects), " ", pick(kVerbs), " ", pick(kObjects), ". ");
  }
  const std::string path = absl::StrCat(dir, "/text_", seed, ".bin");
  absl::Status written =
      engine::WriteShard(path, std::vector<uint16_t>(text.begin(), text.begin() + tokens));
  if (!written.ok()) return written;
  return path;
}

absl::StatusOr<std::string> WriteRandomShard(const std::string& dir, uint32_t seed,
                                             size_t tokens, int vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<uint16_t> ids(tokens);
  for (uint16_t& t : ids) t = static_cast<uint16_t>(id(rng));
  const std::string path = absl::StrCat(dir, "/random_", seed, ".bin");
  absl::Status written = engine::WriteShard(path, ids);
  if (!written.ok()) return written;
  return path;
}

engine::TrainerConfig SmallGpt(const std::string& shard, const std::string& device, int steps) {
  engine::TrainerConfig c;
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.model.d_model = 128;
  c.model.seq_len = 128;
  c.model.vocab_size = 256;
  c.model.dropout = 0.0;
  c.optimizer.lr = 1e-3;
  c.optimizer.grad_clip = 1.0;
  // Constant learning rate: a step the fp16 loss scaler skips then shifts
  // the later steps without changing their learning rates.
  c.schedule.total_steps = steps;
  c.schedule.warmup_steps = 0;
  c.schedule.min_lr_ratio = 1.0;
  c.global_batch = 8;
  c.micro_batch = 4;
  c.seed = 1234;
  c.eval_batches = 0;
  c.train_shards = {shard};
  c.device = device;
  return c;
}

// --- Training runs ----------------------------------------------------------

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

engine::TrainerCallbacks Collect(RunResult* out, bool reports, bool parameters = true) {
  engine::TrainerCallbacks callbacks;
  if (reports) {
    callbacks.on_step = [out](const loom::v1::StepMetrics& m) {
      if (m.step() >= 1) out->steps.push_back(m);
    };
  }
  if (parameters) {
    callbacks.on_finish = [out](const torch::nn::Module& module) {
      for (const auto& item : module.named_parameters()) {
        out->parameters.push_back(item.value().detach().to(torch::kCPU).clone());
      }
    };
  }
  return callbacks;
}

}  // namespace

RunResult TrainOneRank(const engine::TrainerConfig& config, bool parameters) {
  RunResult out;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<engine::TrainResult> result =
      engine::Train(config, nullptr, Collect(&out, /*reports=*/true, parameters));
  out.seconds = SecondsSince(start);
  out.status = result.status();
  if (result.ok()) out.result = *std::move(result);
  return out;
}

std::vector<RunResult> TrainInProcess(const engine::TrainerConfig& base,
                                      const ParallelLayout& layout, bool nccl) {
  engine::TrainerConfig config = base;
  config.tensor_parallel = layout.tensor;
  config.pipeline_parallel = layout.pipeline;
  const int world = layout.world_size();
  std::vector<RunResult> out(world);
  auto store = c10::make_intrusive<c10d::HashStore>();
  // Every rank's groups live until all ranks are done, so that no rank
  // closes its connections while a peer still sets one up with it.
  std::vector<std::optional<engine::ParallelGroups>> kept(world);
  auto run = [&](int rank) {
    // One intra-op thread per rank thread, as the engine's multi-rank tests
    // run (trainer_test.cc, RunRanks, says why).
    torch::set_num_threads(1);
    engine::ParallelGroupOptions options;
    options.timeout_seconds = 120;
    options.local_addr = "127.0.0.1";
    options.nccl = nccl;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<engine::ParallelGroups> groups =
        engine::CreateParallelGroups(store, rank, layout, options);
    if (!groups.ok()) {
      out[rank].status = groups.status();
      return;
    }
    kept[rank].emplace(*std::move(groups));
    const engine::TrainerCallbacks callbacks = Collect(&out[rank], /*reports=*/rank == 0);
    absl::StatusOr<engine::TrainResult> result =
        engine::UsesParallelLayout(config)
            ? engine::TrainWithGroups(config, *kept[rank], callbacks)
            : engine::Train(config, kept[rank]->world, callbacks);
    out[rank].seconds = SecondsSince(start);
    out[rank].status = result.status();
    if (result.ok()) out[rank].result = *std::move(result);
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) threads.emplace_back(run, rank);
  for (std::thread& t : threads) t.join();
  return out;
}

// --- Comparisons ------------------------------------------------------------

LossDifference CompareLosses(const std::vector<loom::v1::StepMetrics>& reference,
                             const std::vector<loom::v1::StepMetrics>& run) {
  LossDifference d;
  for (const loom::v1::StepMetrics& want : reference) {
    for (const loom::v1::StepMetrics& got : run) {
      if (got.step() != want.step()) continue;
      const double relative = std::abs(got.loss() - want.loss()) / std::abs(want.loss());
      // NaN compares false: count it as the worst.
      if (!(relative <= d.worst)) {
        d.worst = std::isnan(relative) ? std::numeric_limits<double>::infinity() : relative;
        d.worst_step = want.step();
      }
      ++d.compared;
    }
  }
  return d;
}

std::string Describe(const LossDifference& d, double limit) {
  const std::string bound = limit > 0 ? absl::StrFormat(" (limit %.0e)", limit) : "";
  if (d.compared == 0) return "no steps to compare";
  if (d.worst == 0) return absl::StrCat("losses bit for bit over ", d.compared, " steps", bound);
  return absl::StrFormat("worst loss difference %.3g at step %d of %d%s", d.worst, d.worst_step,
                         d.compared, bound);
}

bool BitEqual(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type()) return false;
    const torch::Tensor x = a[i].contiguous(), y = b[i].contiguous();
    if (std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) return false;
  }
  return true;
}

double MaxAbsDifference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes()) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, (a[i].to(torch::kDouble) - b[i].to(torch::kDouble))
                                .abs().max().item<double>());
  }
  return worst;
}

std::string LossSpan(const RunResult& run) {
  if (run.steps.empty()) return "no steps";
  return absl::StrFormat("loss %.4f -> %.4f", run.steps.front().loss(), run.steps.back().loss());
}

bool TrainedWell(const RunResult& run, std::string* why) {
  if (!run.status.ok()) {
    *why = run.status.ToString();
    return false;
  }
  if (run.steps.empty()) {
    *why = "no step was reported";
    return false;
  }
  for (const loom::v1::StepMetrics& m : run.steps) {
    if (!std::isfinite(m.loss())) {
      *why = absl::StrCat("loss at step ", m.step(), " is ", m.loss());
      return false;
    }
  }
  if (!(run.steps.back().loss() < run.steps.front().loss())) {
    *why = absl::StrCat("loss did not fall: ", LossSpan(run));
    return false;
  }
  return true;
}

}  // namespace loom::gpu_check
