// What one transformer block costs this process beyond its matrix products:
// the planner's compute model for CPU ranks (controller/admission/job_planning.h,
// TopologyForSpec) is FLOPs / GEMM rate, which for the small tensors of a
// CPU rank leaves out most of the time (LibTorch dispatch and autograd per
// operation, LayerNorm, GELU, softmax, residual adds). The probe times a
// block's forward + backward at two shapes on one thread, as the difference
// between a 3-block and a 1-block GPT (so embeddings and the loss cancel):
//   * a tiny one (d 64, 16 tokens), whose FLOPs are negligible: the fixed
//     seconds per block and micro-batch;
//   * a reference one (d 256, 128 tokens): its time beyond the fixed part
//     and beyond its FLOPs at the same process's matmul rate is the work
//     that grows with the activations (normalisation, activation functions,
//     softmax, residuals, their backward), per element of the block's
//     [tokens, d] activation.
// The planner then models a block's forward + backward on one micro-batch
// as fixed + FLOPs / GEMM rate + seconds_per_activation x tokens x d.
// Takes about a second. Not thread-safe (sets LibTorch's thread count to 1
// and seeds the global generator).
#ifndef LOOM_WORKER_ENGINE_BLOCK_PROBE_H_
#define LOOM_WORKER_ENGINE_BLOCK_PROBE_H_

#include <string>

namespace loom::engine {

// And what an all-reduce between two ranks of this machine costs (the
// tensor-parallel collectives of CPU ranks in one worker): two in-process
// Gloo ranks on loopback time all-reduces of 4 KiB and 4 MiB, and
//   t(bytes) = 2 x latency + bytes / bandwidth
// (RingAllReduceSeconds for two ranks) is solved for the two; when the
// latency that gives leaves no room for the tensor-parallel block below
// (the lone small all-reduce is the noisier figure), the latency is taken
// from the block instead.
struct BlockCost {
  double fixed_seconds = 0;           // per block, forward + backward, one micro-batch
  double seconds_per_activation = 0;  // per element of [tokens, d], forward + backward
  double matmul_flops_per_second = 0;  // one thread's fp32 384^3 matmul, for reference
  double reference_block_seconds = 0;  // the reference shape's block, measured
  double allreduce_latency_seconds = 0;      // per ring step; 0 = not measured
  double allreduce_bytes_per_second = 0;     // the ring's bandwidth; 0 = not measured
  // A 2-rank tensor-parallel block at the reference shape, measured, less
  // what the figures above predict for it (half its FLOPs at the matmul
  // rate, the fixed and per-element costs whole, 4 ring all-reduces of its
  // activation), per all-reduce; 0 = not measured or none.
  double tensor_collective_extra_seconds = 0;
  double tensor_parallel_block_seconds = 0;  // that block, measured
  // The CPU time one rank of that block took (its thread's and, shared out,
  // Gloo's), and the fraction of its collectives' time (the block less its
  // arithmetic) that was not CPU time: waiting on the other rank, wake-ups.
  // Ranks that time-share cores can use those waits to run each other; the
  // planner counts the rest as work holding a core. 0 = not measured (all
  // of it then counts as work).
  double tensor_parallel_block_cpu_seconds = 0;
  double tensor_collective_idle_fraction = 0;
  // A reference block's time on one thread while every core of the
  // process's CPU set runs one too, over its time alone: >= 1 (1 with one
  // core). Ranks filling a host compute this much slower than the figures
  // above, which are one thread's alone.
  double concurrent_slowdown = 1;
};

BlockCost ProbeBlockCost();

// "block_fixed_seconds=<x> block_seconds_per_activation=<y>
// matmul_flops_per_second=<z> reference_block_seconds=<w>
// allreduce_latency_seconds=<a> allreduce_bytes_per_second=<b>
// tensor_parallel_block_seconds=<t> tensor_collective_extra_seconds=<e>
// tensor_parallel_block_cpu_seconds=<c> tensor_collective_idle_fraction=<i>
// concurrent_slowdown=<s>":
// one line,
// what `loom-rank --probe` prints.
std::string FormatBlockCost(const BlockCost& cost);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_BLOCK_PROBE_H_
