// Fused attention for BF16 q, k, v on tensor cores: FlashAttention-2's tiling (Dao 2023), every
// product a WMMA 16x16x16 bf16 product accumulating in f32. The T x S scores never exist whole.
//
// A block owns 64 rows (queries forward and for dq, keys for dk and dv), 16 per warp; it loops
// over tiles of 64 columns (keys, or queries), staged in shared memory as bf16 rows padded by 8
// elements (16 bytes: consecutive rows start in different banks). Within a warp, lanes 2r and
// 2r + 1 own row r of the warp's 16 for the element-wise work (the softmax, the masks, dS), half
// of the 64 columns each.
//
// Forward: S = Q K^T per key tile; the online softmax keeps each row's running max m and sum l;
// P = exp(scale S - m) is rounded to bf16 for P V; the output accumulator (f32, in shared memory:
// WMMA fragments have no row-wise rescaling) is scaled by exp(m_old - m_new) before each tile's
// P V is added. out = acc / l, lse = m + log(l). The CPU's bf16 path rounds the normalized
// probabilities instead; the two differ by bf16 rounding (the conformance tolerance).
//
// Backward, with P = exp(scale Q K^T - lse) recomputed and dS = P (dO V^T - Delta):
//   dk, dv: a block per 64 keys, looping over the query tiles that see them: dV += P^T dO,
//           dK += scale dS^T Q, accumulated in WMMA fragments;
//   dq:     a block per 64 queries, looping over the key tiles they see: dQ += scale dS K.
// S and dP are computed in both (two products more than FlashAttention-2's one kernel with atomic
// dq): every gradient row has one owner and every sum a fixed order, so results are bit-identical
// from run to run. dO, P (for dV) and dS are rounded to bf16 for their products, as on the CPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "tensor/backend/cuda/attention_tiled.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kRows = 64;  // rows a block owns
constexpr int kWarps = 4;  // 16 rows each
constexpr int kThreads = kWarps * 32;
constexpr int kCols = 64;  // columns of a tile the block loops over
constexpr int kPadH = 8;   // bf16 elements of row padding
constexpr int kPadF = 4;   // f32 elements of row padding
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared-memory shapes for head size kD. Every buffer's size is a multiple of 32 bytes, so each
// starts 32-byte aligned (WMMA's requirement) when laid out one after another.
template <int kD>
struct Layout {
  static_assert(kD % 16 == 0 && kD <= 128, "head sizes 32, 64, 128");
  static constexpr int kLd = kD + kPadH;                            // a staged bf16 row
  static constexpr int kLdS = (kD > kCols ? kD : kCols) + kPadF;    // a warp's f32 scratch row
  static constexpr int kLdP = kCols + kPadH;                        // a warp's bf16 P or dS row
  static constexpr int kLdO = kD + kPadF;                           // forward's accumulator
  static constexpr std::size_t kTile = sizeof(bf16) * kRows * kLd;  // 64 staged rows
  static constexpr std::size_t kScratch = sizeof(float) * 16 * kLdS;
  static constexpr std::size_t kProbs = sizeof(bf16) * 16 * kLdP;
  static constexpr std::size_t kAcc = sizeof(float) * 16 * kLdO;
  static constexpr std::size_t kRowFloats = sizeof(float) * 16;  // one float per warp row
  // Forward: Q, K, V tiles; per warp: scratch (S, then P V), P, the accumulator, 1 / l.
  static constexpr std::size_t kForward =
      3 * kTile + kWarps * (kScratch + kProbs + kAcc + kRowFloats);
  // dk, dv: K, V, Q, dO tiles, lse and delta of the query tile; per warp: scratch, P^T, dS^T.
  static constexpr std::size_t kGradKv =
      4 * kTile + 2 * sizeof(float) * kCols + kWarps * (kScratch + 2 * kProbs);
  // dq: Q, dO, K, V tiles; per warp: scratch, dS, lse and delta of its rows.
  static constexpr std::size_t kGradQ = 4 * kTile + kWarps * (kScratch + kProbs + 2 * kRowFloats);
};

__device__ __forceinline__ std::int64_t min64(std::int64_t a, std::int64_t b) {
  return a < b ? a : b;
}

