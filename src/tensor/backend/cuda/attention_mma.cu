// Fused attention for BF16 q, k, v on tensor cores, FlashAttention-2's way with every tile in
// registers: each product is a warp's mma.sync m16n8k16 (bf16 in, f32 accumulating), and a
// product's accumulator fragments become the next product's A operand without leaving the
// registers (the score tile S turns into P for P V; dP and P into dS for dS K). attention_tiled.cu
// keeps the WMMA version of the same tiling (its accumulators round-trip through shared memory;
// HPM_CUDA_ATTENTION=wmma picks it).
//
// The products and their fragments are mma_tiles.cuh's (its opening comment gives the PTX
// layouts: a row's values in one quad of lanes; two C tiles, packed, are the next A fragment).
//
// Shared-memory tiles are bf16 rows padded by 8 elements, and fragments come from them by
// ldmatrix (four 8 x 8 matrices an instruction; .trans for the B operands whose k runs along the
// tile's rows: V in P V, K in dS K, dO and Q in the dk/dv products): the 8 rows of each matrix
// then start in distinct bank quads.
//
// Forward: a block of 4 warps owns 128 queries, two 16-row tiles a warp sharing every K and V
// fragment they load (64 and one tile at head size 128, for 64 queries or fewer, or under
// HPM_CUDA_ATTENTION=mma16); key tiles of 64 are double-buffered with cp.async. Scores stay raw
// (q.k), and only tiles at the keys' end or on the causal diagonal test the mask. The online
// softmax keeps each row's raw max m (quad-uniform) and a per-lane partial sum l, summed over the
// quad once at the end; P = 2^(c S - c m), c = scale log2(e), is one FFMA and one ex2 a score
// (the max of raw scores is that of scaled ones for scale > 0: mma_forward_takes), rounded to
// bf16 for P V (the CPU rounds normalized probabilities: the two differ by bf16 rounding, the
// conformance tolerance). out = O / l (F32, or BF16 merged for the next product),
// lse = c m ln 2 + log(l).
//
// Backward, with P recomputed from lse and dS = P (dP - Delta), as attention_tiled.cu: first
// Delta = rowsum(dO O), which also writes dO rounded to bf16 (the products' operand, rounded
// once); then one kernel, a block per 64 keys looping over the query tiles that see them
// (double-buffered), for dk and dv in its registers and, through dS^T staged in shared memory,
// each tile's share of dq: FlashAttention-2's five products a tile. FlashAttention-2 adds the
// shares by atomics in whatever order the blocks come; here the key blocks that see a query tile
// add theirs in a fixed order, each waiting for its turn (ordered_turns.cuh), the last writing dq:
// bit-identical from run to run. The order is the one the blocks reach the tile in under the
// causal mask (the block on the diagonal first, key block 0 last), and blocks start last key
// first, so that a block only ever waits for one started before it. Without scratch for the sums
// (or under HPM_CUDA_ATTENTION_ONE_PASS=0, the A/B), dk and dv by that kernel and dq by one of its
// own (a block per 64 queries, recomputing S and dP: seven products a tile).
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

// HPM_CUDA_ATTENTION_ONE_PASS=0: the backward's dq by a kernel of its own (the device's A/B).
bool one_pass_on() {
  static const bool on = ab_switch_on("HPM_CUDA_ATTENTION_ONE_PASS");
  return on;
}

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
  if (!mma_forward_takes(scale)) {
    throw std::invalid_argument("mma_attention_forward: scale " + std::to_string(scale) +
                                " (a finite scale > 0 only; the caller runs another kernel)");
  }
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

