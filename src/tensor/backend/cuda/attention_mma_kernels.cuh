// The kernels of attention_mma.cu (its opening comment tells the tiling), apart from their
// launchers so that tests/cuda_emulated can also compile them for the CPU (HPM_SIMT_EMULATION:
// mma_tiles.cuh's instruments then run on tests/cuda_emulated/simt.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tensor/backend/cuda/attention_mma.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/mma_tiles.cuh"
#include "tensor/backend/cuda/ordered_turns.cuh"

namespace hpm::cuda {

namespace {

constexpr int kRows = 64;  // rows a block owns (queries, or keys for dk and dv)
constexpr int kWarps = 4;  // 16 rows each
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;  // bf16 elements of row padding
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Columns of the tiles a kernel loops over: 64, but 32 for dk/dv and dq at head size 128, whose
// four f32 accumulators of 16 x 128 would not fit the registers beside 64-wide score tiles.
template <int kD>
constexpr int kBackwardCols = kD == 128 ? 32 : 64;

template <int kD>
constexpr int kLd = kD + kPad;  // a staged row, in bf16 elements

template <int kD>
constexpr std::size_t tile_bytes(int rows) {
  return sizeof(bf16) * static_cast<std::size_t>(rows) * kLd<kD>;
}

// The forward takes kM 16-row query tiles a warp: two share every K and V fragment they load
// (half the shared-memory reads per product) at twice the registers, and so half the warps an SM
// holds (the launcher's choice, attention_mma.cu). Its block's queries, and its shared memory: Q,
// and two buffers of K and V tiles of kRows keys.
template <int kM>
constexpr int kForwardRows = kWarps * 16 * kM;
template <int kD, int kM>
constexpr std::size_t kForwardSmem = tile_bytes<kD>(kForwardRows<kM>) + 4 * tile_bytes<kD>(kRows);
// dq: Q and dO, and two buffers of K and V tiles.
template <int kD>
constexpr std::size_t kGradQSmem = 2 * tile_bytes<kD>(kRows) +
                                   4 * tile_bytes<kD>(kBackwardCols<kD>);
// dk, dv: K and V, and two buffers of a Q and a dO tile and the tile's lse and Delta; with dq,
// also the tile's dS^T (kRows keys of kBackwardCols queries).
template <int kD>
constexpr int kLdS = kBackwardCols<kD> + kPad;
template <int kD, bool kWithDq = false>
constexpr std::size_t kGradKvSmem =
    2 * tile_bytes<kD>(kRows) + 4 * tile_bytes<kD>(kBackwardCols<kD>) +
    4 * sizeof(float) * kBackwardCols<kD> +
    (kWithDq ? sizeof(bf16) * static_cast<std::size_t>(kRows) * kLdS<kD> : 0);

// Where the one-pass backward's key blocks add their shares of dq: an f32 sum of each problem's t
// rows of kD (row p t + i), and a turn counter a (problem, query tile of kBackwardCols rows), zero
// at the launch (ordered_turns.cuh).
struct DqShares {
  float* sums;
  int* turns;
};

// Query tiles of kBackwardCols rows in t rows: the one-pass backward's turn counters a problem.
template <int kD>
__host__ __device__ constexpr std::int64_t dq_tiles(std::int64_t t) {
  return (t + kBackwardCols<kD> - 1) / kBackwardCols<kD>;
}

// Where problem p's rows start in a tensor whose rows are `stride` elements apart: problems are
// the heads of each batch element in turn (AttentionLayout).
__device__ __forceinline__ std::int64_t first_row(const AttentionLayout& layout, std::int64_t p,
                                                  std::int64_t rows, std::int64_t stride, int d) {
  return (p / layout.heads) * rows * stride + (p % layout.heads) * d;
}

__device__ __forceinline__ std::int64_t min64(std::int64_t a, std::int64_t b) {
  return a < b ? a : b;
}

// Rows [0, rows) of kD bf16 elements, `stride` elements apart from src, into `tile_rows` rows of a
// staged tile (zeros past `rows`), asynchronously: the caller commits and waits. Every thread of
// the block takes part.
//
// A thread copies the same 16-byte column of every kStep-th row, so its source and destination
// step by constants: one 64-bit add a copy, where an index per copy cost a 64-bit multiply and a
// division (about 26 instructions a copy in the forward's loop, by its sm_90 SASS; the copies were
// a fifth of the loop's instructions).
template <int kD>
__device__ void stage_async(bf16* dst, const std::uint16_t* __restrict__ src, std::int64_t rows,
                            int tile_rows, std::int64_t stride) {
  constexpr int kVec = kD / 8;  // 16-byte pieces of a row
  static_assert(kThreads % kVec == 0, "a thread keeps one column of the rows it copies");
  constexpr int kStep = kThreads / kVec;  // rows one pass of the block covers
  const int r0 = static_cast<int>(threadIdx.x) / kVec;
  const int c = (static_cast<int>(threadIdx.x) % kVec) * 8;
  const int valid_rows = rows < tile_rows ? static_cast<int>(rows) : tile_rows;
  const std::uint16_t* from = src + r0 * stride + c;
  bf16* to = dst + r0 * kLd<kD> + c;
  for (int r = r0; r < tile_rows; r += kStep, from += kStep * stride, to += kStep * kLd<kD>) {
    const bool valid = r < valid_rows;
    cp_async16(to, valid ? from : src, valid);
  }
}

// A row's lse (natural log) as the backward subtracts it in log2 units: +inf for a row that
// saw no key (lse -inf) or is past the problem's end, so that its probabilities come out 0.
__device__ __forceinline__ float lse_log2(float lse, bool row_exists) {
  return row_exists && lse != kNegInf ? lse * kLog2e : kPosInf;
}

// Whether (query i, key j) is masked: past the keys, or after the query under the causal mask.
__device__ __forceinline__ bool masked(std::int64_t i, std::int64_t j, std::int64_t s,
                                       bool causal) {
  return j >= s || (causal && j > i);
}

// ---- forward
// -------------------------------------------------------------------------------------

// One tile of raw scores q.k for this lane's rows i_lo and i_lo + 8, turned into probabilities
// exp2(scale2 (s - m)) in place, one FFMA and an ex2 a score (FlashAttention-2's folding: the max
// is taken over raw scores, which orders them as the scaled ones only for scale2 > 0, the
// launchers' condition): masked scores (tested only where `edge` says a mask may fall) are -inf,
// the running raw max m (quad-uniform) and this lane's share of the sum l move on, and the output
// accumulator o is rescaled to the new max.
template <int kNT, int kD>
__device__ __forceinline__ void online_softmax(float (&sc)[kNT][4], float (&o)[kD / 8][4],
                                               float (&m)[2], float (&l)[2], bool edge,
                                               std::int64_t j0, std::int64_t i_lo, std::int64_t s,
                                               bool causal, float scale2) {
  const int quad = static_cast<int>(threadIdx.x) & 3;
  if (edge) {
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const std::int64_t j = j0 + 8 * n + 2 * quad + (e & 1);
        if (masked(i_lo + (e < 2 ? 0 : 8), j, s, causal)) sc[n][e] = kNegInf;
      }
    }
  }
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    tile_max[0] = fmaxf(tile_max[0], fmaxf(sc[n][0], sc[n][1]));
    tile_max[1] = fmaxf(tile_max[1], fmaxf(sc[n][2], sc[n][3]));
  }
  float rescale[2], sum[2] = {0.0f, 0.0f}, shift[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float new_m = fmaxf(m[h], quad_max(tile_max[h]));
    // A row that has seen nothing yet keeps m = -inf, l = 0 and its zero accumulator.
    shift[h] = new_m == kNegInf ? 0.0f : -new_m * scale2;
    rescale[h] = new_m == kNegInf ? 1.0f : exp2_fast(fmaf(m[h], scale2, shift[h]));
    m[h] = new_m;
  }
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1;
      // A masked score (-inf) gives 0, also in a row that has seen nothing yet (shift 0).
      sc[n][e] = exp2_fast(fmaf(sc[n][e], scale2, shift[h]));
      sum[h] += sc[n][e];
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = l[h] * rescale[h] + sum[h];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    o[n][0] *= rescale[0];
    o[n][1] *= rescale[0];
    o[n][2] *= rescale[1];
    o[n][3] *= rescale[1];
  }
}

