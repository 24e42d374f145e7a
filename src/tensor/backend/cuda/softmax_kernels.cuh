// The kernels of softmax.cu (its opening comment tells their shapes), apart from the launchers
// so that tests/cuda_emulated can compile them for the CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/row_team.cuh"

namespace hpm::cuda {

namespace {

constexpr int kBlock = 256;                 // threads of a block
constexpr std::int64_t kWarpRowMax = 1024;  // longest row a warp takes alone
constexpr int kFusedRowThreads = 512;       // cross_entropy_with_gradient_kernel's block rows

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- softmax / log-softmax ---------------------------------------------------------------------

// Rows of `len` contiguous elements.
template <bool kLog, bool kWarp>
__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y,
                                    std::int64_t rows, std::int64_t len) {
  const Team<kWarp> team;
  // The loop bound is uniform across a team, so block reductions inside it are safe.
  for (std::int64_t row = team.first_row; row < rows; row += team.row_stride) {
    const float* xr = x + row * len;
    float* yr = y + row * len;
    float mx = kNegInf;
    for (std::int64_t l = team.rank; l < len; l += team.size) mx = fmaxf(mx, xr[l]);
    mx = team.reduce(mx, MaxOp{}, kNegInf);
    if (mx == kNegInf) {  // uniform across the team: the reduction below is safe
      // Every entry masked: zeros (log: -inf), not NaN, so a padded row contributes nothing.
      // Unless an entry is NaN (fmaxf passes over it): then NaN, as the CPU's and torch's.
      float nan = 0.0f;
      for (std::int64_t l = team.rank; l < len; l += team.size) nan = isnan(xr[l]) ? 1.0f : nan;
      nan = team.reduce(nan, MaxOp{}, 0.0f);
      const float masked = nan != 0.0f ? __int_as_float(0x7fc00000) : kLog ? kNegInf : 0.0f;
      for (std::int64_t l = team.rank; l < len; l += team.size) yr[l] = masked;
      continue;
    }
    double sum = 0.0;
    for (std::int64_t l = team.rank; l < len; l += team.size) sum += expf(xr[l] - mx);
    sum = team.reduce(sum, SumOp{}, 0.0);
    if constexpr (kLog) {
      const float lse = mx + static_cast<float>(log(sum));
      for (std::int64_t l = team.rank; l < len; l += team.size) yr[l] = xr[l] - lse;
    } else {
      const auto inv = static_cast<float>(1.0 / sum);
      for (std::int64_t l = team.rank; l < len; l += team.size) yr[l] = expf(xr[l] - mx) * inv;
    }
  }
}

// One thread per (outer, inner) column, its len elements `inner` apart.
template <bool kLog>
__global__ void softmax_columns_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       std::int64_t outer, std::int64_t len, std::int64_t inner) {
  const std::int64_t columns = outer * inner;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       c < columns; c += stride) {
    const std::int64_t base = (c / inner) * len * inner + c % inner;
    const float* xr = x + base;
    float* yr = y + base;
    float mx = kNegInf;
    for (std::int64_t l = 0; l < len; ++l) mx = fmaxf(mx, xr[l * inner]);
    if (mx == kNegInf) {  // every entry masked, or NaN (as the rows kernel)
      bool nan = false;
      for (std::int64_t l = 0; l < len; ++l) nan = nan || isnan(xr[l * inner]);
      const float masked = nan ? __int_as_float(0x7fc00000) : kLog ? kNegInf : 0.0f;
      for (std::int64_t l = 0; l < len; ++l) yr[l * inner] = masked;
      continue;
    }
    double sum = 0.0;
    for (std::int64_t l = 0; l < len; ++l) sum += expf(xr[l * inner] - mx);
    if constexpr (kLog) {
      const float lse = mx + static_cast<float>(log(sum));
      for (std::int64_t l = 0; l < len; ++l) yr[l * inner] = xr[l * inner] - lse;
    } else {
      const auto inv = static_cast<float>(1.0 / sum);
      for (std::int64_t l = 0; l < len; ++l) yr[l * inner] = expf(xr[l * inner] - mx) * inv;
    }
  }
}

// ---- backward: softmax dx = y * (g - sum(g * y)); log-softmax dx = g - exp(y) * sum(g)
// ------------

template <bool kLog>
__device__ double backward_term(float g, float y) {
  return kLog ? static_cast<double>(g) : static_cast<double>(g) * y;
}
template <bool kLog>
__device__ float backward_value(float g, float y, float s) {
  return kLog ? g - expf(y) * s : y * (g - s);
}

