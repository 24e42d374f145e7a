// The kernels of norm.cu (its opening comment tells their shapes and sums), apart from the
// launchers so that tests/cuda_emulated can compile them for the CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/row_team.cuh"
#include "tensor/backend/cuda/span_sums_kernels.cuh"

namespace hpm::cuda {

namespace {

constexpr int kBlock = 256;
constexpr std::int64_t kWarpRowMax = 1024;
// layer_norm_forward_rows_kernel's blocks: its warps share nothing, and at 96 registers a lane
// (GPT-2's 768 wide) blocks of 4 warps fill an SM with 20 where blocks of 8 left 16.
constexpr int kForwardRowsBlock = 128;
constexpr std::int64_t kSpanRows = 64;     // rows one slot of the column sums covers (at least)
constexpr std::int64_t kMaxSpans = 65535;  // gridDim.y's limit

// The rows of one span of layer_norm_backward_rows_kernel (a block's; its slot of the column
// sums): about 512 spans (8 to 64 rows each: GPT-2 small's 16384 rows in 512 blocks of 32), so
// that a mid-sized batch still fills the card; more when there are more than kMaxSpans * 64 rows.
inline std::int64_t layer_norm_span_rows(std::int64_t rows) {
  const std::int64_t even = (rows + 511) / 512;
  const std::int64_t fill = even < 8 ? 8 : (even > 64 ? 64 : even);
  const std::int64_t least = (rows + kMaxSpans - 1) / kMaxSpans;
  return fill > least ? fill : least;
}

// The warp rows' register slots a lane (the *_rows_kernels below): the fewest of 4, 8, 12, 16,
// 24 and 32 that hold a row of n <= kWarpRowMax (12: 384 wide, 24: 768), and whether the row
// fills them (then every slot's address is the lane's plus a constant: no address registers, no
// masks), as compile-time constants to f(slots, full).
template <int kSlots, typename F>
void with_fill(std::int64_t n, F&& f) {
  if (n == 32 * kSlots) {
    f(std::integral_constant<int, kSlots>{}, std::true_type{});
  } else {
    f(std::integral_constant<int, kSlots>{}, std::false_type{});
  }
}
template <typename F>
void with_row_slots(std::int64_t n, F&& f) {
  if (n <= 128) {
    with_fill<4>(n, f);
  } else if (n <= 256) {
    with_fill<8>(n, f);
  } else if (n <= 384) {
    with_fill<12>(n, f);
  } else if (n <= 512) {
    with_fill<16>(n, f);
  } else if (n <= 768) {
    with_fill<24>(n, f);
  } else {
    with_fill<32>(n, f);
  }
}

// y = (x - mean) * rstd * w + b per row (w, b optional); mean and rstd saved for the backward.
// Out is float, or std::uint16_t for y rounded to bf16 (then xb, when given, gets x rounded too).
// With x2 (bf16 only), the row normalized is x + x2, written into `sum` by the last pass (the
// earlier passes add again: re-reads of a row one team holds, from cache).
template <bool kWarp, typename Out>
__global__ void layer_norm_forward_kernel(const float* __restrict__ x, const float* __restrict__ x2,
                                          float* __restrict__ sum, const float* __restrict__ w,
                                          const float* __restrict__ b, Out* __restrict__ y,
                                          std::uint16_t* __restrict__ xb, float* __restrict__ mean,
                                          float* __restrict__ rstd, std::int64_t rows,
                                          std::int64_t n, float eps) {
  const Team<kWarp> team;
  const double inv_n = 1.0 / static_cast<double>(n);
  for (std::int64_t r = team.first_row; r < rows; r += team.row_stride) {
    const float* xr = x + r * n;
    const float* x2r = x2 != nullptr ? x2 + r * n : nullptr;
    const auto value = [&](std::int64_t k) { return x2r != nullptr ? xr[k] + x2r[k] : xr[k]; };
    Out* yr = y + r * n;
    double s = 0.0;
    for (std::int64_t k = team.rank; k < n; k += team.size) s += value(k);
    const double mu = team.sum(s) * inv_n;
    double ss = 0.0;
    for (std::int64_t k = team.rank; k < n; k += team.size) ss += (value(k) - mu) * (value(k) - mu);
    ss = team.sum(ss);
    const auto m = static_cast<float>(mu);
    const auto rs = static_cast<float>(1.0 / sqrt(ss * inv_n + eps));
    if (team.rank == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    for (std::int64_t k = team.rank; k < n; k += team.size) {
      const float u = value(k);
      const float v = (u - m) * rs * (w ? w[k] : 1.0f) + (b ? b[k] : 0.0f);
      if constexpr (std::is_same_v<Out, float>) {
        yr[k] = v;
      } else {
        yr[k] = f32_to_bf16_bits(v);
        if (xb != nullptr) xb[r * n + k] = f32_to_bf16_bits(u);
        if (sum != nullptr) sum[r * n + k] = u;
      }
    }
  }
}

// A lane's slots of a warp row (the *_rows_kernels below): slot i's column, or column 0 for one
// past the row (read, then masked), and whether it is in the row; with kFull (the row fills the
// slots) every column is the lane's plus a constant and no slot is masked.
template <bool kFull>
struct RowSlots {
  int rank;
  std::int64_t n;
  __device__ int col(int i) const {
    const int k = rank + 32 * i;
    return kFull || k < n ? k : 0;
  }
  __device__ bool in_row(int i) const { return kFull || rank + 32 * i < n; }
  // Each slot's element of a per-column operand (w, b), or `absent` in every slot without one
  // (the operand's presence tested once, outside the unrolled loads).
  template <int kPer>
  __device__ void gather(const float* p, float absent, float (&v)[kPer]) const {
    if (p != nullptr) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) v[i] = p[col(i)];
    } else {
#pragma unroll
      for (int i = 0; i < kPer; ++i) v[i] = absent;
    }
  }
};

// layer_norm_forward_kernel's warp rows (n <= 32 * kPer), the row held in registers, kPer values a
// lane (columns lane, lane + 32, ...): one read of x (and x2) instead of three, every load of a
// row issued before the first is used. The loads are unconditional (a column past n reads column
// 0 and is masked after), and the operands' presence is tested outside the unrolled loops: run 7
// measured a first version, whose loads sat behind a branch each, at twice the three-pass
// kernel's time. The same sums in the same order as that kernel: the same results bit for bit.
// Run 9 measured the rows kernels 2% (GPT-2 small) and 5% (shakespeare) faster a step than the
// three-pass ones with the separate column partials; they are norm.cu's for rows of up to
// kWarpRowMax.
template <typename Out, int kPer, bool kFull>
__global__ void layer_norm_forward_rows_kernel(const float* __restrict__ x,
                                               const float* __restrict__ x2,
                                               float* __restrict__ sum, const float* __restrict__ w,
                                               const float* __restrict__ b, Out* __restrict__ y,
                                               std::uint16_t* __restrict__ xb,
                                               float* __restrict__ mean, float* __restrict__ rstd,
                                               std::int64_t rows, std::int64_t n, float eps) {
  const Team<true> team;
  const double inv_n = 1.0 / static_cast<double>(n);
  const RowSlots<kFull> slots{team.rank, n};
  for (std::int64_t r = team.first_row; r < rows; r += team.row_stride) {
    const float* xr = x + r * n;
    float u[kPer];
    if (x2 != nullptr) {
      const float* x2r = x2 + r * n;
#pragma unroll
      for (int i = 0; i < kPer; ++i) u[i] = xr[slots.col(i)] + x2r[slots.col(i)];
    } else {
#pragma unroll
      for (int i = 0; i < kPer; ++i) u[i] = xr[slots.col(i)];
    }
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (slots.in_row(i)) s += u[i];
    }
    const double mu = team.sum(s) * inv_n;
    double ss = 0.0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (slots.in_row(i)) ss += (u[i] - mu) * (u[i] - mu);
    }
    ss = team.sum(ss);
    const auto m = static_cast<float>(mu);
    const auto rs = static_cast<float>(1.0 / sqrt(ss * inv_n + eps));
    if (team.rank == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    // The weight and bias read here, after the sums, from cache (the same 2n floats for every
    // row): held from the row's loads on, they made 138 registers a lane at GPT-2's 768 wide,
    // which left an SM one block of 8 warps (run 12: 54% of the bandwidth); now 96.
    float wv[kPer], bv[kPer];
    slots.gather(w, 1.0f, wv);
    slots.gather(b, 0.0f, bv);
    Out* yr = y + r * n;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (!slots.in_row(i)) continue;
      const int k = team.rank + 32 * i;
      const float v = (u[i] - m) * rs * wv[i] + bv[i];
      if constexpr (std::is_same_v<Out, float>) {
        yr[k] = v;
      } else {
        yr[k] = f32_to_bf16_bits(v);
        if (xb != nullptr) xb[r * n + k] = f32_to_bf16_bits(u[i]);
        if (sum != nullptr) sum[r * n + k] = u[i];
      }
    }
  }
}