template <int kD, int kM, typename Out>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(const std::uint16_t* __restrict__ q, const std::uint16_t* __restrict__ k,
                       const std::uint16_t* __restrict__ v, Out* __restrict__ out,
                       float* __restrict__ lse, std::int64_t t, std::int64_t s, bool causal,
                       float scale, AttentionLayout layout) {
  const float scale2 = scale * kLog2e;          // scores in log2 units
  constexpr int kBlockRows = kForwardRows<kM>;  // queries of the block
  constexpr int kN = kRows;                     // keys a tile
  constexpr int kLdD = kLd<kD>;
  bf16* q_s = reinterpret_cast<bf16*>(dynamic_smem());
  // Buffer c of K is k_s + c kN rows, of V v_s + c kN rows (pointer arithmetic, not an array of
  // pointers, which a runtime index would put in local memory).
  bf16* const k_s = q_s + kBlockRows * kLdD;
  bf16* const v_s = k_s + 2 * kN * kLdD;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, quad = lane & 3;

  // A problem's query blocks last to first: under the causal mask the last see the most keys, and
  // starting them first leaves the short ones for the grid's tail (the same values either way).
  const std::int64_t row_blocks = (t + kBlockRows - 1) / kBlockRows;
  const std::int64_t b = blockIdx.x / row_blocks;
  const std::int64_t i0 = (row_blocks - 1 - blockIdx.x % row_blocks) * kBlockRows;
  const std::int64_t w0 = i0 + 16 * kM * warp;  // the warp's first query
  const std::int64_t kv = layout.kv;
  const std::uint16_t* kb = k + first_row(layout, b, s, kv, kD);
  const std::uint16_t* vb = v + first_row(layout, b, s, kv, kD);

  const std::int64_t end = causal ? min64(s, i0 + kBlockRows) : s;
  const int tiles = static_cast<int>((end + kN - 1) / kN);
  stage_async<kD>(q_s, q + first_row(layout, b, t, layout.q, kD) + i0 * layout.q,
                  min64(kBlockRows, t - i0), kBlockRows, layout.q);
  if (tiles > 0) {
    stage_async<kD>(k_s, kb, min64(kN, s), kN, kv);
    stage_async<kD>(v_s, vb, min64(kN, s), kN, kv);
  }
  cp_async_commit();

  float o[kM][kD / 8][4];
  float m[kM][2], l[kM][2];  // per tile, rows g and g + 8; l: this lane's share
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    zero(o[mt]);
    m[mt][0] = m[mt][1] = kNegInf;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  for (int it = 0; it < tiles; ++it) {
    const std::int64_t j0 = static_cast<std::int64_t>(it) * kN;
    cp_async_wait<0>();
    __syncthreads();  // tile it is in; every warp is done with tile it - 1's buffer
    if (it + 1 < tiles) {
      const int nb = (it + 1) & 1;
      stage_async<kD>(k_s + nb * kN * kLdD, kb + (j0 + kN) * kv, min64(kN, s - j0 - kN), kN, kv);
      stage_async<kD>(v_s + nb * kN * kLdD, vb + (j0 + kN) * kv, min64(kN, s - j0 - kN), kN, kv);
    }
    cp_async_commit();
    // Warp-uniform: no query of the warp, or (causal) no key of the tile any of them sees.
    if (w0 >= t || (causal && j0 > w0 + 16 * kM - 1)) continue;
    const int cb = it & 1;
    float sc[kM][kN / 8][4];
    tiles_times_rows<kD, kN / 8, kM>(sc, q_s + 16 * kM * warp * kLdD, k_s + cb * kN * kLdD, kLdD);
    // Only a tile at the keys' end or on the causal mask's diagonal can mask (warp-uniform).
    const bool edge = j0 + kN > s || (causal && j0 + kN - 1 > w0);
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      online_softmax<kN / 8, kD>(sc[mt], o[mt], m[mt], l[mt], edge, j0, w0 + 16 * mt + g, s, causal,
                                 scale2);
    }
    probs_times_tiles<kN / 8, kD, kM>(o, sc, v_s + cb * kN * kLdD, kLdD);
  }
  cp_async_wait<0>();  // nothing left in flight when the block exits
  if (w0 >= t) return;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const std::int64_t i_lo = w0 + 16 * mt + g;
    const float sum_lo = quad_sum(l[mt][0]), sum_hi = quad_sum(l[mt][1]);
    if (quad == 0) {
      // m is a raw score, m scale2 in log2 units; lse in natural ones, as the CPU's.
      if (i_lo < t) {
        lse[b * t + i_lo] = sum_lo > 0.0f ? m[mt][0] * scale2 * kLn2 + __logf(sum_lo) : kNegInf;
      }
      if (i_lo + 8 < t) {
        lse[b * t + i_lo + 8] = sum_hi > 0.0f ? m[mt][1] * scale2 * kLn2 + __logf(sum_hi) : kNegInf;
      }
    }
    store_rows<kD>(o[mt], out + first_row(layout, b, t, layout.out, kD), w0 + 16 * mt, t,
                   layout.out, sum_lo > 0.0f ? 1.0f / sum_lo : 0.0f,
                   sum_hi > 0.0f ? 1.0f / sum_hi : 0.0f);
  }
}

