// Fused attention for BF16 q, k, v on tensor cores (attention_tiled.cu): FlashAttention-2's
// tiling, each product a WMMA bf16 product with f32 accumulation. attention.cu's entry points
// call it or attention_mma.h's register-tiled kernels where they apply, and keep their
// warp-per-row kernels for the rest (F32, other head sizes, HPM_CUDA_ATTENTION=rowwise).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace hpm::cuda {

// Which kernels BF16 attention runs where a tensor-core kernel applies, from HPM_CUDA_ATTENTION
// (read once; for comparisons on the device): unset or "mma", attention_mma.cu's; "mma16", the
// same with one 16-row query tile a warp in the forward; "wmma", this file's; "rowwise",
// attention.cu's warp-per-row kernels. Any other value is an error naming it.
enum class AttentionKernels { kMma, kMma16, kWmma, kRowwise };
AttentionKernels attention_kernels();

// Runs f(std::integral_constant<int, d>{}) for the head sizes the tensor-core kernels are made
// for (32, 64, 128); std::logic_error for another (callers check tiled_attention_applies first).
template <typename F>
void with_tensor_core_head_size(int d, F&& f) {
  switch (d) {
    case 32:
      f(std::integral_constant<int, 32>{});
      break;
    case 64:
      f(std::integral_constant<int, 64>{});
      break;
    case 128:
      f(std::integral_constant<int, 128>{});
      break;
    default:
      throw std::logic_error("tensor-core attention: head size " + std::to_string(d));
  }
}

// Head sizes 32, 64 and 128, 16-byte aligned operands, and attention_kernels() not kRowwise (nor
// kWmma where the device cannot give the WMMA kernels their shared memory).
bool tiled_attention_applies(std::int64_t d, const void* q, const void* k, const void* v,
                             const void* grad_out = nullptr);

// The same, and the run takes attention_mma.cu's kernels (mma or mma16, not wmma).
inline bool mma_attention_applies(std::int64_t d, const void* q, const void* k, const void* v,
                                  const void* grad_out = nullptr) {
  return tiled_attention_applies(d, q, k, v, grad_out) &&
         attention_kernels() != AttentionKernels::kWmma;
}

// q (batch, t, d), k and v (batch, s, d) as bf16 bits; out (batch, t, d) and lse (batch, t) in
// f32, as attention_forward's. Causal masking is top-left aligned (query i sees keys j <= i).
void tiled_attention_forward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                             float* out, float* lse, std::int64_t batch, std::int64_t t,
                             std::int64_t s, int d, bool causal, float scale, cudaStream_t stream);

// The gradients of the forward above, from grad_out (f32, rounded to bf16 for the products as the
// CPU's bf16 path does), lse and delta = rowsum(grad_out * out). gq, or gk and gv, may be null.
void tiled_attention_backward(const std::uint16_t* q, const std::uint16_t* k,
                              const std::uint16_t* v, const float* grad_out, const float* lse,
                              const float* delta, float* gq, float* gk, float* gv,
                              std::int64_t batch, std::int64_t t, std::int64_t s, int d,
                              bool causal, float scale, cudaStream_t stream);

}  // namespace hpm::cuda
