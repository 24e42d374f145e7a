// 2-D convolution as large GEMMs over chunks of the batch.
//
// im2col writes col(CKK, B*P) for a chunk of B images: row (c, i, j) of the kernel window, column
// (n, oh, ow). Each row is a run of shifted input rows, so im2col and col2im stream memory; the
// valid output range of each row is computed once, so the inner loops are branch-free copies.
//   forward:   y'(OC, B*P) = w(OC, CKK) col(CKK, B*P)     -> y(N, OC, P) by block transpose
//   backward:  dw(OC, CKK) += dy'(OC, B*P) col^T
//              dcol(CKK, B*P) = w^T dy'                     -> col2im -> dx
// One GEMM with B*P columns runs far closer to peak than B small per-image GEMMs, and chunking
// the batch bounds the col buffer (a few MiB) however large the evaluation batch is.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string_view>

#include "hpm/tensor/backend/cpu.h"
#include "parallel.h"

namespace hpm::cpu {

namespace {

struct Geometry {
  std::int64_t n, c, h, w, oc, kh, kw, oh, ow;
  std::int64_t p() const { return oh * ow; }
  std::int64_t ckk() const { return c * kh * kw; }
};

Geometry geometry(const Shape& x, const Shape& w, const Conv2dParams& p) {
  if (x.rank() != 4 || w.rank() != 4 || x[1] != w[1]) {
    throw std::invalid_argument("conv2d: input " + x.str() + " (N,C,H,W) does not match weight " +
                                w.str() + " (OC,C,KH,KW)");
  }
  Geometry g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], 0, 0};
  g.oh = (g.h + 2 * p.pad_h - g.kh) / p.stride_h + 1;
  g.ow = (g.w + 2 * p.pad_w - g.kw) / p.stride_w + 1;
  if (g.oh <= 0 || g.ow <= 0) {
    throw std::invalid_argument("conv2d: kernel " + w.str() + " larger than padded input " +
                                x.str());
  }
  return g;
}

// Images per GEMM: enough columns (~2k) for an efficient GEMM, few enough that col and dcol stay
// in cache between im2col, the GEMM and col2im (measured: bench/kernels_bench, 1k-16k columns).
std::int64_t chunk_images(const Geometry& g) {
  return std::clamp<std::int64_t>(2048 / std::max<std::int64_t>(g.p(), 1), 1, g.n);
}

// The output columns ow whose input column ow*stride - pad + j lies inside [0, w).
struct Span {
  std::int64_t lo, hi;
};
Span valid_ow(const Geometry& g, const Conv2dParams& p, std::int64_t j) {
  std::int64_t lo = 0, hi = g.ow;
  while (lo < hi && lo * p.stride_w - p.pad_w + j < 0) ++lo;
  while (hi > lo && (hi - 1) * p.stride_w - p.pad_w + j >= g.w) --hi;
  return {lo, hi};
}

// x: the first of `b` images; col: (CKK, b*P)
void im2col(const float* x, std::int64_t b, const Geometry& g, const Conv2dParams& p, float* col) {
  const std::int64_t np = b * g.p();
  parallel_for(g.ckk(), 4, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const std::int64_t c = r / (g.kh * g.kw), i = (r / g.kw) % g.kh, j = r % g.kw;
      const Span s = valid_ow(g, p, j);
      float* dst = col + r * np;
      for (std::int64_t n = 0; n < b; ++n) {
        const float* src = x + (n * g.c + c) * g.h * g.w;
        for (std::int64_t oh = 0; oh < g.oh; ++oh) {
          const std::int64_t ih = oh * p.stride_h - p.pad_h + i;
          float* d = dst + (n * g.oh + oh) * g.ow;
          if (ih < 0 || ih >= g.h) {
            for (std::int64_t ow = 0; ow < g.ow; ++ow) d[ow] = 0.0f;
            continue;
          }
          for (std::int64_t ow = 0; ow < s.lo; ++ow) d[ow] = 0.0f;
          for (std::int64_t ow = s.hi; ow < g.ow; ++ow) d[ow] = 0.0f;
          const float* srow = src + ih * g.w - p.pad_w + j;
          if (p.stride_w == 1) {
            // Runs are short (one image row): an inline loop beats a memcpy call.
            for (std::int64_t ow = s.lo; ow < s.hi; ++ow) d[ow] = srow[ow];
          } else {
            for (std::int64_t ow = s.lo; ow < s.hi; ++ow) d[ow] = srow[ow * p.stride_w];
          }
        }
      }
    }
  });
}

