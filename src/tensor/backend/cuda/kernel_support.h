// What the kernels of this folder share: the dtype check the CPU's Tensor::data<T>() makes, grid
// sizes, the CPU's bf16 rounding, grid-stride indices, warp and block sums in double, gathers
// through strides, and the value of a check word that met no bad index (deferred_checks.h hands out
// the words).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hpm/tensor/tensor.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;  // every lane of a warp
inline constexpr unsigned kGridCap = 65535u * 8u;   // blocks_for's cap; loops stride past it
inline constexpr int kMaxGatherDims = 8;
inline constexpr unsigned long long kNoError = ~0ull;  // a check word when no index was bad

// The CPU kernels reach their operands through Tensor::data<T>(), which throws this on another
// dtype: the same error here, before anything is launched.
inline void require_dtype(const Tensor& t, DType expected) {
  if (t.dtype() != expected) {
    throw std::logic_error(std::string("tensor of dtype ") + dtype_name(t.dtype()) +
                           " accessed as " + dtype_name(expected));
  }
}

// `blocks` clamped to [1, kGridCap].
inline unsigned grid_for(std::int64_t blocks) {
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kGridCap ? kGridCap : blocks));
}

// An output of `dims` (contiguous) read from an input at the strides given per dimension.
struct Gather {
  int rank = 0;
  std::int64_t dims[kMaxGatherDims] = {}, strides[kMaxGatherDims] = {};

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation
  __device__ std::int64_t offset(std::int64_t flat) const {
    std::int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (flat % dims[d]) * strides[d];
      flat /= dims[d];
    }
    return off;
  }
#endif
};

// Size-1 dimensions dropped; neighbours merged where stepping the outer one steps the inner one
// its full extent (a permutation that keeps some axes together moves them as one). More than
// kMaxGatherDims dimensions after merging is std::invalid_argument naming `what`.
inline Gather make_gather(const Shape& out, const std::vector<std::int64_t>& strides,
                          const char* what) {
  Gather g;
  for (int d = 0; d < out.rank(); ++d) {
    const std::int64_t size = out[d];
    const std::int64_t st = strides[static_cast<std::size_t>(d)];
    if (size == 1) continue;
    if (g.rank > 0 && g.strides[g.rank - 1] == st * size) {
      g.dims[g.rank - 1] *= size;
      g.strides[g.rank - 1] = st;
      continue;
    }
    if (g.rank == kMaxGatherDims) {
      throw std::invalid_argument(std::string(what) + ": " + out.str() +
                                  " needs more than 8 dimensions");
    }
    g.dims[g.rank] = size;
    g.strides[g.rank] = st;
    ++g.rank;
  }
  return g;
}

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation
// cpu/bf16.cpp's rounding of f32 to bf16, bit for bit: to nearest even, a NaN kept a quiet NaN
// with its sign and upper payload (__float2bfloat16_rn rounds the same but returns a canonical
// NaN).
__host__ __device__ inline std::uint16_t f32_to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(nan ? (u >> 16) | 0x40u : rounded >> 16);
}

// An operand element as f32, the operand F32 or BF16 (its bits): kernels that read a saved
// activation in either dtype, bf16 widened exactly as to_f32 would.
__device__ inline float as_f32(float v) { return v; }
__device__ inline float as_f32(std::uint16_t bf16_bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bf16_bits) << 16);
}

