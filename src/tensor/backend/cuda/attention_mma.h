// Fused attention for BF16 q, k, v on tensor cores with every tile in registers
// (attention_mma.cu): FlashAttention-2's tiling on mma.sync m16n8k16. The same contract as
// attention_tiled.h's WMMA kernels, which HPM_CUDA_ATTENTION=wmma picks instead.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace hpm::cuda {

// q (batch, t, d), k and v (batch, s, d) as bf16 bits, 16-byte aligned, d 32, 64 or 128; out
// (batch, t, d) and lse (batch, t) in f32. Causal masking is top-left aligned (query i sees keys
// j <= i).
void mma_attention_forward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                           float* out, float* lse, std::int64_t batch, std::int64_t t,
                           std::int64_t s, int d, bool causal, float scale, cudaStream_t stream);

// The gradients of the forward above from grad_out (f32, rounded to bf16 for the products as the
// CPU's bf16 path does), lse and delta = rowsum(grad_out * out). gq, or gk and gv, may be null.
void mma_attention_backward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                            const float* grad_out, const float* lse, const float* delta, float* gq,
                            float* gk, float* gv, std::int64_t batch, std::int64_t t,
                            std::int64_t s, int d, bool causal, float scale, cudaStream_t stream);

}  // namespace hpm::cuda