// ---- backward
// ------------------------------------------------------------------------------------

// dq for 64 queries a block, over the key tiles they see; K and V tiles double-buffered.
template <int kD, typename Grad>
__global__ void __launch_bounds__(kThreads)
    mma_grad_q_kernel(const std::uint16_t* __restrict__ q, const std::uint16_t* __restrict__ k,
                      const std::uint16_t* __restrict__ v,
                      const std::uint16_t* __restrict__ grad_out, const float* __restrict__ lse,
                      const float* __restrict__ delta, Grad* __restrict__ gq, std::int64_t t,
                      std::int64_t s, bool causal, float scale, AttentionLayout layout) {
  const float scale2 = scale * kLog2e;   // scores in log2 units
  constexpr int kN = kBackwardCols<kD>;  // keys a tile
  constexpr int kLdD = kLd<kD>;
  bf16* q_s = reinterpret_cast<bf16*>(dynamic_smem());
  bf16* g_s = q_s + kRows * kLdD;
  bf16* const k_s = g_s + kRows * kLdD;  // two buffers of kN rows each, as the forward's
  bf16* const v_s = k_s + 2 * kN * kLdD;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, quad = lane & 3;

  const std::int64_t row_blocks = (t + kRows - 1) / kRows;
  const std::int64_t b = blockIdx.x / row_blocks;
  const std::int64_t i0 = (row_blocks - 1 - blockIdx.x % row_blocks) * kRows;
  const std::int64_t w0 = i0 + 16 * warp;
  const std::int64_t i_lo = w0 + g, i_hi = i_lo + 8;
  // A row that saw no key (lse -inf: only from a caller's own lse) has no probabilities.
  const float lse_lo = lse_log2(i_lo < t ? lse[b * t + i_lo] : kNegInf, i_lo < t);
  const float lse_hi = lse_log2(i_hi < t ? lse[b * t + i_hi] : kNegInf, i_hi < t);
  const float delta_lo = i_lo < t ? delta[b * t + i_lo] : 0.0f;
  const float delta_hi = i_hi < t ? delta[b * t + i_hi] : 0.0f;
  const std::int64_t kv = layout.kv;
  const std::uint16_t* kb = k + first_row(layout, b, s, kv, kD);
  const std::uint16_t* vb = v + first_row(layout, b, s, kv, kD);

  const std::int64_t end = causal ? min64(s, i0 + kRows) : s;
  const int tiles = static_cast<int>((end + kN - 1) / kN);
  stage_async<kD>(q_s, q + first_row(layout, b, t, layout.q, kD) + i0 * layout.q,
                  min64(kRows, t - i0), kRows, layout.q);
  if (tiles > 0) {
    stage_async<kD>(k_s, kb, min64(kN, s), kN, kv);
    stage_async<kD>(v_s, vb, min64(kN, s), kN, kv);
  }
  stage_async<kD>(g_s, grad_out + first_row(layout, b, t, layout.out, kD) + i0 * layout.out,
                  min64(kRows, t - i0), kRows, layout.out);
  cp_async_commit();

  float dq[kD / 8][4];
  zero(dq);
  for (int it = 0; it < tiles; ++it) {
    const std::int64_t j0 = static_cast<std::int64_t>(it) * kN;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < tiles) {
      const int nb = (it + 1) & 1;
      stage_async<kD>(k_s + nb * kN * kLdD, kb + (j0 + kN) * kv, min64(kN, s - j0 - kN), kN, kv);
      stage_async<kD>(v_s + nb * kN * kLdD, vb + (j0 + kN) * kv, min64(kN, s - j0 - kN), kN, kv);
    }
    cp_async_commit();
    if (w0 >= t || (causal && j0 > w0 + 15)) continue;  // warp-uniform
    const int cb = it & 1;
    float p[kN / 8][4], dp[kN / 8][4];
    rows_times_rows<kD, kN / 8>(p, q_s + 16 * warp * kLdD, k_s + cb * kN * kLdD, kLdD);
    rows_times_rows<kD, kN / 8>(dp, g_s + 16 * warp * kLdD, v_s + cb * kN * kLdD, kLdD);
    const bool edge = j0 + kN > s || (causal && j0 + kN - 1 > w0);  // warp-uniform
    // Every probability, then the edge tiles' masks over them, then dS: a select inside the
    // exponential's loop compiled to a branch around each ex2 (sm_90 SASS).
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[n][e] = exp2_fast(p[n][e] * scale2 - (e < 2 ? lse_lo : lse_hi));
      }
    }
    if (edge) {
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const std::int64_t j = j0 + 8 * n + 2 * quad + (e & 1);
          if (masked(e < 2 ? i_lo : i_hi, j, s, causal)) p[n][e] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[n][e] *= dp[n][e] - (e < 2 ? delta_lo : delta_hi);  // dS
    }
    probs_times_tile<kN / 8, kD>(dq, p, k_s + cb * kN * kLdD,
                                 kLdD);  // dQ += dS K (scaled at the end)
  }
  cp_async_wait<0>();
  if (w0 >= t) return;
  store_rows<kD>(dq, gq + first_row(layout, b, t, layout.grad_q, kD), w0, t, layout.grad_q, scale,
                 scale);
}

