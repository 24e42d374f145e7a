// Max and average pooling over NCHW planes: pool.cpp's general path, one thread per output
// element forward. The backwards are gathers, one thread per input pixel, which adds the gradients
// of the outputs it feeds in increasing output order: the order in which the CPU's scatter adds
// them, so the sums round as the CPU's do, with no atomics.
//
// max_pool2d_backward has no window geometry (only the argmax), so it first finds, per input row
// and per input column, the range of output rows and columns whose argmax lies there (integer
// atomicMin / atomicMax over all outputs, whose results do not depend on the order); an input
// pixel then scans only those outputs. The ranges are as wide as the windows' overlap
// (ceil(kernel / stride)), whatever the argmax holds.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/runtime.h"
#include "tensor/backend/cuda/vision_ops.h"

namespace hpm::cuda {

namespace {

using kernels::Pool2dParams;

constexpr int kBlock = 256;

struct PoolGeometry {
  std::int64_t planes, h, w, oh, ow;
};

// pool.cpp's pool_geometry, with the same messages.
PoolGeometry pool_geometry(const Shape& x, const Pool2dParams& p) {
  if (x.rank() != 4) throw std::invalid_argument("pool2d: expected (N,C,H,W), got " + x.str());
  if (p.pad_h * 2 > p.kernel_h || p.pad_w * 2 > p.kernel_w) {
    throw std::invalid_argument("pool2d: padding must be at most half the kernel size");
  }
  // The CPU divides by the stride unchecked (a zero one traps); here it is an error.
  if (p.stride_h <= 0 || p.stride_w <= 0) {
    throw std::invalid_argument("pool2d: stride must be positive");
  }
  PoolGeometry g{x[0] * x[1], x[2], x[3], 0, 0};
  g.oh = (g.h + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
  g.ow = (g.w + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
  if (g.oh <= 0 || g.ow <= 0) {
    throw std::invalid_argument("pool2d: kernel larger than padded input " + x.str());
  }
  return g;
}

Shape pooled_shape(const Shape& x, const PoolGeometry& g) { return Shape{x[0], x[1], g.oh, g.ow}; }

// The window parameters a kernel needs.
struct Window {
  int kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};

Window window_of(const Pool2dParams& p) {
  return {p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.count_include_pad};
}

__device__ std::int64_t floor_div(std::int64_t a, std::int64_t b) {  // b > 0
  const std::int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

__device__ std::int64_t ceil_div(std::int64_t a, std::int64_t b) {  // b > 0
  const std::int64_t q = a / b;
  return (a % b != 0 && a > 0) ? q + 1 : q;
}

// The windows (along one axis, `stride`, `pad`, `kernel`) covering input position i, clipped to
// [0, out): [*lo, *hi], empty when *lo > *hi. Window o covers [o s - pad, o s - pad + kernel - 1].
__device__ void covering(std::int64_t i, int stride, int pad, int kernel, std::int64_t out,
                         std::int64_t* lo, std::int64_t* hi) {
  const std::int64_t a = ceil_div(i + pad - kernel + 1, stride);
  const std::int64_t b = floor_div(i + pad, stride);
  *lo = a < 0 ? 0 : a;
  *hi = b > out - 1 ? out - 1 : b;
}

// The valid input positions of window o along one axis (the CPU counts the valid (i, j) pairs:
// the product of the two axes' counts).
__device__ std::int64_t valid_in_window(std::int64_t o, int stride, int pad, int kernel,
                                        std::int64_t in) {
  std::int64_t first = o * stride - pad, last = first + kernel - 1;
  if (first < 0) first = 0;
  if (last > in - 1) last = in - 1;
  return last >= first ? last - first + 1 : 0;
}

// One output per thread: the max of its window, NaN winning (a later NaN replaces an earlier
// one, as the CPU's `v != v`), ties to the first in row-major order (strict >).
__global__ void max_pool2d_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                          std::int32_t* __restrict__ argmax, std::int64_t total,
                                          std::int64_t h, std::int64_t w, std::int64_t oh,
                                          std::int64_t ow, Window win) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += stride) {
    const std::int64_t pl = o / (oh * ow), r = o - pl * oh * ow;
    const std::int64_t orow = r / ow, ocol = r - orow * ow;
    const float* src = x + pl * h * w;
    float best = -INFINITY;
    std::int64_t best_i = -1;
    for (int i = 0; i < win.kh; ++i) {
      const std::int64_t ih = orow * win.sh - win.ph + i;
      if (ih < 0 || ih >= h) continue;
      for (int j = 0; j < win.kw; ++j) {
        const std::int64_t iw = ocol * win.sw - win.pw + j;
        if (iw < 0 || iw >= w) continue;
        const float v = src[ih * w + iw];
        if (v > best || best_i < 0 || (v != v && best == best)) {
          best = v;
          best_i = ih * w + iw;
        }
      }
    }
    y[o] = best;
    argmax[o] = static_cast<std::int32_t>(best_i);
  }
}

// bounds = [row_lo (h) | col_lo (w) | row_hi (h) | col_hi (w)]: per input row, the least and
// greatest output row whose argmax lies in it; per input column, likewise for output columns.
// Starts at INT_MAX-ish (lo) and -1 (hi). An argmax outside the plane (-1 for a window that held
// no input) feeds nothing. A plain read first skips most atomics (the bounds only move one way,
// so a stale read only costs an atomic that changes nothing).
__global__ void max_pool2d_bounds_kernel(const std::int32_t* __restrict__ argmax,
                                         std::int32_t* bounds, std::int64_t total, std::int64_t h,
                                         std::int64_t w, std::int64_t oh, std::int64_t ow) {
  std::int32_t* row_lo = bounds;
  std::int32_t* col_lo = bounds + h;
  std::int32_t* row_hi = bounds + h + w;
  std::int32_t* col_hi = bounds + 2 * h + w;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += stride) {
    const std::int64_t a = argmax[o];
    if (a < 0 || a >= h * w) continue;
    const std::int64_t r = o % (oh * ow);
    const auto orow = static_cast<std::int32_t>(r / ow);
    const auto ocol = static_cast<std::int32_t>(r - (r / ow) * ow);
    const std::int64_t ar = a / w, ac = a - ar * w;
    if (orow < __ldcg(row_lo + ar)) atomicMin(row_lo + ar, orow);
    if (orow > __ldcg(row_hi + ar)) atomicMax(row_hi + ar, orow);
    if (ocol < __ldcg(col_lo + ac)) atomicMin(col_lo + ac, ocol);
    if (ocol > __ldcg(col_hi + ac)) atomicMax(col_hi + ac, ocol);
  }
}

// One input pixel per thread: the sum, in increasing output order, of the gradients of the
// outputs whose argmax it is.
__global__ void max_pool2d_backward_kernel(const float* __restrict__ grad_y,
                                           const std::int32_t* __restrict__ argmax,
                                           const std::int32_t* __restrict__ bounds,
                                           float* __restrict__ gx, std::int64_t total,
                                           std::int64_t h, std::int64_t w, std::int64_t oh,
                                           std::int64_t ow) {
  const std::int32_t* row_lo = bounds;
  const std::int32_t* col_lo = bounds + h;
  const std::int32_t* row_hi = bounds + h + w;
  const std::int32_t* col_hi = bounds + 2 * h + w;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const std::int64_t pl = e / (h * w), at = e - pl * h * w;
    const std::int64_t ih = at / w, iw = at - ih * w;
    const std::int64_t r0 = row_lo[ih], r1 = row_hi[ih], c0 = col_lo[iw], c1 = col_hi[iw];
    const std::int64_t base = pl * oh * ow;
    float s = 0.0f;
    for (std::int64_t r = r0; r <= r1; ++r)
      for (std::int64_t c = c0; c <= c1; ++c) {
        const std::int64_t o = base + r * ow + c;
        if (argmax[o] == at) s += grad_y[o];
      }
    gx[e] = s;
  }
}