template <bool kLog, bool kWarp>
__global__ void softmax_backward_rows_kernel(const float* __restrict__ g,
                                             const float* __restrict__ y, float* __restrict__ dx,
                                             std::int64_t rows, std::int64_t len) {
  const Team<kWarp> team;
  for (std::int64_t row = team.first_row; row < rows; row += team.row_stride) {
    const std::int64_t base = row * len;
    double sum = 0.0;
    for (std::int64_t l = team.rank; l < len; l += team.size)
      sum += backward_term<kLog>(g[base + l], y[base + l]);
    const auto s = static_cast<float>(team.reduce(sum, SumOp{}, 0.0));
    for (std::int64_t l = team.rank; l < len; l += team.size)
      dx[base + l] = backward_value<kLog>(g[base + l], y[base + l], s);
  }
}

template <bool kLog>
__global__ void softmax_backward_columns_kernel(const float* __restrict__ g,
                                                const float* __restrict__ y, float* __restrict__ dx,
                                                std::int64_t outer, std::int64_t len,
                                                std::int64_t inner) {
  const std::int64_t columns = outer * inner;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       c < columns; c += stride) {
    const std::int64_t base = (c / inner) * len * inner + c % inner;
    double sum = 0.0;
    for (std::int64_t l = 0; l < len; ++l)
      sum += backward_term<kLog>(g[base + l * inner], y[base + l * inner]);
    const auto s = static_cast<float>(sum);
    for (std::int64_t l = 0; l < len; ++l) {
      const std::int64_t k = base + l * inner;
      dx[k] = backward_value<kLog>(g[k], y[k], s);
    }
  }
}

// ---- cross-entropy
// -------------------------------------------------------------------------------

// argmax_last's choice (the first largest element, NaNs passed over, except that a NaN first
// element is the answer) as a maximum that reduces in any order: the value's order-preserving
// bits (-0 counted as +0, which compares equal to it) above the complement of its index (of two
// equal values, the first). A NaN has key 0, below every number's.
__device__ inline unsigned long long argmax_key(float v, std::int64_t j) {
  if (v != v) return 0;
  const std::uint32_t u = __float_as_uint(__fadd_rn(v, 0.0f));
  const std::uint32_t ordered = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) |
         (0xffffffffu - static_cast<std::uint32_t>(j));
}
__device__ inline std::int64_t argmax_of_key(unsigned long long best, float first) {
  if (first != first || best == 0) return 0;
  return static_cast<std::int64_t>(0xffffffffu - static_cast<std::uint32_t>(best & 0xffffffffu));
}

// One thread's share of a row's logits, read once (run 6 on the H100: three passes over GPT-2's
// 50,304-logit rows took 9% of its step): the running max m and sum of exp(x - m), rescaled when
// the max grows (online softmax), the first largest value and its index, and the logits' sum (for
// label smoothing). A -inf logit adds nothing here; the team's combination below makes a row
// without a finite max NaN, as the CPU's expf(-inf - -inf) does.
struct RowScan {
  float m = kNegInf, s = 0.0f, best = kNegInf;
  std::int64_t at = -1;
  double xsum = 0.0;
  bool any = false;
  __device__ void add(float v, std::int64_t j, bool predict, bool smooth) {
    any = true;
    if (v > m) {
      s = s * expf(m - v) + 1.0f;  // m = -inf: 0 * 0 + 1 (a NaN sum stays NaN)
      m = v;
    } else if (v != kNegInf) {
      s += expf(v - m);  // NaN for a NaN logit, and for +inf beside a +inf max: the CPU's NaN
    }
    if (predict && (v > best || (at < 0 && v == v))) {  // NaNs passed over, -0 no larger than +0
      best = v;
      at = j;
    }
    if (smooth) xsum += v;
  }
  // Eight logits j0.. at once, as add's one by one would leave the scan but for the rounding of s:
  // the max grows (and s is rescaled) once a group, and the eight exps are independent of each
  // other and of s (add's chain through s and its branch a logit held GPT-2 small's forward at
  // half the bandwidth: run 12, 1.11 ms a step over 1.6 GB of bf16 logits). A -inf logit adds
  // nothing; a NaN makes s NaN, as does a +inf, whose exp(+inf - +inf) is NaN as the CPU's.
  __device__ void add8(const float (&v)[8], std::int64_t j0, bool predict, bool smooth) {
    any = true;
    float gm = v[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) gm = fmaxf(gm, v[k]);  // NaNs passed over, unless all are
    if (gm > m) {
      s *= expf(m - gm);  // m = -inf: 0 (a NaN sum stays NaN)
      m = gm;
    }
    // While m is -inf so is every logit so far: shifted by 0 they add exp(-inf) = 0, where
    // -inf - -inf would be NaN. No test an element: the exps stay free of branches.
    const float shift = m == kNegInf ? 0.0f : m;
    float e[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) e[k] = expf(v[k] - shift);
    s += ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
    if (predict && (gm > best || (at < 0 && gm == gm))) {
      // The group's first largest: of equal values (-0 and +0 included) the first.
      int first = 0;
#pragma unroll
      for (int k = 7; k >= 0; --k) first = v[k] == gm ? k : first;  // registers, not a stack
      best = gm;
      at = j0 + first;
    }
    if (smooth) {
#pragma unroll
      for (int k = 0; k < 8; ++k) xsum += v[k];
    }
  }
};

