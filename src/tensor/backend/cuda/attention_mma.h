// Fused attention for BF16 q, k, v on tensor cores with every tile in registers
// (attention_mma.cu): FlashAttention-2's tiling on mma.sync m16n8k16. The contract of
// attention_tiled.h's WMMA kernels (which HPM_CUDA_ATTENTION=wmma picks instead), over rows laid
// out either as attention_forward's tensors or as a packed (B, T, 3E) qkv with a merged output.
#pragma once
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

namespace hpm::cuda {

// Where the rows of each problem (one head of one batch element: p = b x heads + h) are: row i
// of a tensor at its base + (p / heads) x rows x stride + (p % heads) x d + i x stride.
struct AttentionLayout {
  std::int64_t heads;            // problems per batch element
  std::int64_t q, kv, out;       // row strides in elements: of q; of k and v; of out and grad_out
  std::int64_t grad_q, grad_kv;  // of q's gradient; of k's and v's
};

// attention_forward's tensors: (problems, rows, d) each.
inline AttentionLayout contiguous_attention(std::int64_t d) { return {1, d, d, d, d, d}; }

// A packed qkv (B, T, 3E) (q, k and v side by side; head h at columns h x d of each, E = heads x
// d), its output and output gradient merged (B, T, E), its gradient packed as qkv.
inline AttentionLayout packed_attention(std::int64_t heads, std::int64_t d) {
  const std::int64_t e = heads * d;
  return {heads, 3 * e, 3 * e, e, 3 * e, 3 * e};
}

// Whether mma_attention_forward takes `scale`: it folds the scale into its exponent, the softmax's
// max taken over raw scores and masked ones -inf, which needs a finite scale > 0 (0 would make
// them NaN; callers run another kernel otherwise; the backward takes any).
inline bool mma_forward_takes(float scale) { return std::isfinite(scale) && scale > 0.0f; }

// q (problems of t rows), k and v (of s rows) as bf16 bits, d 32, 64 or 128, every row start
// 16-byte aligned; out F32, or BF16 bits when out_bf16 (rounded once); lse (problems, t) F32.
// Causal masking is top-left aligned (query i sees keys j <= i). std::invalid_argument for a
// scale mma_forward_takes refuses.
void mma_attention_forward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                           void* out, bool out_bf16, float* lse, std::int64_t problems,
                           std::int64_t t, std::int64_t s, int d, bool causal, float scale,
                           const AttentionLayout& layout, cudaStream_t stream);

// delta (problems, t) = rowsum(grad_out * out), grad_out F32 or BF16 bits (grad_bf16) and out F32
// or BF16 bits (out_bf16), both laid out as layout.out says; and an F32 grad_out rounded to bf16
// into grad_out_bf16 (the same layout, and the operand mma_attention_backward reads, rounded once
// as the CPU's bf16 path rounds it). A BF16 grad_out is that operand itself: grad_out_bf16 is
// then not written (it may be null).
void mma_attention_delta(const void* grad_out, bool grad_bf16, const void* out, bool out_bf16,
                         float* delta, std::uint16_t* grad_out_bf16, std::int64_t problems,
                         std::int64_t t, int d, const AttentionLayout& layout, cudaStream_t stream);

// The 4-byte elements of scratch mma_attention_backward's one pass needs for these sizes (the
// caller allocates it, at least 8-byte aligned): an f32 sum of q's gradient and a turn counter a
// query tile. 0 under HPM_CUDA_ATTENTION_ONE_PASS=0, which runs no one pass: nothing to allocate.
std::int64_t mma_attention_scratch_elements(std::int64_t problems, std::int64_t t, int d);

// The gradients of the forward above from grad_out_bf16 (mma_attention_delta's), lse and delta;
// gq, gk and gv F32, or BF16 bits when grad_bf16 (each rounded once). gq, or gk and gv, may be
// null. With all three wanted and `scratch` (mma_attention_scratch_elements' size) given, one
// kernel computes them, each key block adding its share of gq in a fixed order (FlashAttention-2's
// five products a tile, not the two-kernel path's seven; the same bits from run to run); else,
// or under HPM_CUDA_ATTENTION_ONE_PASS=0, a kernel for gk and gv and one for gq.
void mma_attention_backward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                            const std::uint16_t* grad_out_bf16, const float* lse,
                            const float* delta, void* gq, void* gk, void* gv, bool grad_bf16,
                            std::int64_t problems, std::int64_t t, std::int64_t s, int d,
                            bool causal, float scale, const AttentionLayout& layout,
                            cudaStream_t stream, void* scratch = nullptr);

}  // namespace hpm::cuda