// Rows [0, rows) of a (., kD) bf16 matrix into a staged tile, 16 bytes a thread at a time; the
// tile's rows past `rows` are zeros. Every thread of the block takes part.
template <int kD>
__device__ void stage(bf16* dst, const std::uint16_t* __restrict__ src, std::int64_t rows) {
  constexpr int kVec = kD / 8;
  for (int e = static_cast<int>(threadIdx.x); e < kRows * kVec; e += kThreads) {
    const int r = e / kVec, c = (e % kVec) * 8;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) x = *reinterpret_cast<const uint4*>(src + static_cast<std::int64_t>(r) * kD + c);
    *reinterpret_cast<uint4*>(dst + r * Layout<kD>::kLd + c) = x;
  }
}

// The same from f32 rows, each rounded to bf16 (nearest, ties to even): dO.
template <int kD>
__device__ void stage_rounded(bf16* dst, const float* __restrict__ src, std::int64_t rows) {
  constexpr int kVec = kD / 8;
  for (int e = static_cast<int>(threadIdx.x); e < kRows * kVec; e += kThreads) {
    const int r = e / kVec, c = (e % kVec) * 8;
    alignas(16) __nv_bfloat162 h[4];
    if (r < rows) {
      const float4* p =
          reinterpret_cast<const float4*>(src + static_cast<std::int64_t>(r) * kD + c);
      const float4 a = p[0], b = p[1];
      h[0] = __floats2bfloat162_rn(a.x, a.y);
      h[1] = __floats2bfloat162_rn(a.z, a.w);
      h[2] = __floats2bfloat162_rn(b.x, b.y);
      h[3] = __floats2bfloat162_rn(b.z, b.w);
    } else {
      for (auto& x : h) x = __floats2bfloat162_rn(0.0f, 0.0f);
    }
    *reinterpret_cast<uint4*>(dst + r * Layout<kD>::kLd + c) = *reinterpret_cast<const uint4*>(h);
  }
}

// out (16 x kCols, row-major, ld kLdS) = A (16 x kK, rows of `a`) B^T, B's rows being `b`'s 64:
// the product of a warp's 16 rows with a tile's 64 rows, as f32.
template <int kK>
__device__ __forceinline__ void rows_times_tile(const bf16* a, int lda, const bf16* b, int ldb,
                                                float* out, int ldo) {
#pragma unroll
  for (int n = 0; n < kCols / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + kk * 16, lda);
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, ldo, wmma::mem_row_major);
  }
}

