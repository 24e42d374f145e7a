// The embedding gradient's kernels after the sort (embedding.cu's opening comment tells the
// scheme), apart from the launchers so that tests/cuda_emulated can compile them for the CPU too
// (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>

#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

namespace {

constexpr int kRunWarps = 8;           // a run's block: its warps split the run's positions
constexpr int kRunColumnsPerLane = 8;  // columns a lane sums at once
constexpr int kRunThreads = 32 * kRunWarps;
constexpr std::int64_t kRunChunk = 32 * kRunColumnsPerLane;  // a block's columns at once

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation

// One past the last sorted entry of each key's run, at ends[key] (keys are sorted, so each key
// has one run); keys of v (bad indices) have none.
__global__ void run_ends_kernel(const unsigned long long* __restrict__ keys, std::int64_t n,
                                std::int64_t v, std::int64_t* __restrict__ ends) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const unsigned long long key = keys[i];
    if (key < static_cast<unsigned long long>(v) && (i + 1 == n || keys[i + 1] != key)) {
      ends[key] = i + 1;
    }
  }
}

// Block p (grid-stride, kRunThreads threads) takes sorted entry p; if it starts a run of equal
// keys, it adds the run's gradient rows into the table row. Warp w sums the run's positions
// p + w, p + w + kRunWarps, ... in order, each lane kRunColumnsPerLane columns of a chunk at once
// (lane, lane + 32, ...: a warp's loads coalesced, many in flight), and the warps' sums are added
// to the row in warp order. A run of thousands (a frequent character's, a position's over a large
// batch) was one thread's sequential loop per column, 13% of the shakespeare GPT's step on the
// H100 (run 6). The order of additions depends only on the run: the same result run to run,
// within rounding of the CPU's sequential one.
__global__ void __launch_bounds__(kRunThreads)
    embedding_backward_kernel(const float* __restrict__ g,
                              const unsigned long long* __restrict__ keys,
                              const std::int64_t* __restrict__ positions,
                              const std::int64_t* __restrict__ ends, float* __restrict__ table,
                              std::int64_t n, std::int64_t v, std::int64_t e) {
  __shared__ float part[kRunWarps][kRunChunk];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  for (std::int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const unsigned long long key = keys[p];
    // The same for every thread of the block: the barriers below are reached by all or none.
    if (key >= static_cast<unsigned long long>(v) || (p > 0 && keys[p - 1] == key)) continue;
    const std::int64_t end = ends[key];
    float* row = table + static_cast<std::int64_t>(key) * e;
    for (std::int64_t c0 = 0; c0 < e; c0 += kRunChunk) {
      float acc[kRunColumnsPerLane];
#pragma unroll
      for (int k = 0; k < kRunColumnsPerLane; ++k) acc[k] = 0.0f;
#pragma unroll 4
      for (std::int64_t q = p + warp; q < end; q += kRunWarps) {
        const float* gr = g + positions[q] * e + c0;
#pragma unroll
        for (int k = 0; k < kRunColumnsPerLane; ++k) {
          const std::int64_t j = lane + 32 * k;
          if (c0 + j < e) acc[k] += gr[j];
        }
      }
#pragma unroll
      for (int k = 0; k < kRunColumnsPerLane; ++k) part[warp][lane + 32 * k] = acc[k];
      __syncthreads();
      for (std::int64_t j = threadIdx.x; j < kRunChunk && c0 + j < e; j += blockDim.x) {
        float s = row[c0 + j];
        for (int w = 0; w < kRunWarps; ++w) s += part[w][j];
        row[c0 + j] = s;
      }
      __syncthreads();  // the next chunk rewrites `part`
    }
  }
}

#endif

}  // namespace

}  // namespace hpm::cuda
