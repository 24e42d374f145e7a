// Layer norm over the trailing `normalized` elements of each row: norm.cpp's formulas (two passes,
// mean then the centred variance, summed in double; the backward's row sums in double too).
//
// A team of threads shares each row: a warp, the row held in its registers, when the row is short
// (<= 1024 elements), else a block. The backward's weight and bias gradients are column sums over
// all rows; they run in two deterministic stages instead of atomics: each block column sums a
// fixed span of rows into its own slot (for warp rows, in the same pass as dx), then a block per
// 32 columns adds the slots in an order fixed by the shape (span_sums_kernels.cuh), so the result
// is the same run to run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tensor/backend/cuda/basic_ops.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/norm_kernels.cuh"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

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
    with_row_slots(normalized, [&](auto slots, auto full) {
      constexpr std::int64_t kWarps = kForwardRowsBlock / 32;
      layer_norm_forward_rows_kernel<Out, decltype(slots)::value, decltype(full)::value>
          <<<grid_for((rows + kWarps - 1) / kWarps), kForwardRowsBlock, 0, stream>>>(
              ptr<float>(x), px2, psum, pw, pb, ptr<Out>(y), xb, ptr<float>(save_mean),
              ptr<float>(save_rstd), rows, normalized, eps);
    });
    HPM_CUDA_LAUNCH_CHECK("layer_norm_forward_rows_kernel");
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

// layer_norm_backward's launches, x's and grad_y's elements X and G (float, or bf16 bits): rows
// of up to kWarpRowMax by layer_norm_backward_rows_kernel, dx and the column partials in one
// pass; longer rows by a block a row, then the column partials' own kernel. Then the partials'
// sums.
template <typename X, typename G>
void run_layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                             const float* pw, const Tensor& save_mean, const Tensor& save_rstd,
                             Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                             Tensor* grad_x_bf16) {
  const std::int64_t rows = x.numel() / normalized;
  const G* pg = ptr<G>(grad_y);
  const X* px = ptr<X>(x);
  const float* pm = ptr<float>(save_mean);
  const float* pr = ptr<float>(save_rstd);
  cudaStream_t stream = current_stream();
  float* pdx = nullptr;
  const bool accumulate = grad_x != nullptr && grad_x->defined();
  if (grad_x != nullptr) {
    if (!accumulate) *grad_x = Tensor::empty(x.shape(), DType::F32);
    pdx = ptr<float>(*grad_x);
  }
  std::uint16_t* pdxb = nullptr;
  if (grad_x_bf16 != nullptr && pdx != nullptr) {
    *grad_x_bf16 = Tensor::empty(x.shape(), DType::BF16);
    pdxb = ptr<std::uint16_t>(*grad_x_bf16);
  }
  const bool sums = grad_weight != nullptr || grad_bias != nullptr;
  if (pdx == nullptr && !sums) return;
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
  const bool warp_rows = normalized <= kWarpRowMax;
  // Spans of rows, a slot of partial sums each (none when there are no rows: the sums kernel
  // then writes zeros).
  const std::int64_t span_rows = warp_rows
                                     ? layer_norm_span_rows(rows)
                                     : std::max(kSpanRows, (rows + kMaxSpans - 1) / kMaxSpans);
  const std::int64_t spans = (rows + span_rows - 1) / span_rows;
  Tensor dw_part, db_part;
  if (sums) {
    dw_part = Tensor::empty({std::max<std::int64_t>(spans, 1) * normalized}, DType::F64);
    db_part = Tensor::empty({std::max<std::int64_t>(spans, 1) * normalized}, DType::F64);
  }
  double* pdw_part = sums ? ptr<double>(dw_part) : nullptr;
  double* pdb_part = sums ? ptr<double>(db_part) : nullptr;
  if (rows > 0 && warp_rows) {
    with_row_slots(normalized, [&](auto slots, auto full) {
      layer_norm_backward_rows_kernel<X, G, decltype(slots)::value, decltype(full)::value>
          <<<grid_for(spans), kBlock, 0, stream>>>(pg, px, pw, pm, pr, pdx, accumulate, pdxb,
                                                   pdw_part, pdb_part, rows, normalized, span_rows);
    });
    HPM_CUDA_LAUNCH_CHECK("layer_norm_backward_rows_kernel");
  } else if (rows > 0) {
    if (pdx != nullptr) {
      layer_norm_backward_kernel<false, X, G><<<grid_for(rows), kBlock, 0, stream>>>(
          pg, px, pw, pm, pr, pdx, accumulate, pdxb, rows, normalized);
      HPM_CUDA_LAUNCH_CHECK("layer_norm_backward_kernel (block)");
    }
    if (sums) {
      const dim3 grid(static_cast<unsigned>((normalized + kBlock - 1) / kBlock),
                      static_cast<unsigned>(spans));
      layer_norm_column_partials_kernel<X, G><<<grid, kBlock, 0, stream>>>(
          pg, px, pm, pr, pdw_part, pdb_part, rows, normalized, span_rows);
      HPM_CUDA_LAUNCH_CHECK("layer_norm_column_partials_kernel");
    }
  }
  if (!sums) return;
  span_sums_kernel<<<grid_for((normalized + 31) / 32), kSpanSumThreads, 0, stream>>>(
      pdw_part, pdw, pdb_part, pdb, spans, normalized);
  HPM_CUDA_LAUNCH_CHECK("span_sums_kernel");
}

}  // namespace

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                         const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                         Tensor* grad_x_bf16) {
  if (normalized <= 0 || x.numel() % normalized != 0) {
    throw std::invalid_argument("layer_norm: cannot normalize " + x.shape().str() + " over " +
                                std::to_string(normalized) + " trailing elements");
  }
  const std::int64_t rows = x.numel() / normalized;
  if (grad_y.dtype() != DType::BF16) require_dtype(grad_y, DType::F32);
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
  // A BF16 grad_y (a bf16 product's input gradient) is read as it is beside the BF16 copy of x
  // autocast keeps; beside an F32 x (no such pairing in autocast) it is widened first.
  if (x.dtype() == DType::BF16 && grad_y.dtype() == DType::BF16) {
    run_layer_norm_backward<std::uint16_t, std::uint16_t>(grad_y, x, normalized, pw, save_mean,
                                                          save_rstd, grad_x, grad_weight, grad_bias,
                                                          grad_x_bf16);
  } else if (x.dtype() == DType::BF16) {
    run_layer_norm_backward<std::uint16_t, float>(grad_y, x, normalized, pw, save_mean, save_rstd,
                                                  grad_x, grad_weight, grad_bias, grad_x_bf16);
  } else {
    run_layer_norm_backward<float, float>(grad_y.dtype() == DType::BF16 ? to_f32(grad_y) : grad_y,
                                          x, normalized, pw, save_mean, save_rstd, grad_x,
                                          grad_weight, grad_bias, grad_x_bf16);
  }
}

}  // namespace hpm::cuda
