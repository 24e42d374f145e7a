// Layer norm over the trailing `normalized` elements of each row: norm.cpp's formulas (two passes,
// mean then the centred variance, summed in double; the backward's row sums in double too).
//
// A team of threads shares each row: a warp when the row is short (<= 1024 elements), else a
// block. The backward's weight and bias gradients are column sums over all rows; they run in two
// deterministic stages instead of atomics: each block column sums a fixed span of rows into its
// own slot, then one thread per column adds the slots in span order. The spans depend only on
// the shape, so the result is the same run to run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

constexpr int kBlock = 256;
constexpr std::int64_t kWarpRowMax = 1024;
constexpr std::int64_t kSpanRows = 64;     // rows one slot of the column sums covers (at least)
constexpr std::int64_t kMaxSpans = 65535;  // gridDim.y's limit

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
  __device__ double sum(double v) const {
    if constexpr (kWarp) {
      return warp_sum(v);
    } else {
      return block_sum(v);
    }
  }
};

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

// dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)) per row, written or (accumulate) added
// into dx; x F32 or BF16 (X float or its bits), as in the column sums below.
template <bool kWarp, typename X>
__global__ void layer_norm_backward_kernel(const float* __restrict__ g, const X* __restrict__ x,
                                           const float* __restrict__ w,
                                           const float* __restrict__ mean,
                                           const float* __restrict__ rstd, float* __restrict__ dx,
                                           bool accumulate, std::int64_t rows, std::int64_t n) {
  const Team<kWarp> team;
  const double inv_n = 1.0 / static_cast<double>(n);
  for (std::int64_t r = team.first_row; r < rows; r += team.row_stride) {
    const float* gr = g + r * n;
    const X* xr = x + r * n;
    const float mu = mean[r], rs = rstd[r];
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    for (std::int64_t k = team.rank; k < n; k += team.size) {
      const float xhat = (as_f32(xr[k]) - mu) * rs;
      const float dxhat = gr[k] * (w ? w[k] : 1.0f);
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
      const float d = rs * (gr[k] * (w ? w[k] : 1.0f) - a - xhat * c);
      // __fadd_rn: never contracted with the product above, so the sum is the one a separate
      // addition of dx would make (the CPU's, within its own rounding of d).
      dr[k] = accumulate ? __fadd_rn(dr[k], d) : d;
    }
  }
}

// Stage 1 of dw = sum_r g xhat and db = sum_r g: block (x, span) sums rows
// [span * span_rows, ...) of columns x * blockDim.x + threadIdx.x into its slot.
template <typename X>
__global__ void layer_norm_column_partials_kernel(
    const float* __restrict__ g, const X* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ rstd, double* __restrict__ dw_part, double* __restrict__ db_part,
    std::int64_t rows, std::int64_t n, std::int64_t span_rows) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const std::int64_t span = blockIdx.y;
  const std::int64_t r0 = span * span_rows, r1 = r0 + span_rows < rows ? r0 + span_rows : rows;
  double dw = 0.0, db = 0.0;
  for (std::int64_t r = r0; r < r1; ++r) {
    const float gv = g[r * n + k];
    const float xhat = (as_f32(x[r * n + k]) - mean[r]) * rstd[r];
    dw += static_cast<double>(gv) * xhat;
    db += gv;
  }
  dw_part[span * n + k] = dw;
  db_part[span * n + k] = db;
}

// Stage 2: each column's slots added in span order.
__global__ void layer_norm_column_sums_kernel(const double* __restrict__ dw_part,
                                              const double* __restrict__ db_part,
                                              float* __restrict__ dw, float* __restrict__ db,
                                              std::int64_t spans, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    double sw = 0.0, sb = 0.0;
    for (std::int64_t s = 0; s < spans; ++s) {
      sw += dw_part[s * n + k];
      sb += db_part[s * n + k];
    }
    if (dw != nullptr) dw[k] = static_cast<float>(sw);
    if (db != nullptr) db[k] = static_cast<float>(sb);
  }
}

// weight / bias: optional, F32 with one value per normalized element (the CPU reads them so
// without checking; here a wrong size is an error rather than a stray read).
const float* affine(const Tensor& t, std::int64_t normalized, const char* what) {
  if (!t.defined()) return nullptr;
  require_dtype(t, DType::F32);
  if (t.numel() != normalized) {
    throw std::invalid_argument(std::string("layer_norm: ") + what + " of " + t.shape().str() +
                                " for " + std::to_string(normalized) + " normalized elements");
  }
  return ptr<float>(t);
}

}  // namespace