// A row's figures, every thread of its team holding them: the max, sum(exp(x - max)) (NaN for a
// row without a finite max, as the CPU's), the largest argmax_key (predict) and the logits' sum
// (smooth).
struct RowFigures {
  float mx;
  double sum;
  unsigned long long best;
  double xsum;
};

// One pass over row xr of c logits by its team: each thread scans its share (eight logits a
// 16-byte access where vec, two such reads in flight, in pairs of groups), then the team combines
// them. In: float, or std::uint16_t for bf16 logits (widened as read).
template <bool kWarp, typename In>
__device__ RowFigures scan_row(const Team<kWarp>& team, const In* xr, std::int64_t c, bool vec,
                               bool predict, bool smooth) {
  RowScan scan;
  if (vec) {
    // A thread's groups of eight in pairs, both read before either is scanned: two 16-byte
    // reads in flight a thread, in the order one at a time would take them.
    const std::int64_t groups = c / 8;
    for (std::int64_t q = team.rank; q < groups; q += 2 * team.size) {
      const std::int64_t q2 = q + team.size;
      const bool second = q2 < groups;
      float v[2][8];
      load8(xr + 8 * q, v[0]);
      if (second) load8(xr + 8 * q2, v[1]);
      scan.add8(v[0], 8 * q, predict, smooth);
      if (second) scan.add8(v[1], 8 * q2, predict, smooth);
    }
  } else {
    for (std::int64_t j = team.rank; j < c; j += team.size)
      scan.add(as_f32(xr[j]), j, predict, smooth);
  }
  RowFigures f{};
  f.mx = team.reduce(scan.m, MaxOp{}, kNegInf);
  // Each thread's sum rescaled to the row's max: exp(-inf - -inf) = NaN for a row with no
  // finite max, as the CPU's; a thread given no logit adds 0 (no classes: lse -inf).
  f.sum = team.reduce(
      scan.any ? static_cast<double>(scan.s) * static_cast<double>(expf(scan.m - f.mx)) : 0.0,
      SumOp{}, 0.0);
  f.best = predict
               ? team.reduce(scan.at < 0 ? 0ull : argmax_key(scan.best, scan.at), MaxKeyOp{}, 0ull)
               : 0ull;
  f.xsum = smooth ? team.reduce(scan.xsum, SumOp{}, 0.0) : 0.0;
  return f;
}

// A row's loss term (0 for an ignored row), in double as the CPU's:
//   (1 - eps) * (lse - x[label]) + eps * (lse - mean_c(x))
// A label neither ignore_index nor in [0, c) records the row in *error (the smallest such row
// wins: atomicMin's result does not depend on the order) and adds 0. x_label: the label's logit.
__device__ inline double row_loss_term(const RowFigures& f, std::int64_t row, std::int64_t y,
                                       float x_label, std::int64_t c, double smoothing,
                                       std::int64_t ignore_index, unsigned long long* error) {
  if (y == ignore_index) return 0.0;
  if (y < 0 || y >= c) {
    atomicMin(error, static_cast<unsigned long long>(row));
    return 0.0;
  }
  const double lse = f.mx + log(f.sum);
  const double nll = lse - x_label;
  // Without smoothing the mean term is left out, not multiplied by 0: a -inf logit (a masked
  // class) makes it infinite, and 0 * inf would be NaN (the CPU's rule).
  return smoothing != 0.0
             ? (1.0 - smoothing) * nll + smoothing * (lse - f.xsum / static_cast<double>(c))
             : nll;
}