// One output per thread: the window's sum (row-major) over its valid inputs, divided by the
// kernel's area (count_include_pad) or by the valid count.
__global__ void avg_pool2d_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                          std::int64_t total, std::int64_t h, std::int64_t w,
                                          std::int64_t oh, std::int64_t ow, Window win) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += stride) {
    const std::int64_t pl = o / (oh * ow), r = o - pl * oh * ow;
    const std::int64_t orow = r / ow, ocol = r - orow * ow;
    const float* src = x + pl * h * w;
    float s = 0.0f;
    std::int64_t count = 0;
    for (int i = 0; i < win.kh; ++i) {
      const std::int64_t ih = orow * win.sh - win.ph + i;
      for (int j = 0; j < win.kw; ++j) {
        const std::int64_t iw = ocol * win.sw - win.pw + j;
        if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
        s += src[ih * w + iw];
        ++count;
      }
    }
    const std::int64_t div =
        win.count_include_pad ? static_cast<std::int64_t>(win.kh) * win.kw : count;
    y[o] = s / static_cast<float>(div);
  }
}

// One input pixel per thread: the sum over the windows covering it, in increasing window order,
// of each window's gradient divided as the forward divides.
__global__ void avg_pool2d_backward_kernel(const float* __restrict__ grad_y, float* __restrict__ gx,
                                           std::int64_t total, std::int64_t h, std::int64_t w,
                                           std::int64_t oh, std::int64_t ow, Window win) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const std::int64_t pl = e / (h * w), at = e - pl * h * w;
    const std::int64_t ih = at / w, iw = at - ih * w;
    std::int64_t r0 = 0, r1 = -1, c0 = 0, c1 = -1;
    covering(ih, win.sh, win.ph, win.kh, oh, &r0, &r1);
    covering(iw, win.sw, win.pw, win.kw, ow, &c0, &c1);
    const float* g = grad_y + pl * oh * ow;
    float s = 0.0f;
    for (std::int64_t r = r0; r <= r1; ++r) {
      const std::int64_t rows = valid_in_window(r, win.sh, win.ph, win.kh, h);
      for (std::int64_t c = c0; c <= c1; ++c) {
        const std::int64_t div = win.count_include_pad
                                     ? static_cast<std::int64_t>(win.kh) * win.kw
                                     : rows * valid_in_window(c, win.sw, win.pw, win.kw, w);
        s += g[r * ow + c] / static_cast<float>(div);
      }
    }
    gx[e] = s;
  }
}

}  // namespace

