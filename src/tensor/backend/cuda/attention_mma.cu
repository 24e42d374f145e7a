// Fused attention for BF16 q, k, v on tensor cores, FlashAttention-2's way with every tile in
// registers: each product is a warp's mma.sync m16n8k16 (bf16 in, f32 accumulating), and a
// product's accumulator fragments become the next product's A operand without leaving the
// registers (the score tile S turns into P for P V; dP and P into dS for dS K). attention_tiled.cu
// keeps the WMMA version of the same tiling (its accumulators round-trip through shared memory;
// HPM_CUDA_ATTENTION=wmma picks it).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), for
// lane = 4 g + q (g = 0..7, q = 0..3):
//   A (16 x 16, row-major): 4 registers of 2 bf16: (row g, cols 2q, 2q+1), (row g+8, same cols),
//                           (row g, cols 2q+8, 2q+9), (row g+8, cols 2q+8, 2q+9);
//   B (16 x 8, k x n):      2 registers: (rows 2q, 2q+1, col g), (rows 2q+8, 2q+9, col g);
//   C (16 x 8, f32):        c0, c1 at (row g, cols 2q, 2q+1), c2, c3 at (row g+8, same cols).
// So a row's values sit in one quad of lanes (a shuffle over lane bits 0 and 1 reduces it), and
// two adjacent C tiles are, packed to bf16 pairs, exactly the A fragment of a 16-wide k step.
//
// Shared-memory tiles are bf16 rows padded by 8 elements, and fragments come from them by
// ldmatrix (four 8 x 8 matrices an instruction; .trans for the B operands whose k runs along the
// tile's rows: V in P V, K in dS K, dO and Q in the dk/dv products): the 8 rows of each matrix
// then start in distinct bank quads.
//
// Forward: a block of 4 warps owns 64 queries (16 a warp); key tiles of 64 are double-buffered
// with cp.async. The online softmax keeps each row's max m (quad-uniform) and a per-lane partial
// sum l, summed over the quad once at the end; P = exp(scale S - m) is rounded to bf16 for P V
// (the CPU rounds normalized probabilities: the two differ by bf16 rounding, the conformance
// tolerance). out = O / l, lse = m + log(l).
//
// Backward, with P = exp(scale S - lse) recomputed and dS = P (dP - Delta), as attention_tiled.cu:
// one kernel for dk and dv (a block per 64 keys, looping over the query tiles that see them) and
// one for dq (a block per 64 queries), so every gradient row has one owner and every sum a fixed
// order: bit-identical from run to run, at two products more than one kernel with atomic dq.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tensor/backend/cuda/attention_mma.h"
#include "tensor/backend/cuda/attention_mma_kernels.cuh"
#include "tensor/backend/cuda/attention_tiled.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

// Runs f(Out{}) with Out float, or std::uint16_t (bf16 bits) when bf16.
template <typename F>
void with_element(bool bf16, F&& f) {
  if (bf16) {
    f(std::uint16_t{});
  } else {
    f(float{});
  }
}

}  // namespace

void mma_attention_forward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                           void* out, bool out_bf16, float* lse, std::int64_t problems,
                           std::int64_t t, std::int64_t s, int d, bool causal, float scale,
                           const AttentionLayout& layout, cudaStream_t stream) {
  if (problems * t == 0) return;
  with_tensor_core_head_size(d, [&](auto size) {
    constexpr int kD = decltype(size)::value;
    // Two query tiles a warp, except at head size 128 (the registers: that kernel is not even
    // made), for 64 queries or fewer (the second tile's warps would idle), or where a run asks
    // for one (HPM_CUDA_ATTENTION=mma16: the device's A/B).
    const bool one_tile = t <= kForwardRows<1> || attention_kernels() == AttentionKernels::kMma16;
    with_element(out_bf16, [&](auto element) {
      using Out = decltype(element);
      const auto launch = [&](auto tiles) {
        constexpr int kM = decltype(tiles)::value;
        auto* kernel = mma_forward_kernel<kD, kM, Out>;
        allow_dynamic_smem(kernel, kForwardSmem<kD, kM>);
        kernel<<<row_blocks(problems, t, kForwardRows<kM>), kThreads, kForwardSmem<kD, kM>,
                 stream>>>(q, k, v, static_cast<Out*>(out), lse, t, s, causal, scale, layout);
        HPM_CUDA_LAUNCH_CHECK("mma_forward_kernel");
      };
      if constexpr (kD == 128) {
        launch(std::integral_constant<int, 1>{});
      } else if (one_tile) {
        launch(std::integral_constant<int, 1>{});
      } else {
        launch(std::integral_constant<int, 2>{});
      }
    });
  });
}

void mma_attention_delta(const float* grad_out, const void* out, bool out_bf16, float* delta,
                         std::uint16_t* grad_out_bf16, std::int64_t problems, std::int64_t t, int d,
                         const AttentionLayout& layout, cudaStream_t stream) {
  if (problems * t == 0) return;
  with_tensor_core_head_size(d, [&](auto size) {
    constexpr int kD = decltype(size)::value;
    with_element(out_bf16, [&](auto element) {
      using O = decltype(element);
      attention_delta_kernel<kD, O><<<blocks_for(problems * t, kWarps), kThreads, 0, stream>>>(
          grad_out, static_cast<const O*>(out), delta, grad_out_bf16, problems, t, layout);
      HPM_CUDA_LAUNCH_CHECK("attention_delta_kernel");
    });
  });
}

void mma_attention_backward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                            const std::uint16_t* grad_out, const float* lse, const float* delta,
                            void* gq, void* gk, void* gv, bool grad_bf16, std::int64_t problems,
                            std::int64_t t, std::int64_t s, int d, bool causal, float scale,
                            const AttentionLayout& layout, cudaStream_t stream) {
  with_tensor_core_head_size(d, [&](auto size) {
    constexpr int kD = decltype(size)::value;
    with_element(grad_bf16, [&](auto element) {
      using Grad = decltype(element);
      if (gq != nullptr && problems * t > 0) {
        auto* kernel = mma_grad_q_kernel<kD, Grad>;
        allow_dynamic_smem(kernel, kGradQSmem<kD>);
        kernel<<<row_blocks(problems, t, kRows), kThreads, kGradQSmem<kD>, stream>>>(
            q, k, v, grad_out, lse, delta, static_cast<Grad*>(gq), t, s, causal, scale, layout);
        HPM_CUDA_LAUNCH_CHECK("mma_grad_q_kernel");
      }
      if (gk != nullptr && gv != nullptr && problems * s > 0) {
        auto* kernel = mma_grad_kv_kernel<kD, Grad>;
        allow_dynamic_smem(kernel, kGradKvSmem<kD>);
        kernel<<<row_blocks(problems, s, kRows), kThreads, kGradKvSmem<kD>, stream>>>(
            q, k, v, grad_out, lse, delta, static_cast<Grad*>(gk), static_cast<Grad*>(gv), t, s,
            causal, scale, layout);
        HPM_CUDA_LAUNCH_CHECK("mma_grad_kv_kernel");
      }
    });
  });
}

}  // namespace hpm::cuda