// Per row of `c` logits: its max and 1 / sum(exp(x - max)) into stats (the backward recomputes
// softmax from them), and the row's loss term (row_loss_term) into row_loss. With `predicted`,
// each row's argmax_last too, from the same reads: the largest argmax_key.
template <bool kWarp, typename In>
__global__ void cross_entropy_rows_kernel(const In* __restrict__ logits,
                                          const std::int64_t* __restrict__ labels,
                                          float* __restrict__ stats, double* __restrict__ row_loss,
                                          unsigned long long* __restrict__ error, std::int64_t rows,
                                          std::int64_t c, double smoothing,
                                          std::int64_t ignore_index,
                                          std::int64_t* __restrict__ predicted) {
  const Team<kWarp> team;
  const bool predict = predicted != nullptr, smooth = smoothing != 0.0;
  // Every row starts 16-byte aligned when the first does and a row is a multiple of 8 logits.
  const bool vec = c % 8 == 0 && aligned16(logits);
  for (std::int64_t row = team.first_row; row < rows; row += team.row_stride) {
    const In* xr = logits + row * c;
    const RowFigures f = scan_row(team, xr, c, vec, predict, smooth);
    if (team.rank != 0) continue;
    stats[2 * row] = f.mx;
    stats[2 * row + 1] = static_cast<float>(1.0 / f.sum);
    if (predict) predicted[row] = c == 0 ? 0 : argmax_of_key(f.best, as_f32(xr[0]));
    const std::int64_t y = labels[row];
    const bool valid = y != ignore_index && y >= 0 && y < c;
    row_loss[row] =
        row_loss_term(f, row, y, valid ? as_f32(xr[y]) : 0.0f, c, smoothing, ignore_index, error);
  }
}

// A row's d loss / d logits: (p - eps / C) * scale, less (1 - eps) * scale at the label y, 0 on
// an ignored row; p = softmax as the forward's row had it (its max and 1 / sum), rounded before
// the subtraction (no FMA), as the CPU's.
struct RowGradient {
  float mx, inv, share, eps, scale;
  std::int64_t y;
  bool counted;
  __device__ float at(float x, std::int64_t j) const {
    if (!counted) return 0.0f;
    const float p = __fmul_rn(expf(x - mx), inv);
    float v = (p - share) * scale;
    if (j == y) v -= (1.0f - eps) * scale;
    return v;
  }
};

