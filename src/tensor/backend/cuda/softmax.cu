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
#include "tensor/backend/cuda/softmax_kernels.cuh"

namespace hpm::cuda {

namespace {

struct Axis {
  std::int64_t outer, len, inner;
};

Axis split_axis(const Shape& s, int dim) {
  const int d = s.wrap(dim);  // std::out_of_range for a bad dim, as the CPU's
  return {s.numel_before(d), s[d], s.numel_from(d + 1)};
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

// ---- cross-entropy -----------------------------------------------------------------------

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

}  // namespace

Tensor softmax(const Tensor& x, int dim) { return softmax_impl<false>(x, dim); }
Tensor log_softmax(const Tensor& x, int dim) { return softmax_impl<true>(x, dim); }
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) {
  return softmax_backward_impl<false>(grad_y, y, dim);
}
Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) {
  return softmax_backward_impl<true>(grad_y, y, dim);
}

namespace {

// What both cross-entropy launchers share: the checks, the prediction's tensor, the deferred label
// check, each row's loss term by rows(px, labels, row_loss, error word, predicted) (px the
// logits' elements: float, or bf16 bits), and their mean into the 0-d loss (NaN for no rows, the
// CPU's 0 / 0). A bad label is reported at the host's next read from the device
// (deferred_checks.h).
template <typename Rows>
Tensor cross_entropy_loss(const Tensor& logits, const Tensor& labels, std::int64_t ignore_index,
                          Tensor* predicted, Rows&& rows) {
  const std::int64_t n = labels.numel(), c = logits.size(-1);
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
    cross_entropy_mean_kernel<<<1, 1024, 0, stream>>>(nullptr, nullptr, 0, ignore_index,
                                                      ptr<float>(loss));
    HPM_CUDA_LAUNCH_CHECK("cross_entropy_mean_kernel");
    return loss;
  }
  Tensor row_loss = Tensor::empty({n}, DType::F64);
  const IndexCheck check =
      defer_index_check(current_context(), labels, [c](std::int64_t row, std::int64_t label) {
        return "cross_entropy: label " + std::to_string(label) + " at row " + std::to_string(row) +
               " is not a class index in [0, " + std::to_string(c) + ")";
      });
  const auto* py = ptr<std::int64_t>(labels);
  if (logits.dtype() == DType::BF16) {
    rows(ptr<std::uint16_t>(logits), py, ptr<double>(row_loss), check.word(), pp);
  } else {
    rows(ptr<float>(logits), py, ptr<double>(row_loss), check.word(), pp);
  }
  cross_entropy_mean_kernel<<<1, 1024, 0, stream>>>(ptr<double>(row_loss), py, n, ignore_index,
                                                    ptr<float>(loss));
  HPM_CUDA_LAUNCH_CHECK("cross_entropy_mean_kernel");
  return loss;
}

}  // namespace

Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                             Tensor& stats, std::int64_t ignore_index, Tensor* predicted) {
  const std::int64_t n = check_labels(logits, labels), c = logits.size(-1);
  stats = Tensor::empty(Shape{n, 2}, DType::F32);
  float* ps = ptr<float>(stats);
  return cross_entropy_loss(
      logits, labels, ignore_index, predicted,
      [&](const auto* px, const std::int64_t* py, double* row_loss, unsigned long long* error,
          std::int64_t* pp) {
        cudaStream_t stream = current_stream();
        if (c <= kWarpRowMax) {
          cross_entropy_rows_kernel<true>
              <<<grid_for((n + kBlock / 32 - 1) / (kBlock / 32)), kBlock, 0, stream>>>(
                  px, py, ps, row_loss, error, n, c, label_smoothing, ignore_index, pp);
          HPM_CUDA_LAUNCH_CHECK("cross_entropy_rows_kernel (warp)");
        } else {
          cross_entropy_rows_kernel<false><<<grid_for(n), kBlock, 0, stream>>>(
              px, py, ps, row_loss, error, n, c, label_smoothing, ignore_index, pp);
          HPM_CUDA_LAUNCH_CHECK("cross_entropy_rows_kernel (block)");
        }
      });
}

Tensor cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels, float label_smoothing,
                                    std::int64_t ignore_index, Tensor* predicted) {
  const std::int64_t n = check_labels(logits, labels), c = logits.size(-1);
  return cross_entropy_loss(
      logits, labels, ignore_index, predicted,
      [&](auto* px, const std::int64_t* py, double* row_loss, unsigned long long* error,
          std::int64_t* pp) {
        cudaStream_t stream = current_stream();
        Tensor count = Tensor::empty({1}, DType::F32);
        count_labels_kernel<<<1, 1024, 0, stream>>>(py, n, ignore_index, ptr<float>(count));
        HPM_CUDA_LAUNCH_CHECK("count_labels_kernel");
        if (c <= kWarpRowMax) {
          cross_entropy_with_gradient_kernel<true>
              <<<grid_for((n + kBlock / 32 - 1) / (kBlock / 32)), kBlock, 0, stream>>>(
                  px, py, ptr<float>(count), row_loss, error, n, c, label_smoothing, ignore_index,
                  pp);
          HPM_CUDA_LAUNCH_CHECK("cross_entropy_with_gradient_kernel (warp)");
        } else {
          // 512 threads a row, two blocks an SM (the kernel's launch bounds hold it to 64
          // registers a thread): 2 x 132 rows in flight (26 MB of GPT-2's bf16 rows), so that
          // the second read of each can find it in the 50 MB L2, and one block's reads can overlap
          // the other's reductions (the design; no card has timed it yet).
          cross_entropy_with_gradient_kernel<false><<<grid_for(n), kFusedRowThreads, 0, stream>>>(
              px, py, ptr<float>(count), row_loss, error, n, c, label_smoothing, ignore_index, pp);
          HPM_CUDA_LAUNCH_CHECK("cross_entropy_with_gradient_kernel (block)");
        }
      });
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
    // Eight logits a thread where rows are multiples of 8 (the kernel's 16-byte accesses).
    const unsigned threads = row_threads(c % 8 == 0 ? c / 8 : c);
    cross_entropy_backward_kernel<<<grid_for(n), threads, 0, stream>>>(
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