// This key block's share of dq for query tile i0 (kN rows), dS K over its kRows keys from dS^T in
// ds_s and K in k_s, added in the turn ordered_turns.cuh keeps: the warps split the tile's kN x kD
// into 16-row, kD / (4 kN / 16)-column parts. The key blocks that see a query tile add in the
// order of their first keys, last to first (under the causal mask the one on the diagonal reaches
// it first), so block 0 adds last: it takes the sum, adds its share and writes dq, times `scale`,
// in Grad; the first to add stores its share, the others add theirs in L2.
//
// The turn a block passes on is returned (null for block 0's, which no block waits for), for the
// caller to release: under the causal mask the next block in the order reaches the tile an
// iteration later than this one, so the caller releases it in the middle of its next iteration,
// when the fence's wait for the shares to be done in L2 has nothing left to wait for; without the
// mask every block reaches the tile at once, and the caller releases it at once.
template <int kD, typename Grad>
__device__ __forceinline__ int* add_dq_share(const bf16* ds_s, const bf16* k_s, DqShares shares,
                                             Grad* __restrict__ gq, std::int64_t b, std::int64_t i0,
                                             std::int64_t key_block, std::int64_t key_blocks,
                                             std::int64_t t, bool causal, float scale,
                                             const AttentionLayout& layout) {
  constexpr int kN = kBackwardCols<kD>;
  constexpr int kRowTiles = kN / 16, kParts = kWarps / kRowTiles, kSpan = kD / kParts;
  static_assert(kWarps % kRowTiles == 0 && kD % (16 * kParts) == 0, "whole parts a warp");
  constexpr int kLdD = kLd<kD>;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int rt = warp % kRowTiles, c0 = (warp / kRowTiles) * kSpan;
  float part[kSpan / 8][4];
  zero(part);
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) {
    std::uint32_t a[4];
    load_a_by_cols(a, ds_s, kLdS<kD>, 16 * kk, 16 * rt);
#pragma unroll
    for (int n = 0; n < kSpan / 8; n += 2) {
      std::uint32_t b0[2], b1[2];
      load_b_by_cols(b0, b1, k_s + 16 * kk * kLdD, kLdD, c0 + 8 * n);
      mma(part[n], a, b0);
      mma(part[n + 1], a, b1);
    }
  }
  const std::int64_t tile = i0 / kN;
  const std::int64_t last = causal ? min64(key_blocks - 1, (i0 + kN - 1) / kRows) : key_blocks - 1;
  const int rank = static_cast<int>(last - key_block);
  int* turn = shares.turns + b * dq_tiles<kD>(t) + tile;
  if (rank > 0) wait_turn(turn, rank);
  const std::int64_t r_lo = i0 + 16 * rt + (lane >> 2), r_hi = r_lo + 8;
  float* sums = shares.sums + b * t * kD;
  Grad* out = gq + first_row(layout, b, t, layout.grad_q, kD);
  // f(lo, hi, r, c) for each of this lane's pairs of the share (lo, hi at row r, columns c and
  // c + 1), the rows before t.
  const auto each_pair = [&](auto&& f) {
#pragma unroll
    for (int n = 0; n < kSpan / 8; ++n) {
      const int c = c0 + 8 * n + 2 * (lane & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::int64_t r = h == 0 ? r_lo : r_hi;
        if (r < t) f(part[n][2 * h], part[n][2 * h + 1], r, c);
      }
    }
  };
  if (key_block == 0 && rank > 0) {
    // Every pair of the sum read before any is added or stored: one L2 round trip for the lot,
    // where reads behind stores the compiler cannot tell apart (dq could alias the sums) would
    // each wait for the one before.
    each_pair([&](float& lo, float& hi, std::int64_t r, int c) {
      const float2 before = load_pair(sums + r * kD + c);
      lo += before.x;
      hi += before.y;
    });
  }
  each_pair([&](float lo, float hi, std::int64_t r, int c) {
    float* sum = sums + r * kD + c;
    if (key_block == 0) {
      store_pair(out + r * layout.grad_q + c, lo * scale, hi * scale);
    } else if (rank == 0) {
      store_as(sum, make_float2(lo, hi));
    } else {
      add_pair(sum, lo, hi);
    }
  });
  return key_block != 0 ? turn : nullptr;
}

