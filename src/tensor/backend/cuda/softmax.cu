// Softmax, log-softmax, their backward passes and the fused cross-entropy of logits, along any
// dimension: softmax.cpp's formulas and special cases (an all -inf row gives zeros, or -inf for
// log-softmax; a row's sums in double).
//
// A tensor is seen as (outer, len, inner) around the softmax dimension. When inner == 1 (the last
// dimension, the common case) the len elements of a row are contiguous, and a team of threads
// shares each row: a warp when the row is short (<= 1024: at most 32 elements a lane), else a
// whole block. When inner > 1, one thread per (outer, inner) column walks the len elements
// inner apart: neighbouring threads read neighbouring columns, so the reads coalesce. Every
// reduction has a fixed shape (strided per-thread partials, then a butterfly), so results do not
// vary run to run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tensor/backend/cuda/deferred_checks.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

constexpr int kBlock = 256;                 // threads of a block
constexpr std::int64_t kWarpRowMax = 1024;  // longest row a warp takes alone

struct Axis {
  std::int64_t outer, len, inner;
};

Axis split_axis(const Shape& s, int dim) {
  const int d = s.wrap(dim);  // std::out_of_range for a bad dim, as the CPU's
  return {s.numel_before(d), s[d], s.numel_from(d + 1)};
}

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
};

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
    if (mx == kNegInf) {
      // Every entry masked: zeros (log: -inf), not NaN, so a padded row contributes nothing.
      for (std::int64_t l = team.rank; l < len; l += team.size) yr[l] = kLog ? kNegInf : 0.0f;
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
    if (mx == kNegInf) {
      for (std::int64_t l = 0; l < len; ++l) yr[l * inner] = kLog ? kNegInf : 0.0f;
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

template <bool kLog>
Tensor softmax_impl(const Tensor& x, int dim) {
  const Axis a = split_axis(x.shape(), dim);
  require_dtype(x, DType::F32);
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  if (x.numel() == 0) return y;
  const float* px = ptr<float>(x);
  float* py = ptr<float>(y);
  cudaStream_t stream = current_stream();
  if (a.inner != 1) {
    softmax_columns_kernel<kLog><<<blocks_for(a.outer * a.inner, kBlock), kBlock, 0, stream>>>(
        px, py, a.outer, a.len, a.inner);
    HPM_CUDA_LAUNCH_CHECK("softmax_columns_kernel");
  } else if (a.len <= kWarpRowMax) {
    softmax_rows_kernel<kLog, true>
        <<<grid_for((a.outer + kBlock / 32 - 1) / (kBlock / 32)), kBlock, 0, stream>>>(
            px, py, a.outer, a.len);
    HPM_CUDA_LAUNCH_CHECK("softmax_rows_kernel (warp)");
  } else {
    softmax_rows_kernel<kLog, false>
        <<<grid_for(a.outer), kBlock, 0, stream>>>(px, py, a.outer, a.len);
    HPM_CUDA_LAUNCH_CHECK("softmax_rows_kernel (block)");
  }
  return y;
}

template <bool kLog>
Tensor softmax_backward_impl(const Tensor& grad_y, const Tensor& y, int dim) {
  const Axis a = split_axis(y.shape(), dim);
  require_dtype(grad_y, DType::F32);
  require_dtype(y, DType::F32);
  // The CPU reads grad_y as y's shape; here a mismatch is an error rather than a stray read.
  check_shape(grad_y, y.shape(),
              kLog ? "log_softmax_backward: grad_y" : "softmax_backward: grad_y");
  Tensor gx = Tensor::empty(y.shape(), DType::F32);
  if (y.numel() == 0) return gx;
  const float* pg = ptr<float>(grad_y);
  const float* py = ptr<float>(y);
  float* px = ptr<float>(gx);
  cudaStream_t stream = current_stream();
  if (a.inner != 1) {
    softmax_backward_columns_kernel<kLog>
        <<<blocks_for(a.outer * a.inner, kBlock), kBlock, 0, stream>>>(pg, py, px, a.outer, a.len,
                                                                       a.inner);
    HPM_CUDA_LAUNCH_CHECK("softmax_backward_columns_kernel");
  } else if (a.len <= kWarpRowMax) {
    softmax_backward_rows_kernel<kLog, true>
        <<<grid_for((a.outer + kBlock / 32 - 1) / (kBlock / 32)), kBlock, 0, stream>>>(
            pg, py, px, a.outer, a.len);
    HPM_CUDA_LAUNCH_CHECK("softmax_backward_rows_kernel (warp)");
  } else {
    softmax_backward_rows_kernel<kLog, false>
        <<<grid_for(a.outer), kBlock, 0, stream>>>(pg, py, px, a.outer, a.len);
    HPM_CUDA_LAUNCH_CHECK("softmax_backward_rows_kernel (block)");
  }
  return gx;
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

// Per row of `c` logits: its max and 1 / sum(exp(x - max)) into stats (the backward recomputes
// softmax from them), and the row's loss term (0 for an ignored row)
//   (1 - eps) * (lse - x[label]) + eps * mean_c(lse - x[c])
// in double, as the CPU's. A label neither ignore_index nor in [0, c) records its row in
// *error (the smallest such row wins: atomicMin's result does not depend on the order) and
// is not read through. In: float, or std::uint16_t for bf16 logits (widened as read).
// With `predicted`, each row's argmax_last too, from the same reads: the largest argmax_key.
template <bool kWarp, typename In>
__global__ void cross_entropy_rows_kernel(const In* __restrict__ logits,
                                          const std::int64_t* __restrict__ labels,
                                          float* __restrict__ stats, double* __restrict__ row_loss,
                                          unsigned long long* __restrict__ error, std::int64_t rows,
                                          std::int64_t c, double smoothing,
                                          std::int64_t ignore_index,
                                          std::int64_t* __restrict__ predicted) {
  const Team<kWarp> team;
  for (std::int64_t row = team.first_row; row < rows; row += team.row_stride) {
    const In* xr = logits + row * c;
    float mx = kNegInf;
    unsigned long long best = 0;
    for (std::int64_t j = team.rank; j < c; j += team.size) {
      const float v = as_f32(xr[j]);
      mx = fmaxf(mx, v);
      if (predicted != nullptr) best = MaxKeyOp{}(best, argmax_key(v, j));
    }
    mx = team.reduce(mx, MaxOp{}, kNegInf);
    if (predicted != nullptr) best = team.reduce(best, MaxKeyOp{}, 0ull);
    double sum = 0.0;
    for (std::int64_t j = team.rank; j < c; j += team.size) sum += expf(as_f32(xr[j]) - mx);
    sum = team.reduce(sum, SumOp{}, 0.0);
    const double lse = mx + log(sum);
    const auto inv = static_cast<float>(1.0 / sum);
    double nll_sum = 0.0;
    for (std::int64_t j = team.rank; j < c; j += team.size) nll_sum += lse - as_f32(xr[j]);
    nll_sum = team.reduce(nll_sum, SumOp{}, 0.0);
    if (team.rank != 0) continue;
    stats[2 * row] = mx;
    stats[2 * row + 1] = inv;
    if (predicted != nullptr) predicted[row] = c == 0 ? 0 : argmax_of_key(best, as_f32(xr[0]));
    const std::int64_t y = labels[row];
    double loss = 0.0;
    if (y != ignore_index) {
      if (y < 0 || y >= c) {
        atomicMin(error, static_cast<unsigned long long>(row));
      } else {
        const double nll = lse - as_f32(xr[y]);
        // Without smoothing the mean term is left out, not multiplied by 0: a -inf logit (a
        // masked class) makes it infinite, and 0 * inf would be NaN (the CPU's rule).
        loss = smoothing != 0.0
                   ? (1.0 - smoothing) * nll + smoothing * nll_sum / static_cast<double>(c)
                   : nll;
      }
    }
    row_loss[row] = loss;
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

// softmax.cpp's check_labels, on the host: shapes and dtype (the range is checked on the device).
std::int64_t check_labels(const Tensor& logits, const Tensor& labels) {
  bool ok = logits.dim() >= 2 && labels.dim() == logits.dim() - 1 && labels.dtype() == DType::I64 &&
            (logits.dtype() == DType::F32 || logits.dtype() == DType::BF16);
  for (int i = 0; ok && i < labels.dim(); ++i) ok = labels.size(i) == logits.size(i);
  if (!ok) {
    throw std::invalid_argument(
        "cross_entropy: expected F32 or BF16 logits (..., C) and I64 labels (...) with the same "
        "leading dimensions, got " +
        logits.shape().str() + " " + dtype_name(logits.dtype()) + " and " + labels.shape().str() +
        " " + dtype_name(labels.dtype()));
  }
  return labels.numel();
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
  for (std::int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const std::int64_t y = labels[row];
    const float max = stats[2 * row], inv_sum = stats[2 * row + 1];
    const In* lr = logits + row * c;
    Out* gr = gx + row * c;
    for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      float v = 0.0f;
      if (y != ignore_index) {
        // softmax as the forward's row had it, rounded before the subtraction (no FMA), as the
        // CPU's.
        const float p = __fmul_rn(expf(as_f32(lr[j]) - max), inv_sum);
        v = (p - smooth) * scale;
        if (j == y) v -= (1.0f - smoothing) * scale;
      }
      if constexpr (std::is_same_v<Out, float>) {
        gr[j] = v;
      } else {
        gr[j] = f32_to_bf16_bits(v);
      }
    }
  }
}

// The threads of a row's block: C rounded up to a warp, at most 256.
unsigned row_threads(std::int64_t c) {
  return static_cast<unsigned>(std::min<std::int64_t>(256, (c + 31) / 32 * 32));
}

}  // namespace

Tensor softmax(const Tensor& x, int dim) { return softmax_impl<false>(x, dim); }
Tensor log_softmax(const Tensor& x, int dim) { return softmax_impl<true>(x, dim); }
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) {
  return softmax_backward_impl<false>(grad_y, y, dim);
}
Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) {
  return softmax_backward_impl<true>(grad_y, y, dim);
}

Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                             Tensor& stats, std::int64_t ignore_index, Tensor* predicted) {
  const std::int64_t n = check_labels(logits, labels), c = logits.size(-1);
  stats = Tensor::empty(Shape{n, 2}, DType::F32);
  std::int64_t* pp = nullptr;
  if (predicted != nullptr) {
    if (c > std::int64_t{0xffffffff}) {  // argmax_key's index field
      throw std::invalid_argument("cross_entropy: " + std::to_string(c) +
                                  " classes are too many to predict in the same pass");
    }
    *predicted = Tensor::empty(labels.shape(), DType::I64);
    pp = ptr<std::int64_t>(*predicted);
  }
  Tensor loss = Tensor::empty(Shape{}, DType::F32);
  cudaStream_t stream = current_stream();
  if (n == 0) {
    // No rows: the mean kernel's 0 / 0 is NaN, as the CPU's.
    cross_entropy_mean_kernel<<<1, 1024, 0, stream>>>(nullptr, nullptr, 0, ignore_index,
                                                      ptr<float>(loss));
    HPM_CUDA_LAUNCH_CHECK("cross_entropy_mean_kernel");
    return loss;
  }
  Tensor row_loss = Tensor::empty({n}, DType::F64);
  unsigned long long* perr =
      defer_index_check(current_context(), labels, [c](std::int64_t row, std::int64_t label) {
        return "cross_entropy: label " + std::to_string(label) + " at row " + std::to_string(row) +
               " is not a class index in [0, " + std::to_string(c) + ")";
      });
  const auto* py = ptr<std::int64_t>(labels);
  const auto rows = [&](const auto* px) {
    if (c <= kWarpRowMax) {
      cross_entropy_rows_kernel<true>
          <<<grid_for((n + kBlock / 32 - 1) / (kBlock / 32)), kBlock, 0, stream>>>(
              px, py, ptr<float>(stats), ptr<double>(row_loss), perr, n, c, label_smoothing,
              ignore_index, pp);
      HPM_CUDA_LAUNCH_CHECK("cross_entropy_rows_kernel (warp)");
    } else {
      cross_entropy_rows_kernel<false>
          <<<grid_for(n), kBlock, 0, stream>>>(px, py, ptr<float>(stats), ptr<double>(row_loss),
                                               perr, n, c, label_smoothing, ignore_index, pp);
      HPM_CUDA_LAUNCH_CHECK("cross_entropy_rows_kernel (block)");
    }
  };
  if (logits.dtype() == DType::BF16) {
    rows(ptr<std::uint16_t>(logits));
  } else {
    rows(ptr<float>(logits));
  }
  cross_entropy_mean_kernel<<<1, 1024, 0, stream>>>(ptr<double>(row_loss), py, n, ignore_index,
                                                    ptr<float>(loss));
  HPM_CUDA_LAUNCH_CHECK("cross_entropy_mean_kernel");
  // A bad label is reported at the host's next read from the device (deferred_checks.h).
  return loss;
}

