// loom_gpu_check: the GPU checks of scripts/gpu-run.sh, one subcommand
// each; the output contract (PART/CHECK lines, exit 0/1/77) is gpu_check.h's.
//
//   loom_gpu_check <check> [args]
//   loom_gpu_check list          the checks, one per line, in gpu-run.sh's order
//
// Every check that needs a GPU trains or computes on cuda:0 and exits 77
// where there is none, after running what needs none (its CPU reference
// runs) as PART lines.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench/gpu/gpu_check.h"

namespace {

using loom::gpu_check::kExitUsage;

struct Check {
  const char* name;
  int (*run)(const std::vector<std::string>& args);
  const char* what;
};

// In the order gpu-run.sh runs them: quick device checks first, the
// benchmark last.
const Check kChecks[] = {
    {"adamw", loom::gpu_check::CheckAdamW,
     "FusedAdamW on CUDA (the CUDA kernel) against the CPU kernel, bit for bit"},
    {"gpt-precision", loom::gpu_check::CheckGptPrecision,
     "a small GPT on cuda:0, 20 steps in fp32, bf16 and fp16, against the CPU fp32 run"},
    {"activation-checkpointing", loom::gpu_check::CheckActivationCheckpointing,
     "checkpointed blocks on cuda:0 train as plain ones, in less memory"},
    {"memory", loom::gpu_check::CheckMemory,
     "the engine's device-memory figures against the caching allocator's "
     "(torch.cuda.max_memory_allocated)"},
    {"nvml", loom::gpu_check::CheckNvml,
     "the power meter reads NVML's energy counter, and it counts a load"},
    {"nccl", loom::gpu_check::CheckNccl,
     "an NCCL group of one rank: all-reduce, broadcast, and Train over it"},
    {"gloo-staging", loom::gpu_check::CheckGlooStaging,
     "two ranks on cuda:0 over Gloo with host staging train as one rank"},
    {"tp-pp", loom::gpu_check::CheckTensorAndPipeline,
     "TP2 and PP2 on cuda:0 through the same staging train as one rank"},
    {"resume", loom::gpu_check::CheckResume,
     "loom-rank trains a one-GPU job from its JSON configuration; a checkpoint "
     "resumes bit-exactly"},
    {"bench", loom::gpu_check::CheckBench,
     "bf16 ~1.3B GPT: Loom's engine against PyTorch eager, MFU and tokens/s"},
};

int Usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s <check> [args] | list\nchecks:\n", argv0);
  for (const Check& c : kChecks) std::fprintf(stderr, "  %-26s %s\n", c.name, c.what);
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(argv[0]);
  if (std::strcmp(argv[1], "list") == 0) {
    for (const Check& c : kChecks) std::printf("%s\n", c.name);
    return 0;
  }
  for (const Check& c : kChecks) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    // LibTorch reports errors by throwing (c10::Error is a std::exception):
    // one that escapes a check is its failure, on the verdict line.
    try {
      return c.run(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const std::exception& e) {
      std::string what = e.what();
      const size_t end = what.find('\n');  // c10::Error appends a backtrace
      std::printf("CHECK %s: FAIL exception: %s\n", c.name, what.substr(0, end).c_str());
      return loom::gpu_check::kExitFail;
    }
  }
  std::fprintf(stderr, "%s: no check named %s\n", argv[0], argv[1]);
  return Usage(argv[0]);
}