Tensor max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& argmax) {
  const PoolGeometry g = pool_geometry(x.shape(), p);
  Tensor y = Tensor::empty(pooled_shape(x.shape(), g), DType::F32, x.device());
  argmax = Tensor::empty(y.shape(), DType::I32, x.device());
  require_dtype(x, DType::F32);
  const std::int64_t total = y.numel();
  if (total == 0) return y;
  max_pool2d_forward_kernel<<<blocks_for(total, kBlock), kBlock, 0, current_stream()>>>(
      ptr<float>(x), ptr<float>(y), ptr<std::int32_t>(argmax), total, g.h, g.w, g.oh, g.ow,
      window_of(p));
  HPM_CUDA_LAUNCH_CHECK("max_pool2d_forward_kernel");
  return y;
}

Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const Shape& x_shape) {
  if (x_shape.rank() != 4 || grad_y.dim() != 4 || grad_y.size(0) != x_shape[0] ||
      grad_y.size(1) != x_shape[1]) {
    throw std::invalid_argument("max_pool2d_backward: grad_y " + grad_y.shape().str() +
                                " for an input of " + x_shape.str());
  }
  check_shape(argmax, grad_y.shape(), "max_pool2d_backward: argmax");
  require_dtype(grad_y, DType::F32);
  require_dtype(argmax, DType::I32);
  const std::int64_t h = x_shape[2], w = x_shape[3];
  const std::int64_t oh = grad_y.size(2), ow = grad_y.size(3);
  Tensor gx = Tensor::empty(x_shape, DType::F32, grad_y.device());
  const std::int64_t total = gx.numel();
  if (total == 0) return gx;
  cudaStream_t stream = current_stream();
  Tensor bounds = Tensor::empty({2 * (h + w)}, DType::I32, grad_y.device());
  auto* pb = ptr<std::int32_t>(bounds);
  const auto side = static_cast<std::size_t>(h + w) * sizeof(std::int32_t);
  HPM_CUDA_CHECK(cudaMemsetAsync(pb, 0x7f, side, stream));          // lo: 0x7f7f7f7f
  HPM_CUDA_CHECK(cudaMemsetAsync(pb + h + w, 0xff, side, stream));  // hi: -1
  const std::int64_t outputs = grad_y.numel();
  const auto* pa = ptr<std::int32_t>(argmax);
  if (outputs > 0) {
    max_pool2d_bounds_kernel<<<blocks_for(outputs, kBlock), kBlock, 0, stream>>>(pa, pb, outputs, h,
                                                                                 w, oh, ow);
    HPM_CUDA_LAUNCH_CHECK("max_pool2d_bounds_kernel");
  }
  max_pool2d_backward_kernel<<<blocks_for(total, kBlock), kBlock, 0, stream>>>(
      ptr<float>(grad_y), pa, pb, ptr<float>(gx), total, h, w, oh, ow);
  HPM_CUDA_LAUNCH_CHECK("max_pool2d_backward_kernel");
  return gx;
}

Tensor avg_pool2d_forward(const Tensor& x, const Pool2dParams& p) {
  const PoolGeometry g = pool_geometry(x.shape(), p);
  Tensor y = Tensor::empty(pooled_shape(x.shape(), g), DType::F32, x.device());
  require_dtype(x, DType::F32);
  const std::int64_t total = y.numel();
  if (total == 0) return y;
  avg_pool2d_forward_kernel<<<blocks_for(total, kBlock), kBlock, 0, current_stream()>>>(
      ptr<float>(x), ptr<float>(y), total, g.h, g.w, g.oh, g.ow, window_of(p));
  HPM_CUDA_LAUNCH_CHECK("avg_pool2d_forward_kernel");
  return y;
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p) {
  const PoolGeometry g = pool_geometry(x_shape, p);
  Tensor gx = Tensor::empty(x_shape, DType::F32, grad_y.device());
  // The CPU reads grad_y as the pooled shape; here a mismatch is an error rather than a stray read.
  check_shape(grad_y, pooled_shape(x_shape, g), "avg_pool2d_backward: grad_y");
  require_dtype(grad_y, DType::F32);
  const std::int64_t total = gx.numel();
  if (total == 0) return gx;
  avg_pool2d_backward_kernel<<<blocks_for(total, kBlock), kBlock, 0, current_stream()>>>(
      ptr<float>(grad_y), ptr<float>(gx), total, g.h, g.w, g.oh, g.ow, window_of(p));
  HPM_CUDA_LAUNCH_CHECK("avg_pool2d_backward_kernel");
  return gx;
}

}  // namespace hpm::cuda