// Eight consecutive elements moved by 16-byte accesses (bf16: one, f32: two), the element-wise
// kernels' vector bodies: a warp's scalar 2-byte accesses left the H100 at a third of its
// bandwidth (run 6's profile). The pointer must be 16-byte aligned: aligned16 says.
struct alignas(16) Bytes16 {
  std::uint32_t w[4];
};
__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}
__device__ inline Bytes16 load16(const void* p) {
#if defined(HPM_SIMT_EMULATION)
  Bytes16 b;
  std::memcpy(&b, p, sizeof b);
  return b;
#else
  return *static_cast<const Bytes16*>(p);
#endif
}
__device__ inline void store16(void* p, const Bytes16& b) {
#if defined(HPM_SIMT_EMULATION)
  std::memcpy(p, &b, sizeof b);
#else
  *static_cast<Bytes16*>(p) = b;
#endif
}
__device__ inline void load8(const float* p, float (&v)[8]) {
  const Bytes16 a = load16(p), b = load16(p + 4);
  for (int k = 0; k < 4; ++k) {
    v[k] = __uint_as_float(a.w[k]);
    v[4 + k] = __uint_as_float(b.w[k]);
  }
}
__device__ inline void load8(const std::uint16_t* p, float (&v)[8]) {
  const Bytes16 a = load16(p);
  for (int k = 0; k < 4; ++k) {  // little-endian: the lower half is the first element
    v[2 * k] = __uint_as_float(a.w[k] << 16);
    v[2 * k + 1] = __uint_as_float(a.w[k] & 0xffff0000u);
  }
}
__device__ inline void store8(float* p, const float (&v)[8]) {
  Bytes16 a, b;
  for (int k = 0; k < 4; ++k) {
    a.w[k] = __float_as_uint(v[k]);
    b.w[k] = __float_as_uint(v[4 + k]);
  }
  store16(p, a);
  store16(p + 4, b);
}
__device__ inline void store8(std::uint16_t* p, const float (&v)[8]) {
  Bytes16 a;
  for (int k = 0; k < 4; ++k) {
    a.w[k] = static_cast<std::uint32_t>(f32_to_bf16_bits(v[2 * k])) |
             (static_cast<std::uint32_t>(f32_to_bf16_bits(v[2 * k + 1])) << 16);
  }
  store16(p, a);
}

__device__ inline std::int64_t first_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_stride() {
  return static_cast<std::int64_t>(blockDim.x) * gridDim.x;
}

__device__ inline double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// The block's sum, in every thread (all must call; blockDim.x a multiple of 32).
__device__ inline double block_sum(double v) {
  __shared__ double partial[32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.0;
  return warp_sum(v);
}
#endif

// Blocks of `rows_per_block` rows over `batch` matrices of `rows` rows each (attention's grids);
// std::invalid_argument past a 1-D grid's limit.
inline unsigned row_blocks(std::int64_t batch, std::int64_t rows, std::int64_t rows_per_block) {
  const std::int64_t blocks = batch * ((rows + rows_per_block - 1) / rows_per_block);
  if (blocks > 0x7fffffff) throw std::invalid_argument("attention on CUDA: too many rows");
  return static_cast<unsigned>(blocks);
}

// The most dynamic shared memory a block of the current device may be given (its opt-in limit:
// 227 KiB on sm_90, 163 on sm_80, 99 on sm_86 and sm_89), read once per device.
inline std::size_t max_dynamic_smem() {
  static std::mutex lock;
  static std::map<int, std::size_t> limits;
  const int device = current_context().index;
  const std::lock_guard<std::mutex> hold(lock);
  const auto found = limits.find(device);
  if (found != limits.end()) return found->second;
  int bytes = 0;
  HPM_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return limits[device] = static_cast<std::size_t>(bytes);
}

// Dynamic shared memory beyond the default 48 KiB must be asked for, per kernel and device: once
// for the largest size so far, rather than a driver call before every launch (small models are
// launch-bound; the call's cost on a card is not measured).
template <typename Kernel>
void allow_dynamic_smem(Kernel* kernel, std::size_t bytes) {
  if (bytes <= (std::size_t{48} << 10)) return;
  static std::mutex lock;
  static std::map<std::pair<const void*, int>, std::size_t> allowed;
  const std::lock_guard<std::mutex> hold(lock);
  std::size_t& done = allowed[{reinterpret_cast<const void*>(kernel), current_context().index}];
  if (bytes <= done) return;
  HPM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  done = bytes;
}

}  // namespace hpm::cuda
