// Max and average pooling over NCHW planes; each (n, c) plane is independent.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <vector>

#include "hpm/tensor/backend/cpu.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::cpu {

namespace {

struct PoolGeometry {
  std::int64_t planes, h, w, oh, ow;
};

PoolGeometry pool_geometry(const Shape& x, const Pool2dParams& p) {
  if (x.rank() != 4) throw std::invalid_argument("pool2d: expected (N,C,H,W), got " + x.str());
  if (p.pad_h * 2 > p.kernel_h || p.pad_w * 2 > p.kernel_w) {
    throw std::invalid_argument("pool2d: padding must be at most half the kernel size");
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

constexpr std::int64_t kPoolVector = 16;  // floats in the widest vector (AVX-512)

// The common 2x2/2 window over `planes` consecutive planes (h x w each; oh x ow windows, a
// trailing odd row or column left out) in two branch-free passes: the max of each vertical pair
// into `vmax` (with the winner's index in its plane in `vidx`), row by row, then of each
// horizontal pair, flat over all the planes. The winner is data-dependent: branches would be
// mispredicted half the time. NaN wins, and among equals the first in row-major order (the smaller
// index), as in PyTorch. Compiled per instruction set (vec.h).
//
// Rows are short (28 and 14 columns in the cnn), and a loop's remainder after its last full
// vector runs scalar: that was half of the time. So each row's pass runs to a multiple of the
// vector width where `readable` (the floats from `src` to the end of the input) allows, and
// its surplus lands in the next row's place in `vmax` and `vidx`, which that row overwrites
// (the scratch holds kPoolVector more than the planes need).
HPM_SIMD_CLONES void max_pool_2x2_planes(const float* src, std::int64_t readable, float* dst,
                                         std::int32_t* arg, std::int64_t planes, std::int64_t h,
                                         std::int64_t w, std::int64_t oh, std::int64_t ow,
                                         float* vmax, std::int32_t* vidx) {
  const std::int64_t pairs = 2 * ow;  // columns that windows cover
  const std::int64_t padded = (pairs + kPoolVector - 1) / kPoolVector * kPoolVector;
  for (std::int64_t pl = 0; pl < planes; ++pl) {
    for (std::int64_t r = 0; r < oh; ++r) {
      const std::int64_t at = pl * h * w + 2 * r * w;
      const float* r0 = src + at;
      const float* r1 = r0 + w;
      float* vm = vmax + (pl * oh + r) * pairs;
      std::int32_t* vi = vidx + (pl * oh + r) * pairs;
      const auto top = static_cast<std::int32_t>(2 * r * w);
      const auto bottom = static_cast<std::int32_t>(top + w);
      const std::int64_t n = at + w + padded <= readable ? padded : pairs;
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k) {
        const float a = r0[k], b = r1[k];
        const bool take_b = (b > a) | ((b != b) & (a == a));
        vm[k] = take_b ? b : a;
        vi[k] = (take_b ? bottom : top) + static_cast<std::int32_t>(k);
      }
    }
  }
  const std::int64_t windows = planes * oh * ow;
#pragma omp simd
  for (std::int64_t f = 0; f < windows; ++f) {
    const float a = vmax[2 * f], b = vmax[2 * f + 1];
    const std::int32_t ia = vidx[2 * f], ib = vidx[2 * f + 1];
    const bool take_b = (b > a) | ((b != b) & (a == a)) | ((b == a) & (ib < ia));
    dst[f] = take_b ? b : a;
    arg[f] = take_b ? ib : ia;
  }
}

}  // namespace

Tensor max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& argmax) {
  const PoolGeometry g = pool_geometry(x.shape(), p);
  Tensor y = Tensor::empty(pooled_shape(x.shape(), g), DType::F32, x.device());
  argmax = Tensor::empty(y.shape(), DType::I32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  auto* pa = argmax.data<std::int32_t>();
  if (p.kernel_h == 2 && p.kernel_w == 2 && p.stride_h == 2 && p.stride_w == 2 && p.pad_h == 0 &&
      p.pad_w == 0) {
    constexpr std::int64_t kBlock = 16;  // planes a pass covers: the scratch stays in L1/L2
    const std::int64_t total = x.numel();
    parallel_for(g.planes, 8, [&](std::int64_t lo, std::int64_t hi) {
      const auto n =
          static_cast<std::size_t>(std::min(kBlock, hi - lo) * g.oh * 2 * g.ow + 2 * kPoolVector);
      std::vector<float> vmax(n);
      std::vector<std::int32_t> vidx(n);
      for (std::int64_t b = lo; b < hi; b += kBlock) {
        const std::int64_t count = std::min(kBlock, hi - b), first = b * g.h * g.w;
        max_pool_2x2_planes(px + first, total - first, py + b * g.oh * g.ow, pa + b * g.oh * g.ow,
                            count, g.h, g.w, g.oh, g.ow, vmax.data(), vidx.data());
      }
    });
    return y;
  }
  parallel_for(g.planes, 8, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t pl = lo; pl < hi; ++pl) {
      const float* src = px + pl * g.h * g.w;
      for (std::int64_t oh = 0; oh < g.oh; ++oh)
        for (std::int64_t ow = 0; ow < g.ow; ++ow) {
          float best = -std::numeric_limits<float>::infinity();
          std::int64_t best_i = -1;
          for (std::int64_t i = 0; i < p.kernel_h; ++i) {
            const std::int64_t ih = oh * p.stride_h - p.pad_h + i;
            if (ih < 0 || ih >= g.h) continue;
            for (std::int64_t j = 0; j < p.kernel_w; ++j) {
              const std::int64_t iw = ow * p.stride_w - p.pad_w + j;
              if (iw < 0 || iw >= g.w) continue;
              const float v = src[ih * g.w + iw];
              // NaN propagates, as in PyTorch; the first NaN, as max_pool_2x2_planes keeps.
              if (v > best || best_i < 0 || (v != v && best == best)) {
                best = v;
                best_i = ih * g.w + iw;
              }
            }
          }
          const std::int64_t o = (pl * g.oh + oh) * g.ow + ow;
          py[o] = best;
          pa[o] = static_cast<std::int32_t>(best_i);
        }
    }
  });
  return y;
}

Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const Shape& x_shape) {
  Tensor gx = Tensor::zeros(x_shape, DType::F32, grad_y.device());
  const std::int64_t planes = x_shape[0] * x_shape[1], hw = x_shape[2] * x_shape[3];
  const std::int64_t ohw = grad_y.size(2) * grad_y.size(3);
  const float* pg = grad_y.data<float>();
  const auto* pa = argmax.data<std::int32_t>();
  float* px = gx.data<float>();
  parallel_for(planes, 8, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t pl = lo; pl < hi; ++pl)
      for (std::int64_t k = 0; k < ohw; ++k) px[pl * hw + pa[pl * ohw + k]] += pg[pl * ohw + k];
  });
  return gx;
}