// A warp's part of one query tile in the dk/dv kernel: its 16 keys (rows of k_w and v_w) against
// the tile's kN queries (qt, gt, and their lse in log2 units and Delta), S^T = K_w Q^T and
// dP^T = V_w dO^T, then P^T, the masks where the tile is at an edge, and dS^T over P^T; dV += P^T
// dO, dK += dS^T Q (scaled by the caller). kWithDq: dS^T, rounded to bf16 as the dK product
// rounds it, also to the warp's 16 rows of ds_s.
template <int kD, bool kWithDq>
__device__ __forceinline__ void tile_grads(float (&dk)[kD / 8][4], float (&dv)[kD / 8][4],
                                           bf16* ds_s, const bf16* k_w, const bf16* v_w,
                                           const bf16* qt, const bf16* gt, const float* lse_t,
                                           const float* delta_t, std::int64_t i0, std::int64_t w0,
                                           std::int64_t s, bool causal, float scale2) {
  constexpr int kN = kBackwardCols<kD>;
  constexpr int kLdD = kLd<kD>;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, quad = lane & 3;
  const std::int64_t j_lo = w0 + g, j_hi = j_lo + 8;
  float p[kN / 8][4], dp[kN / 8][4];
  rows_times_rows<kD, kN / 8>(p, k_w, qt, kLdD);
  rows_times_rows<kD, kN / 8>(dp, v_w, gt, kLdD);
  const bool edge = w0 + 15 >= s || (causal && w0 + 15 > i0);  // warp-uniform
  // As in the dq kernel: every probability, the edge tiles' masks, then dS^T.
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[n][e] = exp2_fast(p[n][e] * scale2 - lse_t[8 * n + 2 * quad + (e & 1)]);
    }
  }
  if (edge) {
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * n + 2 * quad + (e & 1);
        if (masked(i0 + c, e < 2 ? j_lo : j_hi, s, causal)) p[n][e] = 0.0f;
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dp[n][e] = p[n][e] * (dp[n][e] - delta_t[8 * n + 2 * quad + (e & 1)]);  // dS^T
    }
  }
  probs_times_tile<kN / 8, kD>(dv, p, gt, kLdD);   // dV += P^T dO
  probs_times_tile<kN / 8, kD>(dk, dp, qt, kLdD);  // dK += dS^T Q
  if constexpr (kWithDq) {
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) {
      store_as(ds_s + (16 * warp + g) * kLdS<kD> + 8 * n + 2 * quad, pack(dp[n][0], dp[n][1]));
      store_as(ds_s + (16 * warp + g + 8) * kLdS<kD> + 8 * n + 2 * quad, pack(dp[n][2], dp[n][3]));
    }
  }
}