// layer_norm_backward_kernel's warp rows with the row's xhat and g w held in registers, loaded as
// layer_norm_forward_rows_kernel loads (the same row sums in the same order), and stage 1 of the
// weight and bias gradients fused in: block b takes span b of layer_norm_span_rows rows (its
// warps rows r0 + warp, r0 + warp + 8, ...), each lane adds g xhat and g of its columns over its
// rows in f32, and the block adds its warps' sums in warp order, in double, into the span's slot
// of dw_part and db_part (null: no weight gradients). One read of g and x for dx, dw and db, where
// the three-pass kernels and the separate column partials read them three times. dx null: the
// weight gradients only. g F32 or BF16 (G float or its bits: a bf16 product's input gradient).
template <typename X, typename G, int kPer, bool kFull>
__global__ void layer_norm_backward_rows_kernel(
    const G* __restrict__ g, const X* __restrict__ x, const float* __restrict__ w,
    const float* __restrict__ mean, const float* __restrict__ rstd, float* __restrict__ dx,
    bool accumulate, std::uint16_t* __restrict__ dxb, double* __restrict__ dw_part,
    double* __restrict__ db_part, std::int64_t rows, std::int64_t n, std::int64_t span_rows) {
  __shared__ double span_w[kWarpRowMax], span_b[kWarpRowMax];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const double inv_n = 1.0 / static_cast<double>(n);
  const RowSlots<kFull> slots{lane, n};
  const std::int64_t spans = (rows + span_rows - 1) / span_rows;
  for (std::int64_t span = blockIdx.x; span < spans; span += gridDim.x) {
    const std::int64_t r0 = span * span_rows;
    const std::int64_t r1 = r0 + span_rows < rows ? r0 + span_rows : rows;
    float dw[kPer] = {}, db[kPer] = {};
    for (std::int64_t r = r0 + warp; r < r1; r += warps) {
      const G* gr = g + r * n;
      const X* xr = x + r * n;
      const float mu = mean[r], rs = rstd[r];
      float xhat[kPer], dxhat[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        xhat[i] = (as_f32(xr[slots.col(i)]) - mu) * rs;
        dxhat[i] = as_f32(gr[slots.col(i)]);
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {  // a slot past the row adds column 0's, never written
        dw[i] += dxhat[i] * xhat[i];
        db[i] += dxhat[i];
      }
      if (dx == nullptr) continue;
      if (w != nullptr) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) dxhat[i] *= w[slots.col(i)];
      }
      double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (!slots.in_row(i)) continue;
        sum_dxhat += dxhat[i];
        sum_dxhat_xhat += static_cast<double>(dxhat[i]) * xhat[i];
      }
      sum_dxhat = warp_reduce(sum_dxhat, SumOp{});
      sum_dxhat_xhat = warp_reduce(sum_dxhat_xhat, SumOp{});
      const auto a = static_cast<float>(sum_dxhat * inv_n);
      const auto c = static_cast<float>(sum_dxhat_xhat * inv_n);
      float* dr = dx + r * n;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (!slots.in_row(i)) continue;
        const int k = lane + 32 * i;
        const float d = rs * (dxhat[i] - a - xhat[i] * c);
        // __fadd_rn: never contracted with the product above (layer_norm_backward_kernel's).
        const float v = accumulate ? __fadd_rn(dr[k], d) : d;
        dr[k] = v;
        if (dxb != nullptr) dxb[r * n + k] = f32_to_bf16_bits(v);
      }
    }
    if (dw_part == nullptr) continue;  // the same for every thread of the block
    for (int v = 0; v < warps; ++v) {
      if (warp == v) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          if (!slots.in_row(i)) continue;
          const int k = lane + 32 * i;
          span_w[k] = (v == 0 ? 0.0 : span_w[k]) + static_cast<double>(dw[i]);
          span_b[k] = (v == 0 ? 0.0 : span_b[k]) + static_cast<double>(db[i]);
        }
      }
      __syncthreads();
    }
    for (std::int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      dw_part[span * n + k] = span_w[k];
      db_part[span * n + k] = span_b[k];
    }
    __syncthreads();  // the next span rewrites span_w and span_b
  }
}

// dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)) per row, written or (accumulate) added
// into dx, and (dxb given) the result rounded to bf16 into dxb; x and g F32 or BF16 (X and G float
// or its bits), as in the column sums below.
template <bool kWarp, typename X, typename G>
__global__ void layer_norm_backward_kernel(const G* __restrict__ g, const X* __restrict__ x,
                                           const float* __restrict__ w,
                                           const float* __restrict__ mean,
                                           const float* __restrict__ rstd, float* __restrict__ dx,
                                           bool accumulate, std::uint16_t* __restrict__ dxb,
                                           std::int64_t rows, std::int64_t n) {
  const Team<kWarp> team;
  const double inv_n = 1.0 / static_cast<double>(n);
  for (std::int64_t r = team.first_row; r < rows; r += team.row_stride) {
    const G* gr = g + r * n;
    const X* xr = x + r * n;
    const float mu = mean[r], rs = rstd[r];
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    for (std::int64_t k = team.rank; k < n; k += team.size) {
      const float xhat = (as_f32(xr[k]) - mu) * rs;
      const float dxhat = as_f32(gr[k]) * (w ? w[k] : 1.0f);
      sum_dxhat += dxhat;
      sum_dxhat_xhat += static_cast<double>(dxhat) * xhat;
    }
    sum_dxhat = team.sum(sum_dxhat);
    sum_dxhat_xhat = team.sum(sum_dxhat_xhat);
    const auto a = static_cast<float>(sum_dxhat * inv_n);
    const auto c = static_cast<float>(sum_dxhat_xhat * inv_n);
    float* dr = dx + r * n;
    for (std::int64_t k = team.rank; k < n; k += team.size) {
      const float xhat = (as_f32(xr[k]) - mu) * rs;
      const float d = rs * (as_f32(gr[k]) * (w ? w[k] : 1.0f) - a - xhat * c);
      // __fadd_rn: never contracted with the product above, so the sum is the one a separate
      // addition of dx would make (the CPU's, within its own rounding of d).
      const float v = accumulate ? __fadd_rn(dr[k], d) : d;
      dr[k] = v;
      if (dxb != nullptr) dxb[r * n + k] = f32_to_bf16_bits(v);
    }
  }
}