// acc[n] += P (16 x 64, rows of `p`) times columns [16n, 16n + 16) of a staged tile (64 x kD).
template <int kD>
__device__ __forceinline__ void accumulate_times_tile(FragAcc (&acc)[kD / 16], const bf16* p,
                                                      int ldp, const bf16* tile) {
#pragma unroll
  for (int n = 0; n < kD / 16; ++n) {
#pragma unroll
    for (int kk = 0; kk < kCols / 16; ++kk) {
      FragA fa;
      FragBRow fb;
      wmma::load_matrix_sync(fa, p + kk * 16, ldp);
      wmma::load_matrix_sync(fb, tile + kk * 16 * Layout<kD>::kLd + n * 16, Layout<kD>::kLd);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// A warp's 16 x kD accumulator, times `factor`, to rows [row0, row0 + 16) of a (rows, kD) f32
// matrix (the rows past `rows` dropped), through the warp's scratch.
template <int kD>
__device__ __forceinline__ void store_rows(FragAcc (&acc)[kD / 16], float* scratch,
                                           float* __restrict__ dst, std::int64_t row0,
                                           std::int64_t rows, float factor) {
  constexpr int kLd = Layout<kD>::kLdS;
#pragma unroll
  for (int n = 0; n < kD / 16; ++n)
    wmma::store_matrix_sync(scratch + n * 16, acc[n], kLd, wmma::mem_row_major);
  __syncwarp();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int r = 0; r < 16 && row0 + r < rows; ++r) {
    for (int c = lane; c < kD; c += 32) dst[(row0 + r) * kD + c] = scratch[r * kLd + c] * factor;
  }
}

// ---- forward ------------------------------------------------------------------------------------

template <int kD>
__global__ void __launch_bounds__(kThreads)
    tiled_forward_kernel(const std::uint16_t* __restrict__ q, const std::uint16_t* __restrict__ k,
                         const std::uint16_t* __restrict__ v, float* __restrict__ out,
                         float* __restrict__ lse, std::int64_t t, std::int64_t s, bool causal,
                         float scale) {
  using L = Layout<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::kTile);
  bf16* v_s = reinterpret_cast<bf16*>(smem + 2 * L::kTile);
  unsigned char* mine =
      smem + 3 * L::kTile + warp * (L::kScratch + L::kProbs + L::kAcc + L::kRowFloats);
  float* scratch = reinterpret_cast<float*>(mine);
  bf16* p_w = reinterpret_cast<bf16*>(mine + L::kScratch);
  float* acc = reinterpret_cast<float*>(mine + L::kScratch + L::kProbs);
  float* inv_l = reinterpret_cast<float*>(mine + L::kScratch + L::kProbs + L::kAcc);

  // A problem's query blocks last to first: under the causal mask the last see the most keys, and
  // starting them first leaves the short ones for the grid's tail (the same values either way).
  const std::int64_t row_blocks = (t + kRows - 1) / kRows;
  const std::int64_t b = blockIdx.x / row_blocks;
  const std::int64_t i0 = (row_blocks - 1 - blockIdx.x % row_blocks) * kRows;
  const std::int64_t w0 = i0 + 16 * warp;  // the warp's first query
  const int r = lane >> 1, half = lane & 1;
  const std::int64_t i = w0 + r;  // this lane's query
  stage<kD>(q_s, q + (b * t + i0) * kD, min64(kRows, t - i0));
  for (int c = half * (kD / 2); c < (half + 1) * (kD / 2); ++c) acc[r * L::kLdO + c] = 0.0f;
  float m = kNegInf, l = 0.0f;

  const std::int64_t end = causal ? min64(s, i0 + kRows) : s;
  for (std::int64_t j0 = 0; j0 < end; j0 += kCols) {
    __syncthreads();  // the previous tiles are consumed (and Q staged, the first time)
    stage<kD>(k_s, k + (b * s + j0) * kD, min64(kCols, s - j0));
    stage<kD>(v_s, v + (b * s + j0) * kD, min64(kCols, s - j0));
    __syncthreads();
    // Warp-uniform: no query of the warp, or (causal) no key of the tile any of them sees.
    if (w0 >= t || (causal && j0 > w0 + 15)) continue;
    rows_times_tile<kD>(q_s + 16 * warp * L::kLd, L::kLd, k_s, L::kLd, scratch, L::kLdS);
    __syncwarp();
    // The online softmax over this lane's half of row r.
    float x[kCols / 2];
    float tile_max = kNegInf;
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) {
      const int c = half * (kCols / 2) + e;
      const std::int64_t j = j0 + c;
      const bool seen = j < s && !(causal && j > i);
      x[e] = seen ? scratch[r * L::kLdS + c] * scale : kNegInf;
      tile_max = fmaxf(tile_max, x[e]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    // A row that has seen nothing yet keeps m = -inf, l = 0 and its zero accumulator.
    const float rescale = m_new == kNegInf ? 1.0f : __expf(m - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) {
      const float p = m_new == kNegInf ? 0.0f : __expf(x[e] - m_new);
      sum += p;
      p_w[r * L::kLdP + half * (kCols / 2) + e] = __float2bfloat16_rn(p);
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * rescale + sum;
    m = m_new;
    __syncwarp();
    // P V into the scratch, then acc = acc * rescale + P V on this lane's half of row r.
    FragAcc pv[kD / 16];
#pragma unroll
    for (int n = 0; n < kD / 16; ++n) wmma::fill_fragment(pv[n], 0.0f);
    accumulate_times_tile<kD>(pv, p_w, L::kLdP, v_s);
#pragma unroll
    for (int n = 0; n < kD / 16; ++n)
      wmma::store_matrix_sync(scratch + n * 16, pv[n], L::kLdS, wmma::mem_row_major);
    __syncwarp();
    for (int c = half * (kD / 2); c < (half + 1) * (kD / 2); ++c)
      acc[r * L::kLdO + c] = acc[r * L::kLdO + c] * rescale + scratch[r * L::kLdS + c];
    __syncwarp();
  }
  if (w0 >= t) return;
  if (half == 0) {
    inv_l[r] = l > 0.0f ? 1.0f / l : 0.0f;
    if (i < t) lse[b * t + i] = l > 0.0f ? m + __logf(l) : kNegInf;
  }
  __syncwarp();
  for (int rr = 0; rr < 16 && w0 + rr < t; ++rr) {
    for (int c = lane; c < kD; c += 32)
      out[(b * t + w0 + rr) * kD + c] = acc[rr * L::kLdO + c] * inv_l[rr];
  }
}

// ---- backward -----------------------------------------------------------------------------------

// dk and dv for 64 keys a block, over the query tiles that see them.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    tiled_grad_kv_kernel(const std::uint16_t* __restrict__ q, const std::uint16_t* __restrict__ k,
                         const std::uint16_t* __restrict__ v, const float* __restrict__ g,
                         const float* __restrict__ lse, const float* __restrict__ delta,
                         float* __restrict__ gk, float* __restrict__ gv, std::int64_t t,
                         std::int64_t s, bool causal, float scale) {
  using L = Layout<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  bf16* k_s = reinterpret_cast<bf16*>(smem);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::kTile);
  bf16* q_s = reinterpret_cast<bf16*>(smem + 2 * L::kTile);
  bf16* g_s = reinterpret_cast<bf16*>(smem + 3 * L::kTile);
  float* lse_s = reinterpret_cast<float*>(smem + 4 * L::kTile);
  float* delta_s = lse_s + kCols;
  unsigned char* mine =
      smem + 4 * L::kTile + 2 * sizeof(float) * kCols + warp * (L::kScratch + 2 * L::kProbs);
  float* scratch = reinterpret_cast<float*>(mine);
  bf16* pt_w = reinterpret_cast<bf16*>(mine + L::kScratch);
  bf16* dst_w = reinterpret_cast<bf16*>(mine + L::kScratch + L::kProbs);

  const std::int64_t key_blocks = (s + kRows - 1) / kRows;
  const std::int64_t b = blockIdx.x / key_blocks, j0 = (blockIdx.x % key_blocks) * kRows;
  const std::int64_t w0 = j0 + 16 * warp;  // the warp's first key
  const int r = lane >> 1, half = lane & 1;
  const std::int64_t j = w0 + r;  // this lane's key
  stage<kD>(k_s, k + (b * s + j0) * kD, min64(kRows, s - j0));
  stage<kD>(v_s, v + (b * s + j0) * kD, min64(kRows, s - j0));
  FragAcc dk[kD / 16], dv[kD / 16];
#pragma unroll
  for (int n = 0; n < kD / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  // Causal: query i sees key j when j <= i, so no query before j0 sees this block's keys.
  for (std::int64_t i0 = causal ? j0 : 0; i0 < t; i0 += kCols) {
    const std::int64_t rows = min64(kCols, t - i0);
    __syncthreads();
    stage<kD>(q_s, q + (b * t + i0) * kD, rows);
    stage_rounded<kD>(g_s, g + (b * t + i0) * kD, rows);
    for (int c = static_cast<int>(threadIdx.x); c < kCols; c += kThreads) {
      lse_s[c] = c < rows ? lse[b * t + i0 + c] : kPosInf;  // +inf: P = 0 past the last query
      delta_s[c] = c < rows ? delta[b * t + i0 + c] : 0.0f;
    }
    __syncthreads();
    if (w0 >= s || (causal && w0 > i0 + kCols - 1)) continue;  // warp-uniform
    // S^T = K_w Q^T (16 keys x 64 queries); P^T, kept in f32 for dS and rounded for dV.
    rows_times_tile<kD>(k_s + 16 * warp * L::kLd, L::kLd, q_s, L::kLd, scratch, L::kLdS);
    __syncwarp();
    float p[kCols / 2];
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) {
      const int c = half * (kCols / 2) + e;
      const std::int64_t i = i0 + c;
      // A row that saw no key (lse -inf: only from a caller's own lse) has no probabilities.
      const bool seen = i < t && j < s && !(causal && j > i) && lse_s[c] != kNegInf;
      p[e] = seen ? __expf(scratch[r * L::kLdS + c] * scale - lse_s[c]) : 0.0f;
      pt_w[r * L::kLdP + c] = __float2bfloat16_rn(p[e]);
    }
    __syncwarp();
    accumulate_times_tile<kD>(dv, pt_w, L::kLdP, g_s);  // dV += P^T dO
    // dP^T = V_w dO^T; dS^T = P^T (dP^T - Delta), rounded.
    rows_times_tile<kD>(v_s + 16 * warp * L::kLd, L::kLd, g_s, L::kLd, scratch, L::kLdS);
    __syncwarp();
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) {
      const int c = half * (kCols / 2) + e;
      dst_w[r * L::kLdP + c] = __float2bfloat16_rn(p[e] * (scratch[r * L::kLdS + c] - delta_s[c]));
    }
    __syncwarp();
    accumulate_times_tile<kD>(dk, dst_w, L::kLdP, q_s);  // dK += dS^T Q (scaled at the end)
  }
  if (w0 >= s) return;
  store_rows<kD>(dk, scratch, gk + b * s * kD, w0, s, scale);
  __syncwarp();
  store_rows<kD>(dv, scratch, gv + b * s * kD, w0, s, 1.0f);
}

