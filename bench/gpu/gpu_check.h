// The GPU checks of scripts/gpu-run.sh (issue "a six-minute GPU check"):
// one subcommand of loom_gpu_check each (gpu_check.cc lists them), built
// with Loom's engine against the LibTorch that bench/gpu/CMakeLists.txt
// finds. This header is what the checks share: how a check reports, the
// data and models they train, and runs of the real entry points (Train,
// TrainWithGroups) that collect what the comparisons need.
//
// Output contract, read by scripts/gpu-run.sh and tests/gpu/rehearsal_test.sh:
//   PART <check>/<part>: PASS|FAIL <detail>   zero or more: parts that need
//                                             no GPU (the CPU reference runs)
//                                             or one step of the check
//   CHECK <check>: PASS|FAIL|SKIP <detail>    exactly one, the verdict
// Exit status: 0 PASS, 1 FAIL, 77 SKIP (no CUDA device: this LibTorch has
// no CUDA, or it sees no GPU), 2 usage. A failed part fails the check, also
// when the GPU half is skipped, so a rehearsal on a CPU machine proves the
// CPU halves; a SKIP is never a pass of the GPU half.
#ifndef LOOM_BENCH_GPU_GPU_CHECK_H_
#define LOOM_BENCH_GPU_GPU_CHECK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/parallel_layout.h"
#include "loom/v1/job.pb.h"
#include "worker/engine/trainer_callbacks.h"
#include "worker/engine/trainer_config.h"

namespace loom::gpu_check {

inline constexpr int kExitPass = 0;
inline constexpr int kExitFail = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitSkip = 77;

// The lines of one check (see the header comment), on stdout, flushed at
// once so that a check killed by its timeout leaves what it had.
class Report {
 public:
  explicit Report(std::string check) : check_(std::move(check)) {}

  // "PART <check>/<part>: PASS|FAIL <detail>". Returns `ok`.
  bool Part(const std::string& part, bool ok, const std::string& detail);
  // A line of figures: "<check>: <text>".
  void Note(const std::string& text) const;

  // The verdict line and the exit status. Pass and Skip turn into FAIL when
  // a part failed.
  int Pass(const std::string& detail);
  int Fail(const std::string& detail);
  int SkipNoCuda();
  int Finish(bool ok, const std::string& detail) { return ok ? Pass(detail) : Fail(detail); }

 private:
  int Verdict(const char* verdict, int exit_status, const std::string& detail);

  std::string check_;
  std::vector<std::string> failed_parts_;
};

// Whether this LibTorch has CUDA and sees a GPU (the checks train on
// cuda:0). The reason when not, for the SKIP line.
bool CudaAvailable();
std::string NoCudaReason();

// A fresh directory under $TMPDIR (default /tmp), removed with everything
// in it on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// llm.c token shards in `dir`, returning the path. Text: byte-level
// English-like sentences of a small vocabulary (as trainer_test.cc's
// MakeText), so that loss falls within a few steps; random: uniform ids in
// [0, vocab) (throughput only).
absl::StatusOr<std::string> WriteTextShard(const std::string& dir, uint32_t seed,
                                           size_t tokens);
absl::StatusOr<std::string> WriteRandomShard(const std::string& dir, uint32_t seed,
                                             size_t tokens, int vocab);

// The small GPT most checks train (GPT-2 shape, 4 blocks, d 128, 4 heads,
// seq 128, vocab 256; global batch 8, micro-batch 4; AdamW lr 1e-3 held
// constant, no warm-up, clipping at 1.0; no validation, no checkpoints),
// on `shard`, for `steps` steps on `device`.
engine::TrainerConfig SmallGpt(const std::string& shard, const std::string& device, int steps);

// One training run: rank 0's step reports (step >= 1, in order), its
// parameters at the end (CPU copies, in named_parameters() order), the
// result, and the seconds it took.
struct RunResult {
  absl::Status status = absl::UnknownError("not run");
  std::vector<loom::v1::StepMetrics> steps;
  std::vector<torch::Tensor> parameters;
  engine::TrainResult result;
  double seconds = 0;
};

// Train() on one rank, without a process group; `parameters` false leaves
// RunResult::parameters empty (the benchmark's 1.3B need no host copy).
RunResult TrainOneRank(const engine::TrainerConfig& config, bool parameters = true);
// Every rank of `layout` as a thread of this process, over one HashStore:
// Train() over the world group when the layout is pure data parallelism,
// else TrainWithGroups(); Gloo groups (CUDA tensors staged through host
// memory), or NCCL when `nccl`. Rank 0's result first.
std::vector<RunResult> TrainInProcess(const engine::TrainerConfig& config,
                                      const ParallelLayout& layout, bool nccl = false);

// Largest |run - reference| / |reference| of the loss over the steps both
// report; `compared` is how many that was (0 when none: a failed check).
struct LossDifference {
  double worst = 0;
  int64_t worst_step = 0;
  int compared = 0;
};
LossDifference CompareLosses(const std::vector<loom::v1::StepMetrics>& reference,
                             const std::vector<loom::v1::StepMetrics>& run);
// "losses bit for bit over 8 steps", or "worst loss difference 3.1e-06 at
// step 5 of 8", with " (limit 1e-05)" when `limit` > 0.
std::string Describe(const LossDifference& d, double limit = 0);

// Whether two parameter lists have the same shapes and bits; the largest
// absolute difference otherwise (infinity for mismatched shapes).
bool BitEqual(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b);
double MaxAbsDifference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b);

// "5.4321 -> 2.1234" for a run's first and last loss; "no steps" if none.
std::string LossSpan(const RunResult& run);
// Whether the run finished, every loss is finite and the last is below the
// first; else `why` says what went wrong.
bool TrainedWell(const RunResult& run, std::string* why);

// The checks (one file each besides gpu_check.cc): argv after the
// subcommand. Each prints its lines and returns the exit status.
int CheckAdamW(const std::vector<std::string>& args);
int CheckGptPrecision(const std::vector<std::string>& args);
int CheckActivationCheckpointing(const std::vector<std::string>& args);
int CheckMemory(const std::vector<std::string>& args);
int CheckNvml(const std::vector<std::string>& args);
int CheckNccl(const std::vector<std::string>& args);
int CheckGlooStaging(const std::vector<std::string>& args);
int CheckTensorAndPipeline(const std::vector<std::string>& args);
int CheckResume(const std::vector<std::string>& args);
int CheckBench(const std::vector<std::string>& args);

}  // namespace loom::gpu_check

#endif  // LOOM_BENCH_GPU_GPU_CHECK_H_