namespace {

// layer_norm_forward's checks and launch, y of dtype Out's (F32 or BF16, then x_bf16 filled too
// when given); with x2 (BF16 only), of x + x2, written into *sum.
template <typename Out>
Tensor run_layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                              const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd,
                              Tensor* x_bf16, const Tensor& x2 = Tensor(), Tensor* sum = nullptr) {
  if (normalized <= 0 || x.numel() % normalized != 0) {
    throw std::invalid_argument("layer_norm: cannot normalize " + x.shape().str() + " over " +
                                std::to_string(normalized) + " trailing elements");
  }
  require_dtype(x, DType::F32);
  const float* pw = affine(weight, normalized, "weight");
  const float* pb = affine(bias, normalized, "bias");
  const std::int64_t rows = x.numel() / normalized;
  constexpr bool kBf16 = std::is_same_v<Out, std::uint16_t>;
  save_mean = Tensor::empty({rows}, DType::F32);
  save_rstd = Tensor::empty({rows}, DType::F32);
  Tensor y = Tensor::empty(x.shape(), kBf16 ? DType::BF16 : DType::F32);
  std::uint16_t* xb = nullptr;
  if (x_bf16 != nullptr) {
    *x_bf16 = Tensor::empty(x.shape(), DType::BF16);
    xb = ptr<std::uint16_t>(*x_bf16);
  }
  const float* px2 = nullptr;
  float* psum = nullptr;
  if (x2.defined()) {
    if (!kBf16) throw std::logic_error("layer_norm: a residual sum only in the bf16 forward");
    require_dtype(x2, DType::F32);
    check_shape(x2, x.shape(), "add_layer_norm_forward_bf16: b");
    *sum = Tensor::empty(x.shape(), DType::F32);
    px2 = ptr<float>(x2);
    psum = ptr<float>(*sum);
  }
  if (rows == 0) return y;
  cudaStream_t stream = current_stream();
  if (normalized <= kWarpRowMax) {
    layer_norm_forward_kernel<true, Out>
        <<<grid_for((rows + kBlock / 32 - 1) / (kBlock / 32)), kBlock, 0, stream>>>(
            ptr<float>(x), px2, psum, pw, pb, ptr<Out>(y), xb, ptr<float>(save_mean),
            ptr<float>(save_rstd), rows, normalized, eps);
    HPM_CUDA_LAUNCH_CHECK("layer_norm_forward_kernel (warp)");
  } else {
    layer_norm_forward_kernel<false, Out><<<grid_for(rows), kBlock, 0, stream>>>(
        ptr<float>(x), px2, psum, pw, pb, ptr<Out>(y), xb, ptr<float>(save_mean),
        ptr<float>(save_rstd), rows, normalized, eps);
    HPM_CUDA_LAUNCH_CHECK("layer_norm_forward_kernel (block)");
  }
  return y;
}

}  // namespace

Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                          const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd) {
  return run_layer_norm_forward<float>(x, normalized, weight, bias, eps, save_mean, save_rstd,
                                       nullptr);
}

Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                               const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd,
                               Tensor* x_bf16) {
  return run_layer_norm_forward<std::uint16_t>(x, normalized, weight, bias, eps, save_mean,
                                               save_rstd, x_bf16);
}

Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b, std::int64_t normalized,
                                   const Tensor& weight, const Tensor& bias, float eps, Tensor& sum,
                                   Tensor& save_mean, Tensor& save_rstd, Tensor* sum_bf16) {
  return run_layer_norm_forward<std::uint16_t>(a, normalized, weight, bias, eps, save_mean,
                                               save_rstd, sum_bf16, b, &sum);
}

