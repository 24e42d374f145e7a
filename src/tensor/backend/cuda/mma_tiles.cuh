// A warp's instruments for bf16 tensor-core tiles with f32 accumulation, in registers: mma.sync
// m16n8k16, fragments by ldmatrix, accumulator tiles turned into the next product's operand,
// cp.async copies to shared memory, quad reductions, and row stores. Written for the CPU's
// compiler too: with HPM_SIMT_EMULATION defined, what no host compiler has (mma, ldmatrix,
// cp.async, the dynamic shared memory) comes from tests/cuda_emulated/simt.h. attention_mma's
// kernels use them (the products are named for their uses there: scores, P V, dS K).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), for
// lane = 4 g + q (g = 0..7, q = 0..3):
//   A (16 x 16, row-major): 4 registers of 2 bf16: (row g, cols 2q, 2q+1), (row g+8, same cols),
//                           (row g, cols 2q+8, 2q+9), (row g+8, cols 2q+8, 2q+9);
//   B (16 x 8, k x n):      2 registers: (rows 2q, 2q+1, col g), (rows 2q+8, 2q+9, col g);
//   C (16 x 8, f32):        c0, c1 at (row g, cols 2q, 2q+1), c2, c3 at (row g+8, same cols).
// So a row's values sit in one quad of lanes (a shuffle over lane bits 0 and 1 reduces it), and
// two adjacent C tiles are, packed to bf16 pairs, exactly the A fragment of a 16-wide k step.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

namespace {

using bf16 = __nv_bfloat16;

// The block's dynamic shared memory (the emulation's buffer of the launch's size on the CPU).
__device__ __forceinline__ unsigned char* dynamic_smem() {
#if defined(HPM_SIMT_EMULATION)
  return ::hpm::simt::shared_memory();
#else
  extern __shared__ __align__(128) unsigned char smem[];
  return smem;
#endif
}

// D += A B for one m16n8k16 tile.
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4],
                                    const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(HPM_SIMT_EMULATION)
  ::hpm::simt::mma_m16n8k16_bf16(d, a, b);
#else
  __trap();  // bf16 mma needs sm_80, which every architecture hpm builds for has
#endif
}

// A T read from, or written to, memory of another element type: a plain access on the card, a
// memcpy in the emulation (the host compiler's strict aliasing would otherwise be free to reorder).
template <typename T>
__device__ __forceinline__ T load_as(const void* p) {
#if defined(HPM_SIMT_EMULATION)
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
#else
  return *reinterpret_cast<const T*>(p);
#endif
}
template <typename T>
__device__ __forceinline__ void store_as(void* p, const T& v) {
#if defined(HPM_SIMT_EMULATION)
  std::memcpy(p, &v, sizeof v);
#else
  *reinterpret_cast<T*>(p) = v;
#endif
}

__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x, the low half, is lo
  return load_as<std::uint32_t>(&h);
}

// Four 8 x 8 matrices of bf16 from shared memory in one instruction: lane l gives the address of
// row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); register m of lane l receives matrix m's
// (row l / 4, columns 2 (l % 4), 2 (l % 4) + 1), or with kTrans its (rows 2 (l % 4),
// 2 (l % 4) + 1, column l / 4): exactly an A fragment's or a B fragment's pairs.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const bf16* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
#elif defined(HPM_SIMT_EMULATION)
  ::hpm::simt::ldmatrix_x4(r, row, kTrans);
#else
  __trap();
#endif
}

// The A fragment of rows [0, 16) from `rows`, k columns [k0, k0 + 16): matrices (rows 0-7, k
// 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const bf16* rows, int ld, int k0) {
  const int lane = static_cast<int>(threadIdx.x) & 31, m = lane >> 3;
  ldmatrix_x4<false>(a, rows + ((m & 1) * 8 + (lane & 7)) * ld + k0 + (m >> 1) * 8);
}

