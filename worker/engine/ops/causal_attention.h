// Causal self-attention for CPU fp32 without materialising the masked
// score matrix. LibTorch 1.13, the CPU build Debian
// ships, has no scaled_dot_product_attention; the unfused expression
//
//   softmax(mask(Q·Kᵀ · s)) · V,  s = 1/√hd
//
// runs as separate passes (transposed copies of Q, K and V, a batched
// matrix product over all T×T scores, a scale, a masked fill, a softmax,
// and as many again in backward) and computes every score above the
// diagonal only to throw it away.
//
// CausalSelfAttention reads Q, K and V in place from the fused projection
// qkv = x·W_attnᵀ + b ([B, T, 3·d]: q | k | v, each split into n_head
// heads of hd = d / n_head consecutive columns) and writes y [B, T, d] with
// the heads side by side, ready for the output projection: no transposes,
// no copies. Per (batch, head), rows are processed in blocks of kRowBlock:
// the block's scores against the keys it may see (columns 0 .. end of the
// block) are one matrix product with the scale folded in, the causal
// softmax is one in-cache pass per row (exp of the visible entries, zeros
// above the diagonal), and P·V is another product. Backward does the same
// per block: dP = dY·Vᵀ, dS = P ⊙ (dP − rowsum(P ⊙ dP)) in one pass, then
// dQ, dK and dV as three products. Blocks skip the upper triangle: for T 256
// and blocks of 64 rows, 10 of the 16 score tiles are computed.
//
// Matrix products go to the BLAS LibTorch uses (Fortran sgemm_), one
// (batch, head) per OpenMP thread; with OpenBLAS's OpenMP build (the
// flavour scripts/install-deps.sh selects) a BLAS call inside a parallel
// region runs on the calling thread. Memory: the probabilities P
// [B, n_head, T, T] are kept for backward, as the unfused path keeps them.
//
// Grouped-query attention and rotary positions run inside the same kernel
// (GroupedCausalSelfAttention): each query head reads its key/value head in
// place (no copies repeated per query head), and with rotary positions each
// (batch, head) rotates its queries and its keys into a [T, hd] scratch
// before the products; backward rotates dQ and dK back, and sums the dK and
// dV of the query heads sharing a key/value head in a fixed order (one
// partial per head, so no two threads write one place).
//
// Numerics: fp32, agreeing with the unfused expression to ~1e-6
// (causal_attention_test.cc). A row whose visible scores hold a NaN or an
// infinity comes out NaN (and so do its gradients), so that the trainer's
// non-finite checks see it. No dropout on the probabilities: callers use
// the unfused path when attention dropout is active.
#ifndef LOOM_WORKER_ENGINE_OPS_CAUSAL_ATTENTION_H_
#define LOOM_WORKER_ENGINE_OPS_CAUSAL_ATTENTION_H_

#include <cstdint>

#include <torch/types.h>

namespace loom::engine {

// Rows per block (a multiple of 16, the AVX-512 lane count).
inline constexpr int64_t kCausalAttentionRowBlock = 64;

// True when CausalSelfAttention handles `qkv`: a CPU fp32 tensor [B, T, 3·d]
// with d divisible by n_head.
bool CausalSelfAttentionSupports(const torch::Tensor& qkv, int64_t n_head);

// True when GroupedCausalSelfAttention handles its arguments: a CPU fp32
// qkv [B, T, (n_head + 2·n_kv_head)·hd] with n_kv_head dividing n_head, and
// either no tables or CPU fp32 cos and sin of T·hd elements ([T, hd] or
// [T, 1, hd], as MakeRotaryTables makes them) with hd even.
bool GroupedCausalSelfAttentionSupports(const torch::Tensor& qkv, int64_t n_head,
                                        int64_t n_kv_head, const torch::Tensor& cos,
                                        const torch::Tensor& sin);

// y [B, T, n_head·hd]: causal attention of the fused projection
// qkv = [q (n_head heads) | k | v (n_kv_head heads each)], query head h
// using key/value head h / (n_head / n_kv_head), with queries and keys
// rotated by the tables (x·cos + rotate_half(x)·sin, gpt.h's ApplyRotary)
// when they are defined. Equals CausalSelfAttention of gpt.h's ExpandQkv of
// qkv; differentiable with respect to qkv (not the tables). Throws
// c10::Error when !GroupedCausalSelfAttentionSupports.
torch::Tensor GroupedCausalSelfAttention(const torch::Tensor& qkv, int64_t n_head,
                                         int64_t n_kv_head, const torch::Tensor& cos,
                                         const torch::Tensor& sin);

// y [B, T, d] = concatenation over heads h of
// softmax(causal(Q_h·K_hᵀ / √hd))·V_h, differentiable with respect to qkv.
// Throws c10::Error when !CausalSelfAttentionSupports(qkv, n_head).
torch::Tensor CausalSelfAttention(const torch::Tensor& qkv, int64_t n_head);

// What the GPT's attention calls: y [B, T, d] as above, with dropout of
// probability `dropout` on the probabilities. LibTorch 2.x:
// torch::scaled_dot_product_attention(is_causal) on any device (flash /
// memory-efficient kernels on GPU). LibTorch 1.13, which has no SDPA:
// CausalSelfAttention when it supports qkv and dropout is 0, else the
// unfused reference.
torch::Tensor CausalAttention(const torch::Tensor& qkv, int64_t n_head, double dropout = 0.0);

// The unfused reference (any device or dtype): the expression above with
// LibTorch operators, with dropout of probability `dropout` on the attention
// probabilities when it is > 0. For tests and for inputs the kernel does
// not handle.
torch::Tensor CausalSelfAttentionReference(const torch::Tensor& qkv, int64_t n_head,
                                           double dropout = 0.0);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPS_CAUSAL_ATTENTION_H_