// dq for 64 queries a block, over the key tiles they see.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    tiled_grad_q_kernel(const std::uint16_t* __restrict__ q, const std::uint16_t* __restrict__ k,
                        const std::uint16_t* __restrict__ v, const float* __restrict__ g,
                        const float* __restrict__ lse, const float* __restrict__ delta,
                        float* __restrict__ gq, std::int64_t t, std::int64_t s, bool causal,
                        float scale) {
  using L = Layout<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* g_s = reinterpret_cast<bf16*>(smem + L::kTile);
  bf16* k_s = reinterpret_cast<bf16*>(smem + 2 * L::kTile);
  bf16* v_s = reinterpret_cast<bf16*>(smem + 3 * L::kTile);
  unsigned char* mine = smem + 4 * L::kTile + warp * (L::kScratch + L::kProbs + 2 * L::kRowFloats);
  float* scratch = reinterpret_cast<float*>(mine);
  bf16* ds_w = reinterpret_cast<bf16*>(mine + L::kScratch);

  // A problem's query blocks last to first: under the causal mask the last see the most keys, and
  // starting them first leaves the short ones for the grid's tail (the same values either way).
  const std::int64_t row_blocks = (t + kRows - 1) / kRows;
  const std::int64_t b = blockIdx.x / row_blocks;
  const std::int64_t i0 = (row_blocks - 1 - blockIdx.x % row_blocks) * kRows;
  const std::int64_t w0 = i0 + 16 * warp;  // the warp's first query
  const int r = lane >> 1, half = lane & 1;
  const std::int64_t i = w0 + r;  // this lane's query
  const float row_lse = i < t ? lse[b * t + i] : kPosInf;
  const float row_delta = i < t ? delta[b * t + i] : 0.0f;
  stage<kD>(q_s, q + (b * t + i0) * kD, min64(kRows, t - i0));
  stage_rounded<kD>(g_s, g + (b * t + i0) * kD, min64(kRows, t - i0));
  FragAcc dq[kD / 16];
#pragma unroll
  for (int n = 0; n < kD / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);

  const std::int64_t end = causal ? min64(s, i0 + kRows) : s;
  for (std::int64_t j0 = 0; j0 < end; j0 += kCols) {
    __syncthreads();
    stage<kD>(k_s, k + (b * s + j0) * kD, min64(kCols, s - j0));
    stage<kD>(v_s, v + (b * s + j0) * kD, min64(kCols, s - j0));
    __syncthreads();
    if (w0 >= t || (causal && j0 > w0 + 15)) continue;  // warp-uniform
    rows_times_tile<kD>(q_s + 16 * warp * L::kLd, L::kLd, k_s, L::kLd, scratch, L::kLdS);
    __syncwarp();
    float p[kCols / 2];
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) {
      const int c = half * (kCols / 2) + e;
      const std::int64_t j = j0 + c;
      const bool seen = i < t && j < s && !(causal && j > i) && row_lse != kNegInf;
      p[e] = seen ? __expf(scratch[r * L::kLdS + c] * scale - row_lse) : 0.0f;
    }
    __syncwarp();  // every lane has read S before dP overwrites it
    rows_times_tile<kD>(g_s + 16 * warp * L::kLd, L::kLd, v_s, L::kLd, scratch, L::kLdS);
    __syncwarp();
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) {
      const int c = half * (kCols / 2) + e;
      ds_w[r * L::kLdP + c] = __float2bfloat16_rn(p[e] * (scratch[r * L::kLdS + c] - row_delta));
    }
    __syncwarp();
    accumulate_times_tile<kD>(dq, ds_w, L::kLdP, k_s);  // dQ += dS K (scaled at the end)
  }
  if (w0 >= t) return;
  store_rows<kD>(dq, scratch, gq + b * t * kD, w0, t, scale);
}

