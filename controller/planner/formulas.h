// The closed-form pieces of the planner's cost model, one function per
// formula, each citing its source. Units: bytes, seconds, bytes/second.
// Pure functions; thread-safe.
#ifndef LOOM_CONTROLLER_PLANNER_FORMULAS_H_
#define LOOM_CONTROLLER_PLANNER_FORMULAS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "controller/planner/model.h"

namespace loom::planner {

enum class Recompute {
  kNone,       // keep every activation
  kSelective,  // recompute attention scores only (Korthikanti et al. 2022)
  kFull,       // keep each layer's input, recompute the layer in backward
};
absl::string_view RecomputeName(Recompute recompute);  // "none", ...

// Ring all-reduce of `bytes` over n ranks: each rank sends and receives
// 2(n-1)/n x bytes (Patarasuk & Yuan 2009; the chapter's "network wall",
// lines 1501-1512), plus 2(n-1) latency hops. 0 when n <= 1.
double RingAllReduceSeconds(double bytes, int n, double bandwidth_bytes_per_second,
                            double latency_seconds);
// Ring all-gather or reduce-scatter of a `bytes`-sized full buffer:
// (n-1)/n x bytes, (n-1) hops (Rajbhandari et al. 2020, ZeRO, Sec. 7).
double RingAllGatherSeconds(double bytes, int n, double bandwidth_bytes_per_second,
                            double latency_seconds);
// Fraction of time spent computing when communication is not hidden:
// eta = T_compute / (T_compute + T_comm) (the chapter, line 1512).
double ComputeFraction(double compute_seconds, double exposed_comm_seconds);
// Pipeline bubble as a fraction of ideal time: (p-1)/m for GPipe/1F1B,
// (p-1)/(m v) interleaved (Narayanan et al. 2021, Sec. 2.2.1-2.2.2).
double PipelineBubbleFraction(int pp, int64_t micro_batches, int virtual_stages);
// How attention is computed, which decides whether the s x s score matrix
// is ever stored.
enum class AttentionKernel {
  // FlashAttention-style (Dao et al. 2022): scores are formed block by block
  // in on-chip memory and recomputed in backward; only the output and the
  // per-row softmax statistics are kept. What Loom's engine always runs
  // (SDPA / FlashAttention on GPU, a blocked kernel on CPU).
  kFused,
  // Softmax and dropout materialized as s x s tensors, as Korthikanti et al.
  // 2022 count them (Megatron-LM before fused attention).
  kUnfused,
};

// What the training framework's kernels keep and move that the layout does
// not decide. The defaults are Loom's planning assumptions; the
// published-runs suite sets them per run to the framework the run used.
struct Kernels {
  AttentionKernel attention = AttentionKernel::kFused;
  // Dropout in the blocks: a 1-byte mask per element after attention and
  // after the MLP, and on the scores with kUnfused (Korthikanti et al.
  // 2022 count them). false for models trained without dropout (Llama 3,
  // GPT-NeoX-20B): nothing is stored and the score passes are fewer.
  bool dropout = true;
  // Gated MLP: true when backward recomputes act(gate) from the stored gate
  // (a fused SwiGLU kernel, as Megatron-Core's bias_swiglu), which keeps
  // gate, up and their product (6sbf); false when autograd also stores the
  // activation (8sbf, an eager framework's SiLU then multiply).
  bool gated_activation_recomputed = false;
};

// Stored activation bytes of one transformer layer for one micro-batch of
// `micro_batch` sequences (Korthikanti et al. 2022, Sec. 4-5, Eqs. 1-3; with
// kFused without the 5as^2b score terms; see formulas.cc for the
// generalization to GQA, other MLP widths and no dropout).
double ActivationBytesPerLayer(const ModelSpec& model, int64_t micro_batch, int tp,
                               bool sequence_parallel, Recompute recompute,
                               double bytes_per_element, const Kernels& kernels);

// Device-memory bytes that materialized attention scores (kUnfused) move
// per layer, per micro-batch, on one of `tp` ranks, in the elementwise
// kernels between the two score GEMMs: the softmax and dropout forward, their
// backward, and the forward again when `recompute` reruns attention. 0 for
// kFused, whose scores stay on chip. These passes are bound by memory
// bandwidth, not FLOPs, and grow with s^2 (see formulas.cc).
double UnfusedScoreTrafficBytes(const ModelSpec& model, int64_t micro_batch, int tp,
                                Recompute recompute, double bytes_per_element,
                                const Kernels& kernels);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_FORMULAS_H_
