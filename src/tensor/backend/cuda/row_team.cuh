// Rows reduced by a team of threads, for the row-wise kernels (softmax and cross-entropy, layer
// norm): reduction operators, warp butterflies, a block as a warp of warps, and Team, the threads
// sharing a row (a warp when rows are short, else the block). Every reduction has a fixed shape,
// so results do not vary run to run. Written for the CPU's compiler too (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>

#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

namespace {

// ---- reductions: warp butterflies, and blocks as warps of warps --------------------------------

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MaxKeyOp {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a > b ? a : b;
  }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Every lane gets the reduction of the warp's 32 values.
template <typename T, typename Op>
__device__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Every thread of the block gets the reduction of the block's values (blockDim.x a multiple of 32;
// every thread must call it).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : identity;
  return warp_reduce(v, op);
}

// The threads sharing a row: a warp (kWarp) or the whole block.
template <bool kWarp>
struct Team {
  int rank, size;
  std::int64_t first_row, row_stride;
  __device__ Team() {
    if constexpr (kWarp) {
      const int warps = static_cast<int>(blockDim.x) >> 5;
      rank = static_cast<int>(threadIdx.x) & 31;
      size = 32;
      first_row = static_cast<std::int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
      row_stride = static_cast<std::int64_t>(gridDim.x) * warps;
    } else {
      rank = static_cast<int>(threadIdx.x);
      size = static_cast<int>(blockDim.x);
      first_row = blockIdx.x;
      row_stride = gridDim.x;
    }
  }
  template <typename T, typename Op>
  __device__ T reduce(T v, Op op, T identity) const {
    if constexpr (kWarp) {
      return warp_reduce(v, op);
    } else {
      return block_reduce(v, op, identity);
    }
  }
  __device__ double sum(double v) const { return reduce(v, SumOp{}, 0.0); }
  // A barrier of the team's threads, their memory accesses before it ordered before those after.
  __device__ void sync() const {
    if constexpr (kWarp) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  }
};

}  // namespace

}  // namespace hpm::cuda