namespace {

// cross_entropy_backward's checks and launches into gx (F32, or BF16 bits when Out is
// std::uint16_t).
template <typename Out>
void run_cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                                float label_smoothing, const Tensor& grad,
                                std::int64_t ignore_index, Tensor& gx) {
  const std::int64_t n = labels.numel(), c = logits.size(-1);
  if (n == 0 || c == 0) return;
  cudaStream_t stream = current_stream();
  Tensor count = Tensor::empty({1}, DType::F32);
  const auto* py = ptr<std::int64_t>(labels);
  count_labels_kernel<<<1, 1024, 0, stream>>>(py, n, ignore_index, ptr<float>(count));
  HPM_CUDA_LAUNCH_CHECK("count_labels_kernel");
  const auto launch = [&](const auto* px) {
    cross_entropy_backward_kernel<<<grid_for(n), row_threads(c), 0, stream>>>(
        px, ptr<float>(stats), py, ptr<float>(grad), ptr<float>(count), ptr<Out>(gx), n, c,
        label_smoothing, ignore_index);
    HPM_CUDA_LAUNCH_CHECK("cross_entropy_backward_kernel");
  };
  if (logits.dtype() == DType::BF16) {
    launch(ptr<std::uint16_t>(logits));
  } else {
    launch(ptr<float>(logits));
  }
}