void mma_attention_delta(const void* grad_out, bool grad_bf16, const void* out, bool out_bf16,
                         float* delta, std::uint16_t* grad_out_bf16, std::int64_t problems,
                         std::int64_t t, int d, const AttentionLayout& layout,
                         cudaStream_t stream) {
  if (problems * t == 0) return;
  with_tensor_core_head_size(d, [&](auto size) {
    constexpr int kD = decltype(size)::value;
    with_element(out_bf16, [&](auto out_element) {
      with_element(grad_bf16, [&](auto grad_element) {
        using O = decltype(out_element);
        using G = decltype(grad_element);
        const auto* g = static_cast<const G*>(grad_out);
        const auto* o = static_cast<const O*>(out);
        // 16-byte rows: every row start (a head's offset, a multiple of d, plus rows of
        // layout.out elements) 8 elements in, from 16-byte aligned tensors.
        const bool rows16 = kD % 8 == 0 && layout.out % 8 == 0 && aligned16(grad_out) &&
                            aligned16(out) && (grad_bf16 || aligned16(grad_out_bf16));
        if (rows16) {
          attention_delta_rows_kernel<kD, O, G>
              <<<blocks_for(problems * t, kDeltaRowsPerBlock<kD>), kThreads, 0, stream>>>(
                  g, o, delta, grad_out_bf16, problems, t, layout);
          HPM_CUDA_LAUNCH_CHECK("attention_delta_rows_kernel");
          return;
        }
        attention_delta_kernel<kD, O, G><<<blocks_for(problems * t, kWarps), kThreads, 0, stream>>>(
            g, o, delta, grad_out_bf16, problems, t, layout);
        HPM_CUDA_LAUNCH_CHECK("attention_delta_kernel");
      });
    });
  });
}

std::int64_t mma_attention_scratch_elements(std::int64_t problems, std::int64_t t, int d) {
  if (!one_pass_on()) return 0;
  std::int64_t tiles = 0;
  with_tensor_core_head_size(d, [&](auto size) { tiles = dq_tiles<decltype(size)::value>(t); });
  return problems * t * d + problems * tiles;
}

void mma_attention_backward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                            const std::uint16_t* grad_out, const float* lse, const float* delta,
                            void* gq, void* gk, void* gv, bool grad_bf16, std::int64_t problems,
                            std::int64_t t, std::int64_t s, int d, bool causal, float scale,
                            const AttentionLayout& layout, cudaStream_t stream, void* scratch) {
  const bool one_pass = one_pass_on() && scratch != nullptr && gq != nullptr && gk != nullptr &&
                        gv != nullptr && problems * t > 0 && problems * s > 0;
  with_tensor_core_head_size(d, [&](auto size) {
    constexpr int kD = decltype(size)::value;
    with_element(grad_bf16, [&](auto element) {
      using Grad = decltype(element);
      if (one_pass) {
        // The turn counters after the sums, zeroed for this launch (the sums need no zeros: the
        // first share of each is stored).
        auto* sums = static_cast<float*>(scratch);
        int* turns = reinterpret_cast<int*>(sums + problems * t * kD);
        HPM_CUDA_CHECK(cudaMemsetAsync(turns, 0, sizeof(int) * problems * dq_tiles<kD>(t), stream));
        auto* kernel = mma_grad_kv_kernel<kD, Grad, true>;
        allow_dynamic_smem(kernel, kGradKvSmem<kD, true>);
        kernel<<<row_blocks(problems, s, kRows), kThreads, kGradKvSmem<kD, true>, stream>>>(
            q, k, v, grad_out, lse, delta, static_cast<Grad*>(gk), static_cast<Grad*>(gv), t, s,
            causal, scale, layout, static_cast<Grad*>(gq), DqShares{sums, turns});
        HPM_CUDA_LAUNCH_CHECK("mma_grad_kv_kernel (one pass)");
        return;
      }
      if (gq != nullptr && problems * t > 0) {
        auto* kernel = mma_grad_q_kernel<kD, Grad>;
        allow_dynamic_smem(kernel, kGradQSmem<kD>);
        kernel<<<row_blocks(problems, t, kRows), kThreads, kGradQSmem<kD>, stream>>>(
            q, k, v, grad_out, lse, delta, static_cast<Grad*>(gq), t, s, causal, scale, layout);
        HPM_CUDA_LAUNCH_CHECK("mma_grad_q_kernel");
      }
      if (gk != nullptr && gv != nullptr && problems * s > 0) {
        auto* kernel = mma_grad_kv_kernel<kD, Grad, false>;
        allow_dynamic_smem(kernel, kGradKvSmem<kD>);
        kernel<<<row_blocks(problems, s, kRows), kThreads, kGradKvSmem<kD>, stream>>>(
            q, k, v, grad_out, lse, delta, static_cast<Grad*>(gk), static_cast<Grad*>(gv), t, s,
            causal, scale, layout, nullptr, DqShares{});
        HPM_CUDA_LAUNCH_CHECK("mma_grad_kv_kernel");
      }
    });
  });
}

}  // namespace hpm::cuda
