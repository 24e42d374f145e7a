// A Linear's bias gradient, the column sums of its output gradient g (rows x cols, F32 or BF16
// bits), in two deterministic stages (bias_grad.cu launches them), apart from the launcher so that
// tests/cuda_emulated can compile them for the CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/span_sums_kernels.cuh"

namespace hpm::cuda {

namespace {

constexpr int kBiasGradWarps = 8;  // a block: 32 columns, its warps over a span's rows
constexpr int kBiasGradThreads = 32 * kBiasGradWarps;
// Rows one partial covers: at least 256 (32 a warp), and at most 64 partials a column.
constexpr std::int64_t kBiasGradSpanRows = 256;
constexpr std::int64_t kBiasGradSpans = 64;

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation

// Stage 1: block (x, y) sums rows [y * span_rows, ...) of columns 32 x .. 32 x + 31: warp w adds
// rows w, w + kBiasGradWarps, ... in order (its loads 32 consecutive columns), then the warps'
// sums are added in warp order into partial[y * cols + column].
template <typename G>
__global__ void bias_grad_partials_kernel(const G* __restrict__ g, double* __restrict__ partial,
                                          std::int64_t rows, std::int64_t cols,
                                          std::int64_t span_rows) {
  __shared__ double part[kBiasGradWarps][32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const std::int64_t k = 32 * static_cast<std::int64_t>(blockIdx.x) + lane;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * span_rows;
  const std::int64_t r1 = r0 + span_rows < rows ? r0 + span_rows : rows;
  double s = 0.0;
  if (k < cols) {
#pragma unroll 4
    for (std::int64_t r = r0 + warp; r < r1; r += kBiasGradWarps) s += as_f32(g[r * cols + k]);
  }
  part[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && k < cols) {
    double t = 0.0;
    for (int w = 0; w < kBiasGradWarps; ++w) t += part[w][lane];
    partial[static_cast<std::int64_t>(blockIdx.y) * cols + k] = t;
  }
}

// Stage 2: span_sums_kernel (span_sums_kernels.cuh), partial into db.

#endif

}  // namespace

}  // namespace hpm::cuda