namespace {

// layer_norm_backward's launches, x's elements X (float, or bf16 bits).
template <typename X>
void run_layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                             const float* pw, const Tensor& save_mean, const Tensor& save_rstd,
                             Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) {
  const std::int64_t rows = x.numel() / normalized;
  const float* pg = ptr<float>(grad_y);
  const X* px = ptr<X>(x);
  const float* pm = ptr<float>(save_mean);
  const float* pr = ptr<float>(save_rstd);
  cudaStream_t stream = current_stream();
  if (grad_x != nullptr) {
    const bool accumulate = grad_x->defined();
    if (!accumulate) *grad_x = Tensor::empty(x.shape(), DType::F32);
    if (rows > 0 && normalized <= kWarpRowMax) {
      layer_norm_backward_kernel<true, X>
          <<<grid_for((rows + kBlock / 32 - 1) / (kBlock / 32)), kBlock, 0, stream>>>(
              pg, px, pw, pm, pr, ptr<float>(*grad_x), accumulate, rows, normalized);
      HPM_CUDA_LAUNCH_CHECK("layer_norm_backward_kernel (warp)");
    } else if (rows > 0) {
      layer_norm_backward_kernel<false, X><<<grid_for(rows), kBlock, 0, stream>>>(
          pg, px, pw, pm, pr, ptr<float>(*grad_x), accumulate, rows, normalized);
      HPM_CUDA_LAUNCH_CHECK("layer_norm_backward_kernel (block)");
    }
  }
  if (grad_weight == nullptr && grad_bias == nullptr) return;
  float* pdw = nullptr;
  float* pdb = nullptr;
  if (grad_weight != nullptr) {
    *grad_weight = Tensor::empty({normalized}, DType::F32);
    pdw = ptr<float>(*grad_weight);
  }
  if (grad_bias != nullptr) {
    *grad_bias = Tensor::empty({normalized}, DType::F32);
    pdb = ptr<float>(*grad_bias);
  }
  // Spans of at least kSpanRows rows, few enough for gridDim.y; none when there are no rows (the
  // sums kernel then writes zeros).
  const std::int64_t span_rows = std::max(kSpanRows, (rows + kMaxSpans - 1) / kMaxSpans);
  const std::int64_t spans = (rows + span_rows - 1) / span_rows;
  Tensor dw_part = Tensor::empty({std::max<std::int64_t>(spans, 1) * normalized}, DType::F64);
  Tensor db_part = Tensor::empty({std::max<std::int64_t>(spans, 1) * normalized}, DType::F64);
  if (spans > 0) {
    const dim3 grid(static_cast<unsigned>((normalized + kBlock - 1) / kBlock),
                    static_cast<unsigned>(spans));
    layer_norm_column_partials_kernel<X><<<grid, kBlock, 0, stream>>>(
        pg, px, pm, pr, ptr<double>(dw_part), ptr<double>(db_part), rows, normalized, span_rows);
    HPM_CUDA_LAUNCH_CHECK("layer_norm_column_partials_kernel");
  }
  layer_norm_column_sums_kernel<<<blocks_for(normalized, kBlock), kBlock, 0, stream>>>(
      ptr<double>(dw_part), ptr<double>(db_part), pdw, pdb, spans, normalized);
  HPM_CUDA_LAUNCH_CHECK("layer_norm_column_sums_kernel");
}

}  // namespace

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                         const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) {
  if (normalized <= 0 || x.numel() % normalized != 0) {
    throw std::invalid_argument("layer_norm: cannot normalize " + x.shape().str() + " over " +
                                std::to_string(normalized) + " trailing elements");
  }
  const std::int64_t rows = x.numel() / normalized;
  require_dtype(grad_y, DType::F32);
  if (x.dtype() != DType::BF16) require_dtype(x, DType::F32);
  require_dtype(save_mean, DType::F32);
  require_dtype(save_rstd, DType::F32);
  if (grad_y.numel() != x.numel()) check_shape(grad_y, x.shape(), "layer_norm backward: grad_y");
  if (save_mean.numel() != rows || save_rstd.numel() != rows) {
    throw std::invalid_argument("layer_norm backward: saved statistics of " +
                                save_mean.shape().str() + " and " + save_rstd.shape().str() +
                                " for " + std::to_string(rows) + " rows");
  }
  const float* pw = affine(weight, normalized, "weight");
  if (x.dtype() == DType::BF16) {
    run_layer_norm_backward<std::uint16_t>(grad_y, x, normalized, pw, save_mean, save_rstd, grad_x,
                                           grad_weight, grad_bias);
  } else {
    run_layer_norm_backward<float>(grad_y, x, normalized, pw, save_mean, save_rstd, grad_x,
                                   grad_weight, grad_bias);
  }
}

}  // namespace hpm::cuda
