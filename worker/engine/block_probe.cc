#include "worker/engine/block_probe.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <torch/torch.h>

#include "absl/strings/str_format.h"
#include "worker/engine/gpt.h"
#include "worker/engine/parallel/parallel_gpt.h"
#include "worker/engine/parallel/process_groups.h"

namespace loom::engine {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Median seconds of `fn` over `runs` calls after two warm-up calls.
template <typename Fn>
double Median(int runs, Fn fn) {
  fn();
  fn();
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(Since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The probe's GPT: `layers` blocks of width `d_model` (heads of 64, at
// least `min_heads`) on `tokens` tokens of a 256-token vocabulary.
GptConfig ProbeConfig(int layers, int d_model, int tokens, int min_heads) {
  GptConfig c;
  c.n_layer = layers;
  c.d_model = d_model;
  c.n_head = std::max(min_heads, d_model / 64);
  c.seq_len = tokens;
  c.vocab_size = 256;
  return c;
}

// Two in-process Gloo ranks on loopback.
ParallelGroupOptions LoopbackGroupOptions() {
  ParallelGroupOptions options;
  options.local_addr = "127.0.0.1";
  options.timeout_seconds = 30;
  return options;
}

// The median of `values` (reorders them).
double MedianOf(std::vector<double>& values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The mean of the middle half of `values` (reorders them): as robust to a
// stall in either pass as the median, and steadier than it where the
// differences spread widely, as a tensor-parallel block's do (0.5-23 ms
// around 10 ms here, as its collectives' waits land): over 21 pairs its
// median moved 9.3-14.7 ms from run to run, the middle half's mean
// 9.6-11.5 over 41.
double MiddleHalfMean(std::vector<double>& values) {
  std::sort(values.begin(), values.end());
  const size_t quarter = values.size() / 4;
  double sum = 0;
  for (size_t i = quarter; i < values.size() - quarter; ++i) sum += values[i];
  return sum / static_cast<double>(values.size() - 2 * quarter);
}

// The process's CPU seconds so far, all its threads.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One block's share of a 3-block and a 1-block model's forward + backward
// on inputs `x` and targets `y`: the two take turns, `runs` times after two
// warm-up pairs, and `middle` of the halved differences is returned (it
// may be <= 0 on a noisy machine). Taking turns keeps a slow spell of the
// machine (a test running beside it) from landing on one of the two only.
// With `process_cpu`, also `middle` of the same differences of the
// process's CPU time (all threads: the caller's, its peers' running the
// same passes in step, Gloo's). `Model` is Gpt or ParallelGpt.
template <typename Model>
double CentralBlockOfTurns(Model& three_blocks, Model& one_block, const torch::Tensor& x,
                           const torch::Tensor& y, int runs,
                           const std::function<double(std::vector<double>&)>& middle,
                           double* process_cpu = nullptr) {
  double cpu = 0;
  auto pass = [&](Model& model) {
    for (torch::Tensor& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    const double cpu_start = ProcessCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    model->Loss(x, y).backward();
    const double wall = Since(start);
    cpu = ProcessCpuSeconds() - cpu_start;
    return wall;
  };
  for (int i = 0; i < 2; ++i) {
    pass(three_blocks);
    pass(one_block);
  }
  std::vector<double> blocks, cpus;
  for (int i = 0; i < runs; ++i) {
    const double three = pass(three_blocks);
    const double three_cpu = cpu;
    blocks.push_back((three - pass(one_block)) / 2);
    cpus.push_back((three_cpu - cpu) / 2);
  }
  if (process_cpu != nullptr) *process_cpu = middle(cpus);
  return middle(blocks);
}

// One block's forward + backward on one micro-batch: a GPT of 3 blocks and
// one of 1 take turns, `runs` times after two warm-up pairs, and the median
// of the halved differences is the figure. Taking turns keeps a slow spell
// of the machine (a test running beside it) from landing on one of the two
// only: two separate medians once put the tiny block's 1-block pass above
// its 3-block one, and its fixed cost at 0.
double BlockSeconds(int d_model, int tokens, int runs) {
  std::vector<Gpt> models;
  for (int layers : {3, 1}) {
    const GptConfig c = ProbeConfig(layers, d_model, tokens, 1);
    torch::manual_seed(0);
    models.push_back(Gpt(c));
    models.back()->train();
  }
  torch::Tensor x = torch::randint(0, 256, {1, tokens}, torch::kLong);
  torch::Tensor y = x.roll(-1, 1);
  return std::max(0.0, CentralBlockOfTurns(models[0], models[1], x, y, runs, MedianOf));
}

// One block's forward + backward on one micro-batch, split over a 2-rank
// tensor-parallel group of in-process Gloo ranks (one thread each, as ranks
// sharing this machine's cores run): a GPT of 3 blocks and one of 1 take
// turns, `runs` times after a warm-up, and the mean of the middle half of
// the halved differences is the slower rank's figure; 0 when the group
// cannot be set up. Taking turns, not two separate medians, keeps a slow
// spell of the machine from landing on one shape only: separate medians
// gave 9.6-19 ms for the same block from run to run here. Sets
// `*cpu_per_rank` to the same estimate of the process's CPU time, halved.
double TensorParallelBlockSeconds(int d_model, int tokens, int runs, double* cpu_per_rank) {
  const ParallelLayout layout{1, 2, 1};
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> medians(2, 0);
  double process_cpu = 0;  // rank 0's reading: both ranks' passes, Gloo's threads
  std::mutex init;  // the constructor replays draws from the global generator
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      absl::StatusOr<ParallelGroups> groups =
          CreateParallelGroups(store, rank, layout, LoopbackGroupOptions());
      if (!groups.ok()) return;
      std::vector<ParallelGpt> models;
      for (int layers : {3, 1}) {
        const GptConfig c = ProbeConfig(layers, d_model, tokens, 2);
        std::lock_guard<std::mutex> lock(init);
        torch::manual_seed(0);
        models.push_back(ParallelGpt(c, PartitionFor(c, layout, groups->coordinates),
                                     groups->tensor));
        models.back()->train();
      }
      // The same tokens on both ranks.
      torch::Tensor x = (torch::arange(tokens, torch::kLong) * 7 % 256).view({1, tokens});
      torch::Tensor y = x.roll(-1, 1);
      medians[rank] = std::max(1e-9, CentralBlockOfTurns(models[0], models[1], x, y, runs,
                                                         MiddleHalfMean,
                                                         rank == 0 ? &process_cpu : nullptr));
    });
  }
  for (std::thread& t : ranks) t.join();
  *cpu_per_rank = std::max(0.0, process_cpu / 2);
  return std::min(medians[0], medians[1]) > 0 ? std::max(medians[0], medians[1]) : 0;
}

// Forward FLOPs of one block: 24 s h^2 for the four matrix products and
// 4 s^2 h for attention (Narayanan et al. 2021, Sec. 5.1, b = 1).
double BlockForwardFlops(double d, double s) { return 24 * s * d * d + 4 * s * s * d; }

// Median seconds of an all-reduce of `floats` fp32 values between two
// in-process Gloo ranks, or 0 when the group cannot be set up.
double AllReduceSeconds(int64_t floats, int runs) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> medians(2, 0);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      absl::StatusOr<ParallelGroups> groups =
          CreateParallelGroups(store, rank, ParallelLayout{2, 1, 1}, LoopbackGroupOptions());
      if (!groups.ok()) return;
      std::vector<torch::Tensor> tensors = {torch::ones({floats})};
      medians[rank] = Median(runs, [&] { groups->world->allreduce(tensors)->wait(); });
    });
  }
  for (std::thread& t : ranks) t.join();
  return std::max(medians[0], medians[1]);
}

