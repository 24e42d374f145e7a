// Stage 2 of the deterministic column sums (layer norm's weight and bias gradients, a Linear's bias
// gradient when cuBLASLt's epilogue does not compute it): each column's partial sums, one per span
// of rows, added up. Apart from the launchers so that tests/cuda_emulated can compile it for the
// CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>

#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

namespace {

constexpr int kSpanSumWarps = 8;
constexpr int kSpanSumThreads = 32 * kSpanSumWarps;  // a block's threads; ceil(n / 32) blocks

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation

// out_a[k] = the sum over s of part_a[s * n + k], and the same of part_b into out_b; a null out
// is skipped. A block takes 32 columns: warp w adds spans w, w + kSpanSumWarps, ... in order (a
// warp's loads 32 consecutive columns), then the warps' sums are added in warp order. One thread a
// column adding every span in turn was 14% of the shakespeare GPT's kernel time on the H100 (run
// 7's ncu: layer norm's 384 columns, 2 blocks, 256 spans each). The order depends only on the
// shape: the same result run to run.
__global__ void span_sums_kernel(const double* __restrict__ part_a, float* __restrict__ out_a,
                                 const double* __restrict__ part_b, float* __restrict__ out_b,
                                 std::int64_t spans, std::int64_t n) {
  __shared__ double sums_a[kSpanSumWarps][32], sums_b[kSpanSumWarps][32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  for (std::int64_t c0 = 32 * static_cast<std::int64_t>(blockIdx.x); c0 < n;
       c0 += 32 * static_cast<std::int64_t>(gridDim.x)) {
    const std::int64_t k = c0 + lane;
    double sa = 0.0, sb = 0.0;
    if (k < n) {
#pragma unroll 4
      for (std::int64_t s = warp; s < spans; s += kSpanSumWarps) {
        if (out_a != nullptr) sa += part_a[s * n + k];
        if (out_b != nullptr) sb += part_b[s * n + k];
      }
    }
    sums_a[warp][lane] = sa;
    sums_b[warp][lane] = sb;
    __syncthreads();
    if (warp == 0 && k < n) {
      double ta = 0.0, tb = 0.0;
      for (int w = 0; w < kSpanSumWarps; ++w) {
        ta += sums_a[w][lane];
        tb += sums_b[w][lane];
      }
      if (out_a != nullptr) out_a[k] = static_cast<float>(ta);
      if (out_b != nullptr) out_b[k] = static_cast<float>(tb);
    }
    __syncthreads();  // the next columns rewrite sums_a and sums_b
  }
}

#endif

}  // namespace

}  // namespace hpm::cuda