// The A fragment of a tile stored transposed (A[m][k] = tile[k][m]): m columns [m0, m0 + 16), k
// rows [k0, k0 + 16), transposed as loaded. dS K's dS where the tile holds dS^T. Matrices (m 0-7,
// k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15).
__device__ __forceinline__ void load_a_by_cols(std::uint32_t (&a)[4], const bf16* rows, int ld,
                                               int k0, int m0) {
  const int lane = static_cast<int>(threadIdx.x) & 31, m = lane >> 3;
  ldmatrix_x4<true>(a, rows + (k0 + (m >> 1) * 8 + (lane & 7)) * ld + m0 + (m & 1) * 8);
}

// The B fragments of two n tiles where n runs along the tile's rows (B[k][n] = tile[n][k]): rows
// [0, 16) from `rows` (b0 the first 8, b1 the next), k columns [k0, k0 + 16). Q K^T's K, dO V^T's
// V. Matrices (rows 0-7, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 0-7), (rows 8-15, k 8-15).
__device__ __forceinline__ void load_b_by_rows(std::uint32_t (&b0)[2], std::uint32_t (&b1)[2],
                                               const bf16* rows, int ld, int k0) {
  const int lane = static_cast<int>(threadIdx.x) & 31, m = lane >> 3;
  std::uint32_t r[4];
  ldmatrix_x4<false>(r, rows + ((m >> 1) * 8 + (lane & 7)) * ld + k0 + (m & 1) * 8);
  b0[0] = r[0];
  b0[1] = r[1];
  b1[0] = r[2];
  b1[1] = r[3];
}

// The B fragments of two n tiles where k runs along the tile's rows (B[k][n] = tile[k][n]): k
// rows [0, 16) from `rows`, n columns [n0, n0 + 16) (b0 the first 8, b1 the next), transposed as
// loaded. P V's V, dS K's K, P^T dO's dO, dS^T Q's Q. Matrices (k 0-7, n 0-7), (k 8-15, n 0-7),
// (k 0-7, n 8-15), (k 8-15, n 8-15).
__device__ __forceinline__ void load_b_by_cols(std::uint32_t (&b0)[2], std::uint32_t (&b1)[2],
                                               const bf16* rows, int ld, int n0) {
  const int lane = static_cast<int>(threadIdx.x) & 31, m = lane >> 3;
  std::uint32_t r[4];
  ldmatrix_x4<true>(r, rows + ((m & 1) * 8 + (lane & 7)) * ld + n0 + (m >> 1) * 8);
  b0[0] = r[0];
  b0[1] = r[1];
  b1[0] = r[2];
  b1[1] = r[3];
}

// C tiles 2 kk and 2 kk + 1 (16 x 16 of f32) as the A fragment of a product's k step kk.
__device__ __forceinline__ void as_a(std::uint32_t (&a)[4], const float (&lo)[4],
                                     const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

template <int kN>
__device__ __forceinline__ void zero(float (&c)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
}

// c[mt] (16 x 8 kN each) = A_mt B^T for kM consecutive 16-row tiles A_mt of a staged tile (from
// a_rows) and B's rows `b_rows`, both kK wide, each B fragment loaded once for all kM: scores,
// S = Q K^T (S^T = K Q^T), and dP = dO V^T (dP^T = V dO^T).
template <int kK, int kN, int kM>
__device__ __forceinline__ void tiles_times_rows(float (&c)[kM][kN][4], const bf16* a_rows,
                                                 const bf16* b_rows, int ld) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) zero(c[mt]);
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 16) {
    std::uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) load_a(a[mt], a_rows + 16 * mt * ld, ld, k0);
#pragma unroll
    for (int n = 0; n < kN; n += 2) {
      std::uint32_t b0[2], b1[2];
      load_b_by_rows(b0, b1, b_rows + 8 * n * ld, ld, k0);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        mma(c[mt][n], a[mt], b0);
        mma(c[mt][n + 1], a[mt], b1);
      }
    }
  }
}