// ---- host side ----------------------------------------------------------------------------------

unsigned block_grid(std::int64_t batch, std::int64_t rows) {
  return row_blocks(batch, rows, kRows);
}

}  // namespace

AttentionKernels attention_kernels() {
  static const AttentionKernels kernels = [] {
    const char* env = std::getenv("HPM_CUDA_ATTENTION");
    if (env == nullptr || std::strcmp(env, "mma") == 0) return AttentionKernels::kMma;
    if (std::strcmp(env, "mma16") == 0) return AttentionKernels::kMma16;
    if (std::strcmp(env, "wmma") == 0) return AttentionKernels::kWmma;
    if (std::strcmp(env, "rowwise") == 0) return AttentionKernels::kRowwise;
    throw std::invalid_argument(std::string("HPM_CUDA_ATTENTION=") + env +
                                ": expected mma, mma16, wmma or rowwise");
  }();
  return kernels;
}

namespace {

// The WMMA kernels' largest shared memory at head size d (129,280 bytes at 128: more than an sm_86
// or sm_89 card gives a block, where these kernels then leave attention to the row-wise ones
// rather than fail at launch; attention_mma.cu's need at most 87 KiB).
std::size_t wmma_smem(std::int64_t d) {
  std::size_t bytes = 0;
  with_tensor_core_head_size(static_cast<int>(d), [&](auto size) {
    using L = Layout<decltype(size)::value>;
    bytes = std::max({L::kForward, L::kGradQ, L::kGradKv});
  });
  return bytes;
}

}  // namespace