// dx (b images) += scatter of dcol; parallel over channels so no two threads write one plane.
void col2im(const float* col, std::int64_t b, const Geometry& g, const Conv2dParams& p, float* dx) {
  const std::int64_t np = b * g.p();
  parallel_for(g.c, 1, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t c = lo; c < hi; ++c)
      for (std::int64_t i = 0; i < g.kh; ++i)
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const Span s = valid_ow(g, p, j);
          const float* src = col + ((c * g.kh + i) * g.kw + j) * np;
          for (std::int64_t n = 0; n < b; ++n) {
            float* dst = dx + (n * g.c + c) * g.h * g.w;
            for (std::int64_t oh = 0; oh < g.oh; ++oh) {
              const std::int64_t ih = oh * p.stride_h - p.pad_h + i;
              if (ih < 0 || ih >= g.h) continue;
              const float* srow = src + (n * g.oh + oh) * g.ow;
              float* drow = dst + ih * g.w - p.pad_w + j;
              if (p.stride_w == 1) {
#pragma omp simd
                for (std::int64_t ow = s.lo; ow < s.hi; ++ow) drow[ow] += srow[ow];
              } else {
                for (std::int64_t ow = s.lo; ow < s.hi; ++ow) drow[ow * p.stride_w] += srow[ow];
              }
            }
          }
        }
  });
}

}  // namespace

Tensor conv2d_forward_im2col(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Conv2dParams& p) {
  const Geometry g = geometry(x.shape(), w.shape(), p);
  const std::int64_t P = g.p(), chunk = chunk_images(g);
  Tensor col = Tensor::empty({g.ckk(), chunk * P}, DType::F32, x.device());
  Tensor yt = Tensor::empty({g.oc, chunk * P}, DType::F32, x.device());
  Tensor y = Tensor::empty({g.n, g.oc, g.oh, g.ow}, DType::F32, x.device());
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  for (std::int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const std::int64_t b = std::min(chunk, g.n - n0), np = b * P;
    im2col(x.data<float>() + n0 * g.c * g.h * g.w, b, g, p, col.data<float>());
    gemm(false, false, g.oc, np, g.ckk(), 1.0f, w.data<float>(), g.ckk(), col.data<float>(), np,
         0.0f, yt.data<float>(), np);
    // (OC, b, P) -> (b, OC, P), adding the bias on the way.
    const float* pt = yt.data<float>();
    float* py = y.data<float>() + n0 * g.oc * P;
    parallel_for(b * g.oc, 16, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        const std::int64_t n = r / g.oc, o = r % g.oc;
        const float* s = pt + (o * b + n) * P;
        float* d = py + r * P;
        const float bv = pb ? pb[o] : 0.0f;
        if (p.relu) {
#pragma omp simd
          for (std::int64_t k = 0; k < P; ++k) d[k] = std::max(s[k] + bv, 0.0f);
        } else {
#pragma omp simd
          for (std::int64_t k = 0; k < P; ++k) d[k] = s[k] + bv;
        }
      }
    });
  }
  return y;
}