// How much slower a one-thread rank computes while every core of this
// process's CPU set computes too (shared caches, memory bandwidth, the
// package's clock): one reference block's forward + backward alone, then
// on every core at once (one thread and model each, started together),
// then alone again; the median per-thread pass against the alone median's
// mean. At least 1; 1 with one core.
double ConcurrentSlowdown(int d_model, int tokens, int runs) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  if (cores < 2) return 1.0;
  std::vector<Gpt> models;
  for (int i = 0; i < cores; ++i) {
    torch::manual_seed(0);
    models.push_back(Gpt(ProbeConfig(1, d_model, tokens, 1)));
    models.back()->train();
  }
  torch::Tensor x = (torch::arange(tokens, torch::kLong) * 7 % 256).view({1, tokens});
  torch::Tensor y = x.roll(-1, 1);
  auto pass = [&](Gpt& model) {
    for (torch::Tensor& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    model->Loss(x, y).backward();
  };
  const double before = Median(runs, [&] { pass(models[0]); });
  std::vector<double> together(cores, 0);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < cores; ++i) {
    threads.emplace_back([&, i] {
      torch::AutoGradMode grad(true);
      ready.fetch_add(1);
      while (ready.load() < cores) std::this_thread::yield();
      together[i] = Median(runs, [&] { pass(models[i]); });
    });
  }
  for (std::thread& t : threads) t.join();
  const double after = Median(runs, [&] { pass(models[0]); });
  std::sort(together.begin(), together.end());
  const double alone = (before + after) / 2;
  return alone > 0 ? std::max(1.0, together[together.size() / 2] / alone) : 1.0;
}

}  // namespace