// The same for one 16-row tile.
template <int kK, int kN>
__device__ __forceinline__ void rows_times_rows(float (&c)[kN][4], const bf16* a_rows,
                                                const bf16* b_rows, int ld) {
  tiles_times_rows<kK, kN, 1>(reinterpret_cast<float(&)[1][kN][4]>(c), a_rows, b_rows, ld);
}

// acc[mt] (16 x kD) += P_mt T for kM tiles of probabilities (or dS) P_mt, 16 x 8 kN each in C
// fragments, and T a staged tile of 8 kN rows, kD wide, each B fragment loaded once for all kM:
// P V, dS K, P^T dO, dS^T Q. P is rounded to bf16 here.
template <int kN, int kD, int kM>
__device__ __forceinline__ void probs_times_tiles(float (&acc)[kM][kD / 8][4],
                                                  const float (&p)[kM][kN][4], const bf16* tile,
                                                  int ld) {
#pragma unroll
  for (int kk = 0; kk < kN / 2; ++kk) {
    std::uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) as_a(a[mt], p[mt][2 * kk], p[mt][2 * kk + 1]);
#pragma unroll
    for (int n = 0; n < kD / 8; n += 2) {
      std::uint32_t b0[2], b1[2];
      load_b_by_cols(b0, b1, tile + 16 * kk * ld, ld, 8 * n);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        mma(acc[mt][n], a[mt], b0);
        mma(acc[mt][n + 1], a[mt], b1);
      }
    }
  }
}

// The same for one tile.
template <int kN, int kD>
__device__ __forceinline__ void probs_times_tile(float (&acc)[kD / 8][4], const float (&p)[kN][4],
                                                 const bf16* tile, int ld) {
  probs_times_tiles<kN, kD, 1>(reinterpret_cast<float(&)[1][kD / 8][4]>(acc),
                               reinterpret_cast<const float(&)[1][kN][4]>(p), tile, ld);
}

// ---- asynchronous copies to shared memory ---------------------------------------------------

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  // src-size 0 fills the 16 bytes with zeros and reads nothing.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
#elif defined(HPM_SIMT_EMULATION)
  ::hpm::simt::cp_async(dst, src, valid);
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(HPM_SIMT_EMULATION)
  ::hpm::simt::cp_async_commit();
#endif
}
// The memory clobber keeps the compiler from moving shared-memory accesses across the wait.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#elif defined(HPM_SIMT_EMULATION)
  ::hpm::simt::cp_async_wait(kPending);
#endif
}

// Two adjacent elements of a row: f32, or rounded to bf16 (Out std::uint16_t, its bits).
template <typename Out>
__device__ __forceinline__ void store_pair(Out* dst, float lo, float hi) {
  if constexpr (std::is_same_v<Out, float>) {
    store_as(dst, make_float2(lo, hi));
  } else {
    store_as(dst, pack(lo, hi));
  }
}

// A warp's 16 x kD accumulator, times `factor0` (rows g) and `factor8` (rows g + 8), to rows
// [row0, row0 + 16) of a matrix of rows `stride` elements apart, the rows past `rows` dropped.
template <int kD, typename Out>
__device__ __forceinline__ void store_rows(const float (&acc)[kD / 8][4], Out* __restrict__ dst,
                                           std::int64_t row0, std::int64_t rows,
                                           std::int64_t stride, float factor0, float factor8) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t r0 = row0 + (lane >> 2), r8 = r0 + 8;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    const int c = 8 * n + 2 * (lane & 3);
    if (r0 < rows) store_pair(dst + r0 * stride + c, acc[n][0] * factor0, acc[n][1] * factor0);
    if (r8 < rows) store_pair(dst + r8 * stride + c, acc[n][2] * factor8, acc[n][3] * factor8);
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

// 2^x in one instruction (ex2.approx.ftz: a result below 2^-126 flushes to 0): for values kept in
// log2 units, an exponential with no multiply before it.
__device__ __forceinline__ float exp2_fast(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

}  // namespace

}  // namespace hpm::cuda