// Writes row lr's gradient into gr (which may be lr: each element is read, then written, by one
// thread), the threads rank, rank + size, ... of a row's team; eight a 16-byte access where vec.
// In and Out float, or std::uint16_t for bf16 (widened as read, rounded as written).
template <typename In, typename Out>
__device__ void write_row_gradient(const In* lr, Out* gr, std::int64_t c, bool vec, int rank,
                                   int size, const RowGradient& rg) {
  if (vec) {
    for (std::int64_t j = 8 * static_cast<std::int64_t>(rank); j < c;
         j += 8 * static_cast<std::int64_t>(size)) {
      float v[8];
      load8(lr + j, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = rg.at(v[k], j + k);
      store8(gr + j, v);
    }
    return;
  }
  for (std::int64_t j = rank; j < c; j += size) {
    const float v = rg.at(as_f32(lr[j]), j);
    if constexpr (std::is_same_v<Out, float>) {
      gr[j] = v;
    } else {
      gr[j] = f32_to_bf16_bits(v);
    }
  }
}

// cross_entropy_rows_kernel's forward and cross_entropy_backward_kernel's gradient for an
// upstream gradient of 1 in one kernel, the gradient written over the logits (T float, or
// std::uint16_t for bf16 logits and gradient): a team reads its row once to scan it and again,
// meant to be from L2 (not yet measured on a card), to write it (run 12: the forward's and the
// backward's passes over GPT-2 small's 1.6 GB of bf16 logits took 2.3 ms a step, the backward's
// at 2.9 TB/s). `count` is the number of rows counted (count_labels_kernel); no stats are kept
// (nothing recomputes from them).
template <bool kWarp, typename T>
__global__ void __launch_bounds__(kFusedRowThreads, 2)
    cross_entropy_with_gradient_kernel(T* __restrict__ logits,
                                       const std::int64_t* __restrict__ labels,
                                       const float* __restrict__ count,
                                       double* __restrict__ row_loss,
                                       unsigned long long* __restrict__ error, std::int64_t rows,
                                       std::int64_t c, double smoothing, std::int64_t ignore_index,
                                       std::int64_t* __restrict__ predicted) {
  const Team<kWarp> team;
  const bool predict = predicted != nullptr, smooth = smoothing != 0.0;
  const bool vec = c % 8 == 0 && aligned16(logits);
  // cross_entropy_backward_kernel's factors for a gradient of 1: the same bits.
  const float scale = 1.0f / *count;
  const auto eps = static_cast<float>(smoothing);
  const float share = eps / static_cast<float>(c);
  for (std::int64_t row = team.first_row; row < rows; row += team.row_stride) {
    T* xr = logits + row * c;
    const std::int64_t y = labels[row];
    const bool counted = y != ignore_index, valid = counted && y >= 0 && y < c;
    // What rank 0 reads of other threads' logits, read before any of them is overwritten (the
    // scan's reductions, and the sync below for a warp's, order them before the writes).
    float x_label = 0.0f, x_first = 0.0f;
    if (team.rank == 0) {
      if (valid) x_label = as_f32(xr[y]);
      if (c > 0) x_first = as_f32(xr[0]);
    }
    const RowFigures f = scan_row(team, xr, c, vec, predict, smooth);
    team.sync();
    if (team.rank == 0) {
      if (predict) predicted[row] = c == 0 ? 0 : argmax_of_key(f.best, x_first);
      row_loss[row] = row_loss_term(f, row, y, x_label, c, smoothing, ignore_index, error);
    }
    write_row_gradient(
        xr, xr, c, vec, team.rank, team.size,
        RowGradient{f.mx, static_cast<float>(1.0 / f.sum), share, eps, scale, y, counted});
  }
}

// One block: the mean of the row terms over the rows not ignored (NaN when none is, as the CPU's
// 0/0), into the 0-d result. Strided partials, then the block's tree: a fixed order.
__global__ void cross_entropy_mean_kernel(const double* __restrict__ row_loss,
                                          const std::int64_t* __restrict__ labels,
                                          std::int64_t rows, std::int64_t ignore_index,
                                          float* __restrict__ loss) {
  double total = 0.0, counted = 0.0;
  for (std::int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    total += row_loss[i];
    counted += labels[i] != ignore_index ? 1.0 : 0.0;  // exact in double up to 2^53 rows
  }
  total = block_reduce(total, SumOp{}, 0.0);
  counted = block_reduce(counted, SumOp{}, 0.0);
  if (threadIdx.x == 0) *loss = static_cast<float>(total / counted);
}

// The number of labels that are not ignore_index, into *count (one block, integer sums).
__global__ void count_labels_kernel(const std::int64_t* __restrict__ labels, std::int64_t n,
                                    std::int64_t ignore_index, float* __restrict__ count) {
  double counted = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x)
    counted += labels[i] != ignore_index ? 1.0 : 0.0;
  counted = block_reduce(counted, SumOp{}, 0.0);
  // The CPU's static_cast<float>(counted) of its integer count.
  if (threadIdx.x == 0) *count = static_cast<float>(static_cast<std::int64_t>(counted));
}

// d loss / d logits = (p - eps / C) * scale, less (1 - eps) * scale at the label, with
// scale = grad / counted (grad the 0-d upstream gradient on the device); 0 on ignored rows.
// gx may be logits itself (overwrite_logits): each element is read, then written, by one thread.
// A block per row (rows strided over the grid), its threads across the row's C logits: the row's
// statistics and label read once, no division per element. In and Out are float, or
// std::uint16_t for bf16 logits (widened as read) and the gradient rounded to bf16 as it is
// written; gx may be logits when they are one type.
template <typename In, typename Out>
__global__ void cross_entropy_backward_kernel(const In* logits, const float* __restrict__ stats,
                                              const std::int64_t* __restrict__ labels,
                                              const float* __restrict__ grad,
                                              const float* __restrict__ count, Out* gx,
                                              std::int64_t n, std::int64_t c, float smoothing,
                                              std::int64_t ignore_index) {
  const float scale = *grad / *count;
  const float smooth = smoothing / static_cast<float>(c);
  // Eight logits a 16-byte access where every row starts aligned (as the forward's).
  const bool vec = c % 8 == 0 && aligned16(logits) && aligned16(gx);
  for (std::int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const std::int64_t y = labels[row];
    write_row_gradient(logits + row * c, gx + row * c, c, vec, static_cast<int>(threadIdx.x),
                       static_cast<int>(blockDim.x),
                       RowGradient{stats[2 * row], stats[2 * row + 1], smooth, smoothing, scale, y,
                                   y != ignore_index});
  }
}

// The threads of a row's block: C rounded up to a warp, at most 256.
unsigned row_threads(std::int64_t c) {
  return static_cast<unsigned>(std::min<std::int64_t>(256, (c + 31) / 32 * 32));
}

}  // namespace

}  // namespace hpm::cuda