void conv2d_backward_im2col(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                            const Conv2dParams& p, Tensor* grad_x, Tensor* grad_w,
                            Tensor* grad_bias) {
  const Geometry g = geometry(x.shape(), w.shape(), p);
  const std::int64_t P = g.p(), chunk = chunk_images(g);
  Tensor gyt = Tensor::empty({g.oc, chunk * P}, DType::F32, x.device());
  Tensor col, dcol;
  if (grad_w) {
    col = Tensor::empty({g.ckk(), chunk * P}, DType::F32, x.device());
    *grad_w = Tensor::zeros(w.shape(), DType::F32, x.device());
  }
  if (grad_x) {
    dcol = Tensor::empty({g.ckk(), chunk * P}, DType::F32, x.device());
    *grad_x = Tensor::zeros(x.shape(), DType::F32, x.device());
  }
  if (grad_bias) *grad_bias = Tensor::zeros({g.oc}, DType::F32, x.device());
  for (std::int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const std::int64_t b = std::min(chunk, g.n - n0), np = b * P;
    // dy(b, OC, P) -> dy'(OC, b, P)
    const float* pg = grad_y.data<float>() + n0 * g.oc * P;
    float* pgt = gyt.data<float>();
    parallel_for(b * g.oc, 16, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        const std::int64_t n = r / g.oc, o = r % g.oc;
        std::memcpy(pgt + (o * b + n) * P, pg + r * P, static_cast<std::size_t>(P) * sizeof(float));
      }
    });
    if (grad_bias) {
      float* pb = grad_bias->data<float>();
      for (std::int64_t o = 0; o < g.oc; ++o) {
        const float* row = pgt + o * np;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (std::int64_t k = 0; k < np; ++k) s += row[k];
        pb[o] += s;
      }
    }
    if (grad_w) {
      im2col(x.data<float>() + n0 * g.c * g.h * g.w, b, g, p, col.data<float>());
      gemm(false, true, g.oc, g.ckk(), np, 1.0f, pgt, np, col.data<float>(), np, 1.0f,
           grad_w->data<float>(), g.ckk());
    }
    if (grad_x) {
      gemm(true, false, g.ckk(), np, g.oc, 1.0f, w.data<float>(), g.ckk(), pgt, np, 0.0f,
           dcol.data<float>(), np);
      col2im(dcol.data<float>(), b, g, p, grad_x->data<float>() + n0 * g.c * g.h * g.w);
    }
  }
}

// ---- dispatch -----------------------------------------------------------------------------------
// oneDNN's direct convolutions beat im2col + GEMM on both of the cnn's convolutions, forward and
// backward, at 1 and 2 threads (conv_dnnl.cpp explains why; A/B: bench/kernels_bench
// --benchmark_filter=Conv). im2col stays as the fallback for shapes oneDNN rejects (dnnl::error;
// the fallback recomputes every requested output) and for A/B runs of whole programs:
// HPM_CONV=im2col.
namespace {
bool use_dnnl() {
  static const bool on = [] {
    const char* v = std::getenv("HPM_CONV");
    return !(v && std::string_view(v) == "im2col");
  }();
  return on;
}
}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  if (use_dnnl() && x.numel() > 0) {
    try {
      return conv2d_forward_dnnl(x, w, bias, p);
    } catch (const dnnl::error&) {
    }
  }
  return conv2d_forward_im2col(x, w, bias, p);
}

void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                     Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias) {
  if (use_dnnl() && x.numel() > 0) {
    try {
      conv2d_backward_dnnl(grad_y, x, w, p, grad_x, grad_w, grad_bias);
      return;
    } catch (const dnnl::error&) {
    }
  }
  conv2d_backward_im2col(grad_y, x, w, p, grad_x, grad_w, grad_bias);
}

Tensor conv2d_relu_max_pool2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Conv2dParams& p, const Pool2dParams& pool,
                                      Tensor& argmax) {
  if (use_dnnl() && x.numel() > 0) {
    try {
      return conv2d_relu_max_pool2d_forward_dnnl(x, w, bias, p, pool, argmax);
    } catch (const dnnl::error&) {
    }
  }
  Conv2dParams relu = p;
  relu.relu = true;
  return max_pool2d_forward(conv2d_forward_im2col(x, w, bias, relu), pool, argmax);
}

void conv2d_relu_max_pool2d_backward(const Tensor& grad_pooled, const Tensor& argmax,
                                     const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                     const Pool2dParams& pool, Tensor* grad_x, Tensor* grad_w,
                                     Tensor* grad_bias) {
  if (use_dnnl() && x.numel() > 0) {
    try {
      conv2d_relu_max_pool2d_backward_dnnl(grad_pooled, argmax, x, w, p, pool, grad_x, grad_w,
                                           grad_bias);
      return;
    } catch (const dnnl::error&) {
    }
  }
  const Geometry g = geometry(x.shape(), w.shape(), p);
  conv2d_backward_im2col(max_pool2d_backward(grad_pooled, argmax, Shape{g.n, g.oc, g.oh, g.ow}), x,
                         w, p, grad_x, grad_w, grad_bias);
}

}  // namespace hpm::cpu