BlockCost ProbeBlockCost() {
  torch::NoGradGuard no_grad_for_setup;  // re-enabled for the passes below
  const int previous_threads = torch::get_num_threads();
  torch::set_num_threads(1);
  BlockCost cost;
  {
    torch::Tensor a = torch::rand({384, 384});
    torch::Tensor b = torch::rand({384, 384});
    const double mm = Median(7, [&] { torch::mm(a, b); });
    cost.matmul_flops_per_second = mm > 0 ? 2.0 * 384 * 384 * 384 / mm : 0;
  }
  torch::AutoGradMode grad(true);
  constexpr int kTinyD = 64, kTinyT = 16, kRefD = 256, kRefT = 128;
  const double tiny = BlockSeconds(kTinyD, kTinyT, 15);
  const double reference = BlockSeconds(kRefD, kRefT, 9);
  const double rate = cost.matmul_flops_per_second;
  // The tiny block's arithmetic, at the matmul rate, is not fixed cost.
  const double tiny_flops = 3 * BlockForwardFlops(kTinyD, kTinyT);
  cost.fixed_seconds = std::max(0.0, tiny - (rate > 0 ? tiny_flops / rate : 0));
  cost.reference_block_seconds = reference;
  const double ref_flops = 3 * BlockForwardFlops(kRefD, kRefT);
  const double beyond = reference - cost.fixed_seconds - (rate > 0 ? ref_flops / rate : 0);
  cost.seconds_per_activation = std::max(0.0, beyond) / (double{kRefD} * kRefT);
  cost.concurrent_slowdown = ConcurrentSlowdown(kRefD, kRefT, 25);
  // Two sizes: mostly latency, mostly bandwidth.
  // The large one in the regime of data-parallel gradients and ZeRO's
  // 25 MiB buckets: on this project's VM 1 MiB gave 0.44-0.84 GB/s from run
  // to run and 4 MiB a steadier 0.75-0.96.
  constexpr int64_t kSmall = 1024, kLarge = 1048576;  // 4 KiB, 4 MiB of fp32
  const double small = AllReduceSeconds(kSmall, 15);
  const double large = AllReduceSeconds(kLarge, 7);
  if (small > 0 && large > small) {
    const double bytes_per_second = 4.0 * (kLarge - kSmall) / (large - small);
    cost.allreduce_bytes_per_second = bytes_per_second;
    cost.allreduce_latency_seconds = std::max(0.0, (small - 4.0 * kSmall / bytes_per_second) / 2);
    // A tensor-parallel block of two ranks against what the figures above
    // say it costs: the rest is the ranks waiting on each other at every
    // collective (their one thread each shares the cores with Gloo's).
    double tp_block_cpu = 0;
    const double tp_block =
        std::max(0.0, TensorParallelBlockSeconds(kRefD, kRefT, 41, &tp_block_cpu));
    const double activation_bytes = 4.0 * kRefD * kRefT;
    // What the block's 4 collectives took: the block less its arithmetic
    // (half the FLOPs, the fixed and per-element costs whole).
    const double arithmetic = (rate > 0 ? ref_flops / 2 / rate : 0) + cost.fixed_seconds +
                              cost.seconds_per_activation * kRefD * kRefT;
    const double per_collective = (tp_block - arithmetic) / 4;
    // Of that, the part a rank spent off the CPU: the block's time less
    // the CPU time a rank (and Gloo's threads for it) took.
    if (tp_block > arithmetic && tp_block_cpu > 0) {
      cost.tensor_parallel_block_cpu_seconds = tp_block_cpu;
      cost.tensor_collective_idle_fraction = std::clamp(
          (tp_block - std::max(tp_block_cpu, arithmetic)) / (tp_block - arithmetic), 0.0, 1.0);
    }
    const double ring = 2 * cost.allreduce_latency_seconds + activation_bytes / bytes_per_second;
    cost.tensor_parallel_block_seconds = tp_block;
    if (tp_block > 0 && per_collective >= ring) {
      cost.tensor_collective_extra_seconds = per_collective - ring;
    } else if (tp_block > 0) {
      // The lone small all-reduce overstated the latency (a slow wake-up of
      // one of its two threads moves its median: 0.23-1.1 ms from run to
      // run here, while the block stayed within 9.8-10.7 ms): the latency
      // is what the block's collectives leave beside their bytes, so that
      // the figures add up to the block measured in place.
      cost.allreduce_latency_seconds =
          std::max(0.0, (per_collective - activation_bytes / bytes_per_second) / 2);
    }
  }
  torch::set_num_threads(previous_threads);
  return cost;
}

std::string FormatBlockCost(const BlockCost& cost) {
  return absl::StrFormat(
      "block_fixed_seconds=%.9g block_seconds_per_activation=%.9g "
      "matmul_flops_per_second=%.6g reference_block_seconds=%.9g "
      "allreduce_latency_seconds=%.9g allreduce_bytes_per_second=%.6g "
      "tensor_parallel_block_seconds=%.9g tensor_collective_extra_seconds=%.9g "
      "tensor_parallel_block_cpu_seconds=%.9g tensor_collective_idle_fraction=%.6g "
      "concurrent_slowdown=%.6g",
      cost.fixed_seconds, cost.seconds_per_activation, cost.matmul_flops_per_second,
      cost.reference_block_seconds, cost.allreduce_latency_seconds,
      cost.allreduce_bytes_per_second, cost.tensor_parallel_block_seconds,
      cost.tensor_collective_extra_seconds, cost.tensor_parallel_block_cpu_seconds,
      cost.tensor_collective_idle_fraction, cost.concurrent_slowdown);
}

}  // namespace loom::engine