// dk and dv for 64 keys a block, over the query tiles that see them; the query tiles (Q, dO, lse
// and Delta) double-buffered, the next one's copies in flight while this one's products run.
// kWithDq: the one-pass backward, each tile's dS^T also staged for the block's share of dq
// (add_dq_share), and the key blocks of a problem launched last to first, the order of their
// turns.
template <int kD, typename Grad, bool kWithDq = false>
__global__ void __launch_bounds__(kThreads)
    mma_grad_kv_kernel(const std::uint16_t* __restrict__ q, const std::uint16_t* __restrict__ k,
                       const std::uint16_t* __restrict__ v,
                       const std::uint16_t* __restrict__ grad_out, const float* __restrict__ lse,
                       const float* __restrict__ delta, Grad* __restrict__ gk,
                       Grad* __restrict__ gv, std::int64_t t, std::int64_t s, bool causal,
                       float scale, AttentionLayout layout, Grad* __restrict__ gq,
                       DqShares shares) {
  const float scale2 = scale * kLog2e;   // scores in log2 units
  constexpr int kN = kBackwardCols<kD>;  // queries a tile
  constexpr int kLdD = kLd<kD>;
  // K and V; then buffer c's Q tile at q_s + c kN rows, its dO tile at g_s + c kN rows, its lse
  // and Delta at lse_s + c kN and delta_s + c kN; with dq, dS^T (kRows rows of kLdS) last.
  bf16* const k_s = reinterpret_cast<bf16*>(dynamic_smem());
  bf16* const v_s = k_s + kRows * kLdD;
  bf16* const q_s = v_s + kRows * kLdD;
  bf16* const g_s = q_s + 2 * kN * kLdD;
  float* const lse_s = reinterpret_cast<float*>(g_s + 2 * kN * kLdD);
  float* const delta_s = lse_s + 2 * kN;
  bf16* const ds_s = reinterpret_cast<bf16*>(delta_s + 2 * kN);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, quad = lane & 3;

  const std::int64_t key_blocks = (s + kRows - 1) / kRows;
  const std::int64_t b = blockIdx.x / key_blocks, slot = blockIdx.x % key_blocks;
  const std::int64_t key_block = kWithDq ? key_blocks - 1 - slot : slot;
  const std::int64_t j0 = key_block * kRows;
  const std::int64_t w0 = j0 + 16 * warp;  // the warp's first key
  const std::int64_t kv = layout.kv;
  const std::uint16_t* qb = q + first_row(layout, b, t, layout.q, kD);
  const std::uint16_t* gb = grad_out + first_row(layout, b, t, layout.out, kD);
  // Causal: query i sees key j when j <= i, so no query before j0 sees this block's keys.
  const std::int64_t first = causal ? j0 : 0;
  const int tiles = first < t ? static_cast<int>((t - first + kN - 1) / kN) : 0;
  // Query tile `it` (at first + it kN) into buffer c: Q and dO by cp.async (the caller commits);
  // its lse and Delta are read into a thread's registers (read_stats: thread r < kN takes row r)
  // and stored into the buffer later (store_stats, lse in log2 units), seen after the next
  // barrier: a store right behind its read would hold the warp for the read's whole latency, where
  // the tile's products can run in between.
  static_assert(kN <= kThreads, "a thread a row of the tile's statistics");
  const auto stage_queries = [&](int it, int c) {
    const std::int64_t i0 = first + static_cast<std::int64_t>(it) * kN;
    const std::int64_t rows = min64(kN, t - i0);
    stage_async<kD>(q_s + c * kN * kLdD, qb + i0 * layout.q, rows, kN, layout.q);
    stage_async<kD>(g_s + c * kN * kLdD, gb + i0 * layout.out, rows, kN, layout.out);
  };
  struct RowStats {
    float lse = kNegInf, delta = 0.0f;
    bool exists = false;
  };
  const auto read_stats = [&](int it) {
    const std::int64_t i0 = first + static_cast<std::int64_t>(it) * kN;
    const int r = static_cast<int>(threadIdx.x);
    RowStats row;
    if (r < kN && i0 + r < t) row = {lse[b * t + i0 + r], delta[b * t + i0 + r], true};
    return row;
  };
  const auto store_stats = [&](int c, const RowStats& row) {
    const int r = static_cast<int>(threadIdx.x);
    if (r >= kN) return;
    lse_s[c * kN + r] = lse_log2(row.lse, row.exists);
    delta_s[c * kN + r] = row.delta;
  };
  stage_async<kD>(k_s, k + first_row(layout, b, s, kv, kD) + j0 * kv, min64(kRows, s - j0), kRows,
                  kv);
  stage_async<kD>(v_s, v + first_row(layout, b, s, kv, kD) + j0 * kv, min64(kRows, s - j0), kRows,
                  kv);
  if (tiles > 0) {
    stage_queries(0, 0);
    store_stats(0, read_stats(0));
  }
  cp_async_commit();

  float dk[kD / 8][4], dv[kD / 8][4];
  zero(dk);
  zero(dv);
  int* turn_to_pass = nullptr;  // with dq: the last tile's turn, not yet passed on (block-uniform)
  for (int it = 0; it < tiles; ++it) {
    const std::int64_t i0 = first + static_cast<std::int64_t>(it) * kN;
    cp_async_wait<0>();
    __syncthreads();  // tile it is in; every warp is done with tile it - 1's buffers and dS^T
    RowStats next;
    if (it + 1 < tiles) {
      stage_queries(it + 1, (it + 1) & 1);
      next = read_stats(it + 1);
    }
    cp_async_commit();
    // Warp-uniform: no key of the warp, or (causal) none that a query of the tile sees. With dq
    // such a warp's dS^T rows are zeros, and the barriers below are the whole block's.
    if (w0 >= s || (causal && w0 > i0 + kN - 1)) {
      if constexpr (kWithDq) {
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
          store_as(ds_s + (16 * warp + g) * kLdS<kD> + 8 * n + 2 * quad, std::uint32_t{0});
          store_as(ds_s + (16 * warp + g + 8) * kLdS<kD> + 8 * n + 2 * quad, std::uint32_t{0});
        }
      }
    } else {
      tile_grads<kD, kWithDq>(dk, dv, ds_s, k_s + 16 * warp * kLdD, v_s + 16 * warp * kLdD,
                              q_s + (it & 1) * kN * kLdD, g_s + (it & 1) * kN * kLdD,
                              lse_s + (it & 1) * kN, delta_s + (it & 1) * kN, i0, w0, s, causal,
                              scale2);
    }
    if (it + 1 < tiles) store_stats((it + 1) & 1, next);
    if constexpr (kWithDq) {
      // The last tile's shares were written before this iteration's first barrier: its turn goes
      // on now, an iteration's products after them (add_dq_share says why).
      if (turn_to_pass != nullptr) release_turn(turn_to_pass);
      __syncthreads();  // dS^T complete
      turn_to_pass = add_dq_share<kD, Grad>(ds_s, k_s, shares, gq, b, i0, key_block, key_blocks, t,
                                            causal, scale, layout);
      if (turn_to_pass != nullptr && !causal) {
        pass_turn(turn_to_pass);
        turn_to_pass = nullptr;
      }
    }
  }
  if constexpr (kWithDq) {
    if (turn_to_pass != nullptr) pass_turn(turn_to_pass);
  }
  cp_async_wait<0>();  // a block whose loop never ran still has K and V in flight
  if (w0 >= s) return;
  const std::int64_t gkv = layout.grad_kv;
  store_rows<kD>(dk, gk + first_row(layout, b, s, gkv, kD), w0, s, gkv, scale, scale);
  store_rows<kD>(dv, gv + first_row(layout, b, s, gkv, kD), w0, s, gkv, 1.0f, 1.0f);
}

