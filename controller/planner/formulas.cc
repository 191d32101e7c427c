#include "controller/planner/formulas.h"

#include <algorithm>

namespace loom::planner {

absl::string_view RecomputeName(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

double RingAllReduceSeconds(double bytes, int n, double bandwidth, double latency) {
  if (n <= 1) return 0;
  // Each rank sends 2(n-1)/n of the buffer: reduce-scatter then all-gather
  // around the ring (Patarasuk & Yuan 2009; the chapter, lines 1501-1512).
  return 2.0 * (n - 1) / n * bytes / bandwidth + 2.0 * (n - 1) * latency;
}

double RingAllGatherSeconds(double bytes, int n, double bandwidth, double latency) {
  if (n <= 1) return 0;
  // Half of the all-reduce: (n-1)/n of the full buffer per rank.
  return static_cast<double>(n - 1) / n * bytes / bandwidth + (n - 1) * latency;
}

double ComputeFraction(double compute_seconds, double exposed_comm_seconds) {
  const double total = compute_seconds + exposed_comm_seconds;
  return total > 0 ? compute_seconds / total : 0;
}

double PipelineBubbleFraction(int pp, int64_t micro_batches, int virtual_stages) {
  if (pp <= 1 || micro_batches <= 0) return 0;
  // Narayanan et al. 2021, Sec. 2.2.1 (1F1B: (p-1)/m) and 2.2.2
  // (interleaved: (p-1)/(m v)).
  return static_cast<double>(pp - 1) /
         (static_cast<double>(micro_batches) * std::max(1, virtual_stages));
}

double ActivationBytesPerLayer(const ModelSpec& model, int64_t micro_batch, int tp,
                               bool sequence_parallel, Recompute recompute,
                               double bytes_per_element, const Kernels& kernels) {
  const double s = static_cast<double>(model.seq_len);
  const double b = static_cast<double>(micro_batch);
  const double h = static_cast<double>(model.d_model);
  const double a = static_cast<double>(model.n_head);
  const double f = static_cast<double>(FfnHidden(model));
  const double h_kv = h * static_cast<double>(KvHeads(model)) / a;
  const double t = static_cast<double>(std::max(1, tp));
  const bool sp = sequence_parallel && tp > 1;
  // Korthikanti et al. 2022 count 16-bit activations and 1-byte dropout
  // masks; fp32 training roughly doubles everything.
  const double scale = bytes_per_element / 2.0;
  const double sbh = s * b * h;
  if (recompute == Recompute::kFull) {
    // Sec. 5: full recomputation keeps only each layer's input, 2sbh
    // (split over t with sequence parallelism).
    return scale * 2.0 * sbh / (sp ? t : 1.0);
  }
  // Sec. 4.1, per layer: attention 11sbh + 5as^2b, MLP 19sbh, norms 4sbh,
  // i.e. sbh(34 + 5as/h) (Eq. 1). Of the 34, 10 sbh stay replicated under
  // tensor parallelism (norm inputs 4, QKV and MLP inputs 2 + 2, dropout
  // masks 2) and 24 sbh are split (Eq. 2: sbh(10 + 24/t + 5as/(ht))):
  //   Q 2sbh, K and V 2sbh each, out-projection input 2sbh, MLP 4h-wide
  //   activation before and after GELU 8sbh each.
  // Loom generalizes the split part to GQA (K, V are 2 s b h_kv each) and
  // to an f-wide MLP (4sbf; a gated MLP keeps gate and up (4sbf) and the
  // product (2sbf), and the activation too (2sbf) unless backward
  // recomputes it). Without dropout the two masks go. For the GPT defaults
  // it is exactly Eqs. 1-2.
  const double replicated = (kernels.dropout ? 10.0 : 8.0) * sbh;
  const double mlp =
      model.gated_mlp ? (kernels.gated_activation_recomputed ? 6.0 : 8.0) : 4.0;
  const double split = 2.0 * sbh + 4.0 * s * b * h_kv + 2.0 * sbh + mlp * s * b * f;
  // The attention scores: softmax output 2as^2b, dropout mask as^2b,
  // dropout output 2as^2b. Selective recompute drops them (Sec. 5).
  // A fused kernel never stores them (Dao et al. 2022, FlashAttention,
  // Sec. 3.1 and Alg. 1: S and P live in SRAM tiles and are recomputed in
  // backward; the dropout mask is regenerated from the RNG state). It keeps
  // the output O (the out-projection input, counted above) and per query row
  // the softmax statistics, one fp32 log-sum-exp per head and token (the m
  // and l of Alg. 1, stored as one value by FlashAttention-2): 4asb bytes
  // whatever the activation precision, split over the heads' t ranks.
  double scores = 0;
  double softmax_statistics = 0;
  if (kernels.attention == AttentionKernel::kFused) {
    softmax_statistics = 4.0 * a * s * b / t;
  } else if (recompute != Recompute::kSelective) {
    scores = (kernels.dropout ? 5.0 : 2.0) * a * s * s * b;
  }
  if (sp) {
    // Eq. 3 (sequence parallelism splits the replicated part too):
    // sbh/t (34 + 5as/h); with selective recompute 34 sbh/t (Sec. 5).
    return scale * (replicated + split + scores) / t + softmax_statistics;
  }
  return scale * (replicated + (split + scores) / t) + softmax_statistics;
}

double UnfusedScoreTrafficBytes(const ModelSpec& model, int64_t micro_batch, int tp,
                                Recompute recompute, double bytes_per_element,
                                const Kernels& kernels) {
  if (kernels.attention != AttentionKernel::kUnfused) return 0;
  const double s = static_cast<double>(model.seq_len);
  const double elements = static_cast<double>(model.n_head) * s * s *
                          static_cast<double>(micro_batch) /
                          static_cast<double>(std::max(1, tp));
  // Bytes per score element at 16 bits (Megatron-LM's fused
  // scale-mask-softmax: one read of the scores, one write of the
  // probabilities). Forward: softmax 4; dropout reads the probabilities
  // and writes its output and 1-byte mask, 5. Backward: dropout's reads the
  // incoming gradient and the mask and writes, 5; softmax's reads the
  // gradient and the probabilities and writes, 6. The two batched GEMMs that
  // make and consume the scores are counted as FLOPs, not here.
  const double forward = kernels.dropout ? 9.0 : 4.0;
  const double backward = kernels.dropout ? 11.0 : 6.0;
  // Full recompute reruns the whole forward; selective recompute exists to
  // rerun exactly this part (Korthikanti et al. 2022, Sec. 5).
  const double recomputed = recompute == Recompute::kNone ? 0.0 : forward;
  return elements * (forward + backward + recomputed) * bytes_per_element / 2.0;
}

}  // namespace loom::planner
