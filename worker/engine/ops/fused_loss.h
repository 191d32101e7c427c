// Fused, chunked LM head + softmax cross-entropy.
//
// The unfused language-model loss materialises logits [N, V] = hidden @ W^T,
// then log_softmax [N, V], then in backward a gradient [N, V] (zero-filled
// first) and another for the logits: four single-pass, memory-bound sweeps
// over N·V floats (N tokens, V ≈ 50k vocabulary) around the matrix products.
// This computes the same mean cross-entropy by chunks of rows (tokens):
//
//   for each chunk c of rows:
//     Z   = hidden_c @ W^T                        [C, V]  (GEMM)
//     per row i (one pass over Z_i, kept in cache):
//       lse_i  = max_i + log Σ_j exp(Z_ij − max_i)
//       loss  += lse_i − Z_i,t_i
//       G_ij   = (softmax(Z_i)_j − [j = t_i]) / N    (d loss / d Z, in place)
//     grad_hidden_c  = G @ W                        [C, d]  (GEMM)
//     grad_W        += G^T @ hidden_c               [V, d]  (GEMM)
//
// i.e. the gradient with respect to hidden and W is computed during the
// forward pass (as llm.c's fused classifier and Liger-Kernel's fused linear
// cross-entropy do), so only a [C, V] chunk ever exists and the softmax and
// its gradient are one in-cache pass per row. Backward multiplies the stored
// gradients by the incoming scalar gradient. The matrix-product FLOPs are
// those of the unfused forward + backward (2·N·V·d each, three of them).
//
// Memory: grad_hidden [N, d] and grad_W [V, d] are held from forward to
// backward (W's gradient is needed anyway), plus one [C, V] chunk, instead of
// three to four [N, V] buffers.
//
// When no input requires a gradient (or grad mode is off: validation), only
// the loss is computed: the GEMM and one pass per row.
//
// Two implementations of the same algorithm, chosen per call:
//   * fp32 CPU tensors: the row kernel below (AVX-512/AVX2), multi-threaded
//     over the rows of a chunk;
//   * anything else (CUDA tensors, bf16 or fp16 hidden and weight, or
//     FusedLossOptions::force_generic): LibTorch operations only (matmul,
//     logsumexp, exp, scatter_add), so it runs on any device without a host
//     round trip per chunk. Products run in the inputs' dtype with fp32
//     accumulation; logits, softmax and the chunk's gradient are fp32; the
//     gradient is rounded to the inputs' dtype for the two products, and
//     grad_W is summed over chunks in fp32.
//
// Lower-precision products for fp32 inputs (FusedLossOptions::matmul_dtype,
// what the model asks for on a GPU under bf16 or fp16 training): the three
// matrix products take bf16 (or fp16) copies of hidden and W, with fp32
// accumulation, as autocast would run an unfused head; everything else stays
// as above in fp32, and the gradients come back in fp32. The chunk's gradient
// G is rounded unscaled, softmax − onehot in [−1, 1] (the 1/N is applied to
// the fp32 products), so that fp16's narrow range loses no more of it than
// of the logits; grad_W is summed over chunks in fp32 and never rounded.
//
// Numerics: with fp32 inputs, fp32 throughout, sums of exponentials in fp32
// per row and the loss accumulated in double; either implementation agrees
// with torch::nn::functional::cross_entropy(hidden @ W^T, targets) to 1e-5
// (fused_loss_test.cc). With bf16/fp16 inputs the logits carry that dtype's
// rounding, as the unfused loss under autocast does. Non-finite logits
// propagate to a non-finite loss and gradients.
#ifndef LOOM_WORKER_ENGINE_OPS_FUSED_LOSS_H_
#define LOOM_WORKER_ENGINE_OPS_FUSED_LOSS_H_

#include <cstdint>

#include <torch/types.h>

#include "worker/engine/ops/cpu_features.h"

namespace loom::engine {

struct FusedLossOptions {
  // Rows (tokens) per chunk; 0 = automatic: as many as keep the [C, V]
  // chunk within chunk_bytes, at least 1, at most N. Larger chunks make
  // larger, more efficient matrix products and fewer read-modify-writes of
  // grad_W: on the benchmark configuration (N 2048, V 50304) 256 MB (2 chunks)
  // ran the training step ~4% faster than 64 MB (7 chunks).
  int64_t chunk_rows = 0;
  int64_t chunk_bytes = int64_t{256} << 20;
  // Use the LibTorch-operations implementation even for fp32 CPU tensors
  // (tests and benchmarks: it is the one GPUs run).
  bool force_generic = false;
  // The dtype of the three matrix products: Undefined (default) = the
  // inputs' dtype; bf16 or fp16 with fp32 inputs = lower-precision products
  // with fp32 accumulation and fp32 gradients (see above; always the
  // LibTorch-operations implementation). Any other value is refused.
  c10::ScalarType matmul_dtype = c10::ScalarType::Undefined;
};

// Mean over the N rows of −log softmax(hidden @ weight^T)[row, target].
// hidden: [N, d] (any leading shape is flattened: [..., d]); weight:
// [V, d] of hidden's dtype (fp32, bf16 or fp16; fp32 with a lower
// options.matmul_dtype); targets: int64 with
// hidden's leading shape, each in [0, V); all three on one device (any).
// Returns a 0-dim fp32 tensor on that device, differentiable with respect to
// hidden and weight (their gradients have their dtype). An enclosing
// autocast region does not change the products' dtype. Throws c10::Error on
// bad shapes, dtypes or devices, or targets out of range (checking the
// targets of device tensors costs one host synchronisation).
torch::Tensor FusedLinearCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                      const torch::Tensor& targets,
                                      const FusedLossOptions& options = {});

// The per-row kernel, exposed for tests and benchmarks: for each of `rows`
// rows of `logits` ([rows, vocab], row-major, contiguous), returns in
// row_loss[i] the cross-entropy lse_i − logits[i, target[i]] and, if
// grad_scale != 0, overwrites the row with grad_scale · (softmax − onehot).
// Multi-threaded over rows (OpenMP); `simd` picks the kernel (kAuto: the
// best the CPU has; asking for more than it has is clamped to that).
void SoftmaxCrossEntropyRows(float* logits, int64_t rows, int64_t vocab, const int64_t* target,
                             double grad_scale, double* row_loss,
                             SimdLevel simd = SimdLevel::kAuto);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPS_FUSED_LOSS_H_