// Stage 1 of dw = sum_r g xhat and db = sum_r g: block (x, span) sums rows
// [span * span_rows, ...) of columns x * blockDim.x + threadIdx.x into its slot.
template <typename X, typename G>
__global__ void layer_norm_column_partials_kernel(const G* __restrict__ g, const X* __restrict__ x,
                                                  const float* __restrict__ mean,
                                                  const float* __restrict__ rstd,
                                                  double* __restrict__ dw_part,
                                                  double* __restrict__ db_part, std::int64_t rows,
                                                  std::int64_t n, std::int64_t span_rows) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const std::int64_t span = blockIdx.y;
  const std::int64_t r0 = span * span_rows, r1 = r0 + span_rows < rows ? r0 + span_rows : rows;
  double dw = 0.0, db = 0.0;
  for (std::int64_t r = r0; r < r1; ++r) {
    const float gv = as_f32(g[r * n + k]);
    const float xhat = (as_f32(x[r * n + k]) - mean[r]) * rstd[r];
    dw += static_cast<double>(gv) * xhat;
    db += gv;
  }
  dw_part[span * n + k] = dw;
  db_part[span * n + k] = db;
}

// Stage 2: span_sums_kernel (span_sums_kernels.cuh), dw_part into dw and db_part into db.

}  // namespace

}  // namespace hpm::cuda