bool tiled_attention_applies(std::int64_t d, const void* q, const void* k, const void* v,
                             const void* grad_out) {
  const AttentionKernels kernels = attention_kernels();
  return kernels != AttentionKernels::kRowwise && (d == 32 || d == 64 || d == 128) &&
         aligned16(q) && aligned16(k) && aligned16(v) &&
         (grad_out == nullptr || aligned16(grad_out)) &&
         (kernels != AttentionKernels::kWmma || wmma_smem(d) <= max_dynamic_smem());
}

void tiled_attention_forward(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                             float* out, float* lse, std::int64_t batch, std::int64_t t,
                             std::int64_t s, int d, bool causal, float scale, cudaStream_t stream) {
  if (batch * t == 0) return;
  with_tensor_core_head_size(d, [&](auto size) {
    constexpr int kD = decltype(size)::value;
    auto* kernel = tiled_forward_kernel<kD>;
    allow_dynamic_smem(kernel, Layout<kD>::kForward);
    kernel<<<block_grid(batch, t), kThreads, Layout<kD>::kForward, stream>>>(q, k, v, out, lse, t,
                                                                             s, causal, scale);
    HPM_CUDA_LAUNCH_CHECK("tiled_forward_kernel");
  });
}

void tiled_attention_backward(const std::uint16_t* q, const std::uint16_t* k,
                              const std::uint16_t* v, const float* grad_out, const float* lse,
                              const float* delta, float* gq, float* gk, float* gv,
                              std::int64_t batch, std::int64_t t, std::int64_t s, int d,
                              bool causal, float scale, cudaStream_t stream) {
  with_tensor_core_head_size(d, [&](auto size) {
    constexpr int kD = decltype(size)::value;
    if (gq != nullptr && batch * t > 0) {
      auto* kernel = tiled_grad_q_kernel<kD>;
      allow_dynamic_smem(kernel, Layout<kD>::kGradQ);
      kernel<<<block_grid(batch, t), kThreads, Layout<kD>::kGradQ, stream>>>(
          q, k, v, grad_out, lse, delta, gq, t, s, causal, scale);
      HPM_CUDA_LAUNCH_CHECK("tiled_grad_q_kernel");
    }
    if (gk != nullptr && gv != nullptr && batch * s > 0) {
      auto* kernel = tiled_grad_kv_kernel<kD>;
      allow_dynamic_smem(kernel, Layout<kD>::kGradKv);
      kernel<<<block_grid(batch, s), kThreads, Layout<kD>::kGradKv, stream>>>(
          q, k, v, grad_out, lse, delta, gk, gv, t, s, causal, scale);
      HPM_CUDA_LAUNCH_CHECK("tiled_grad_kv_kernel");
    }
  });
}

}  // namespace hpm::cuda
