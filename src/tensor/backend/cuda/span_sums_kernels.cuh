// Stage 2 of the deterministic column sums (layer norm's weight and bias gradients, a Linear's bias
// gradient when cuBLASLt's epilogue does not compute it): each column's partial sums, one per span
// of rows, added up. Apart from the launchers so that tests/cuda_emulated can compile it for the
// CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>

#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

namespace {

constexpr int kSpanSumWarps = 32;
constexpr int kSpanSumThreads = 32 * kSpanSumWarps;  // a block's threads; ceil(n / 32) blocks

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation

// out_a[k] = the sum over s of part_a[s * n + k], and the same of part_b into out_b; a null out
// is skipped. A block takes 32 columns: warp w adds spans w, w + kSpanSumWarps, ... (a warp's
// loads 32 consecutive columns) into two alternating sums, so that two loads of each operand are
// in flight, then the warps' sums are added in warp order. Run 11's ncu (the shakespeare model's
// layer norm, 384 columns in 12 blocks, 512 spans) measured the 8-warp version, each warp one
// chain of 64 dependent adds, at 47 us a call: more than the row pass before it (39 us). The
// order depends only on the shape: the same result run to run.
__global__ void span_sums_kernel(const double* __restrict__ part_a, float* __restrict__ out_a,
                                 const double* __restrict__ part_b, float* __restrict__ out_b,
                                 std::int64_t spans, std::int64_t n) {
  __shared__ double sums_a[kSpanSumWarps][32], sums_b[kSpanSumWarps][32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const bool want_a = out_a != nullptr, want_b = out_b != nullptr;
  for (std::int64_t c0 = 32 * static_cast<std::int64_t>(blockIdx.x); c0 < n;
       c0 += 32 * static_cast<std::int64_t>(gridDim.x)) {
    const std::int64_t k = c0 + lane;
    double a0 = 0.0, a1 = 0.0, b0 = 0.0, b1 = 0.0;
    if (k < n) {
      std::int64_t s = warp;
      for (; s + kSpanSumWarps < spans; s += 2 * kSpanSumWarps) {
        const std::int64_t at = s * n + k, next = at + kSpanSumWarps * n;
        if (want_a) {
          a0 += part_a[at];
          a1 += part_a[next];
        }
        if (want_b) {
          b0 += part_b[at];
          b1 += part_b[next];
        }
      }
      if (s < spans) {
        if (want_a) a0 += part_a[s * n + k];
        if (want_b) b0 += part_b[s * n + k];
      }
    }
    sums_a[warp][lane] = a0 + a1;
    sums_b[warp][lane] = b0 + b1;
    __syncthreads();
    if (warp == 0 && k < n) {
      double ta = 0.0, tb = 0.0;
      for (int w = 0; w < kSpanSumWarps; ++w) {
        ta += sums_a[w][lane];
        tb += sums_b[w][lane];
      }
      if (want_a) out_a[k] = static_cast<float>(ta);
      if (want_b) out_b[k] = static_cast<float>(tb);
    }
    __syncthreads();  // the next columns rewrite sums_a and sums_b
  }
}

#endif

}  // namespace

}  // namespace hpm::cuda