// ---- Delta
// ---------------------------------------------------------------------------------------

// Delta = rowsum(grad_out * out) for each problem's t rows, in (problem, row) order as lse, from
// rows laid out as `layout.out` says; out F32 or BF16 (its bits). A warp a row: the f32 sums of
// attention.cu's row_dots_kernel, in its order. From the same read, an F32 grad_out (G float)
// rounded to bf16 into g_bf16 (laid out as grad_out), the operand both backward kernels stage:
// rounded once here rather than on each of the dk/dv kernel's passes over it. A BF16 grad_out (G
// its bits: a bf16 product's input gradient) is that operand already: g_bf16 is not written.
template <int kD, typename O, typename G = float>
__global__ void attention_delta_kernel(const G* __restrict__ g, const O* __restrict__ o,
                                       float* __restrict__ delta,
                                       std::uint16_t* __restrict__ g_bf16, std::int64_t problems,
                                       std::int64_t t, AttentionLayout layout) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warps = blockDim.x >> 5;
  for (std::int64_t r = blockIdx.x * warps + (threadIdx.x >> 5); r < problems * t;
       r += static_cast<std::int64_t>(gridDim.x) * warps) {
    const std::int64_t at = first_row(layout, r / t, t, layout.out, kD) + (r % t) * layout.out;
    float acc = 0.0f;
    for (int c = lane; c < kD; c += 32) {
      acc = fmaf(as_f32(g[at + c]), as_f32(o[at + c]), acc);
      if constexpr (std::is_same_v<G, float>) g_bf16[at + c] = f32_to_bf16_bits(g[at + c]);
    }
    acc = static_cast<float>(warp_sum(acc));
    if (lane == 0) delta[r] = acc;
  }
}