void check_backward_operands(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                             const Tensor& grad, const char* op) {
  if (logits.dtype() != DType::BF16) require_dtype(logits, DType::F32);
  require_dtype(stats, DType::F32);
  require_dtype(labels, DType::I64);
  if (grad.numel() != 1 || grad.dtype() != DType::F32) {
    throw std::invalid_argument(std::string(op) + ": expected a one-element F32 grad, got " +
                                grad.shape().str() + " " + dtype_name(grad.dtype()));
  }
}

}  // namespace

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                              float label_smoothing, const Tensor& grad, std::int64_t ignore_index,
                              bool overwrite_logits) {
  check_backward_operands(logits, stats, labels, grad, "cross_entropy_backward");
  Tensor gx = overwrite_logits && logits.dtype() == DType::F32
                  ? logits
                  : Tensor::empty(logits.shape(), DType::F32);
  run_cross_entropy_backward<float>(logits, stats, labels, label_smoothing, grad, ignore_index, gx);
  return gx;
}

Tensor cross_entropy_backward_bf16(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                                   float label_smoothing, const Tensor& grad,
                                   std::int64_t ignore_index, bool overwrite_logits) {
  check_backward_operands(logits, stats, labels, grad, "cross_entropy_backward_bf16");
  Tensor gx = overwrite_logits && logits.dtype() == DType::BF16
                  ? logits
                  : Tensor::empty(logits.shape(), DType::BF16);
  run_cross_entropy_backward<std::uint16_t>(logits, stats, labels, label_smoothing, grad,
                                            ignore_index, gx);
  return gx;
}

}  // namespace hpm::cuda