Tensor avg_pool2d_forward(const Tensor& x, const Pool2dParams& p) {
  const PoolGeometry g = pool_geometry(x.shape(), p);
  Tensor y = Tensor::empty(pooled_shape(x.shape(), g), DType::F32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(g.planes, 8, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t pl = lo; pl < hi; ++pl) {
      const float* src = px + pl * g.h * g.w;
      for (std::int64_t oh = 0; oh < g.oh; ++oh)
        for (std::int64_t ow = 0; ow < g.ow; ++ow) {
          float s = 0.0f;
          std::int64_t count = 0;
          for (std::int64_t i = 0; i < p.kernel_h; ++i) {
            const std::int64_t ih = oh * p.stride_h - p.pad_h + i;
            for (std::int64_t j = 0; j < p.kernel_w; ++j) {
              const std::int64_t iw = ow * p.stride_w - p.pad_w + j;
              if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
              s += src[ih * g.w + iw];
              ++count;
            }
          }
          const std::int64_t div = p.count_include_pad ? p.kernel_h * p.kernel_w : count;
          py[(pl * g.oh + oh) * g.ow + ow] = s / static_cast<float>(div);
        }
    }
  });
  return y;
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p) {
  const PoolGeometry g = pool_geometry(x_shape, p);
  Tensor gx = Tensor::zeros(x_shape, DType::F32, grad_y.device());
  const float* pg = grad_y.data<float>();
  float* px = gx.data<float>();
  parallel_for(g.planes, 8, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t pl = lo; pl < hi; ++pl) {
      float* dst = px + pl * g.h * g.w;
      for (std::int64_t oh = 0; oh < g.oh; ++oh)
        for (std::int64_t ow = 0; ow < g.ow; ++ow) {
          std::int64_t count = 0;
          for (std::int64_t i = 0; i < p.kernel_h; ++i)
            for (std::int64_t j = 0; j < p.kernel_w; ++j) {
              const std::int64_t ih = oh * p.stride_h - p.pad_h + i;
              const std::int64_t iw = ow * p.stride_w - p.pad_w + j;
              if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) ++count;
            }
          const std::int64_t div = p.count_include_pad ? p.kernel_h * p.kernel_w : count;
          const float v = pg[(pl * g.oh + oh) * g.ow + ow] / static_cast<float>(div);
          for (std::int64_t i = 0; i < p.kernel_h; ++i)
            for (std::int64_t j = 0; j < p.kernel_w; ++j) {
              const std::int64_t ih = oh * p.stride_h - p.pad_h + i;
              const std::int64_t iw = ow * p.stride_w - p.pad_w + j;
              if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) dst[ih * g.w + iw] += v;
            }
        }
    }
  });
  return gx;
}

}  // namespace hpm::cpu