// attention_delta_kernel with 16-byte accesses, where every row of grad_out, out and g_bf16 starts
// 16-byte aligned (the launcher checks): kD / 8 lanes a row, eight elements each, 32 / (kD / 8)
// rows a warp, each row's sum over its lanes by shuffles. Run 11's ncu (the shakespeare model):
// the warp-a-row kernel, each lane two scalar elements of a 64-wide row and a five-step sum, was
// 18% of the attention backward's kernel time for a tenth of its bytes. Run 12's op profile did
// not show the saving (the attention backward 5.97 -> 6.05 ms a step on GPT-2 small, 0.77 ->
// 0.76 on shakespeare, the products 1-2% slower on that call too): unconfirmed until an ncu run.
template <int kD>
constexpr int kDeltaLanes = kD / 8;  // lanes a row
template <int kD>
constexpr int kDeltaRowsPerBlock = kWarps*(32 / kDeltaLanes<kD>);

template <int kD, typename O, typename G = float>
__global__ void attention_delta_rows_kernel(const G* __restrict__ g, const O* __restrict__ o,
                                            float* __restrict__ delta,
                                            std::uint16_t* __restrict__ g_bf16,
                                            std::int64_t problems, std::int64_t t,
                                            AttentionLayout layout) {
  static_assert(kD % 8 == 0 && kD <= 256, "eight elements a lane, at most a warp a row");
  constexpr int kLanes = kDeltaLanes<kD>, kRows = 32 / kLanes;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int part = lane % kLanes;
  const std::int64_t warps = blockDim.x >> 5, total = problems * t;
  for (std::int64_t first = (blockIdx.x * warps + (threadIdx.x >> 5)) * kRows; first < total;
       first += static_cast<std::int64_t>(gridDim.x) * warps * kRows) {
    const std::int64_t r = first + lane / kLanes;
    float acc = 0.0f;
    if (r < total) {
      const std::int64_t at =
          first_row(layout, r / t, t, layout.out, kD) + (r % t) * layout.out + 8 * part;
      float gv[8], ov[8];
      load8(g + at, gv);
      load8(o + at, ov);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc = fmaf(gv[k], ov[k], acc);
      if constexpr (std::is_same_v<G, float>) store8(g_bf16 + at, gv);
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset >>= 1)
      acc += __shfl_xor_sync(kFullMask, acc, offset);
    if (part == 0 && r < total) delta[r] = acc;
  }
}

}  // namespace

}  // namespace hpm::cuda
