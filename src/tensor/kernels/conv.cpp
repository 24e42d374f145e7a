// 2-D convolution as one large GEMM over the whole batch.
//
// im2col writes col(CKK, N*P): row (c, i, j) of the kernel window, column (n, oh, ow). For stride 1
// each row is a run of shifted input rows, so both im2col and col2im stream memory. Then
//   forward:   y'(OC, N*P) = w(OC, CKK) col(CKK, N*P)          -> y(N, OC, P) by block transpose
//   backward:  dw(OC, CKK) = dy'(OC, N*P) col^T
//              dcol(CKK, N*P) = w^T dy'                          -> col2im -> dx
// One GEMM with N*P columns runs far closer to peak than N small per-image GEMMs.
#include <cstring>
#include <stdexcept>

#include "hpm/tensor/kernels.h"
#include "parallel.h"

namespace hpm::kernels {

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

void im2col(const float* x, const Geometry& g, const Conv2dParams& p, float* col) {
  const std::int64_t np = g.n * g.p();
  parallel_for(g.ckk(), 4, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const std::int64_t c = r / (g.kh * g.kw), i = (r / g.kw) % g.kh, j = r % g.kw;
      float* dst = col + r * np;
      for (std::int64_t n = 0; n < g.n; ++n) {
        const float* src = x + (n * g.c + c) * g.h * g.w;
        for (std::int64_t oh = 0; oh < g.oh; ++oh) {
          const std::int64_t ih = oh * p.stride_h - p.pad_h + i;
          float* d = dst + (n * g.oh + oh) * g.ow;
          if (ih < 0 || ih >= g.h) {
            std::memset(d, 0, static_cast<std::size_t>(g.ow) * sizeof(float));
            continue;
          }
          const float* s = src + ih * g.w;
          for (std::int64_t ow = 0; ow < g.ow; ++ow) {
            const std::int64_t iw = ow * p.stride_w - p.pad_w + j;
            d[ow] = (iw >= 0 && iw < g.w) ? s[iw] : 0.0f;
          }
        }
      }
    }
  });
}

// dx += scatter of dcol; parallel over channels so no two threads write the same input plane.
void col2im(const float* col, const Geometry& g, const Conv2dParams& p, float* dx) {
  const std::int64_t np = g.n * g.p();
  parallel_for(g.c, 1, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t c = lo; c < hi; ++c)
      for (std::int64_t i = 0; i < g.kh; ++i)
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const float* src = col + ((c * g.kh + i) * g.kw + j) * np;
          for (std::int64_t n = 0; n < g.n; ++n) {
            float* dst = dx + (n * g.c + c) * g.h * g.w;
            for (std::int64_t oh = 0; oh < g.oh; ++oh) {
              const std::int64_t ih = oh * p.stride_h - p.pad_h + i;
              if (ih < 0 || ih >= g.h) continue;
              const float* s = src + (n * g.oh + oh) * g.ow;
              float* d = dst + ih * g.w;
              for (std::int64_t ow = 0; ow < g.ow; ++ow) {
                const std::int64_t iw = ow * p.stride_w - p.pad_w + j;
                if (iw >= 0 && iw < g.w) d[iw] += s[ow];
              }
            }
          }
        }
  });
}

}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Conv2dParams& p) {
  const Geometry g = geometry(x.shape(), w.shape(), p);
  const std::int64_t np = g.n * g.p();
  Tensor col = Tensor::empty({g.ckk(), np}, DType::F32, x.device());
  im2col(x.data<float>(), g, p, col.data<float>());
  Tensor yt = Tensor::empty({g.oc, np}, DType::F32, x.device());
  gemm(false, false, g.oc, np, g.ckk(), 1.0f, w.data<float>(), g.ckk(), col.data<float>(), np,
       0.0f, yt.data<float>(), np);
  // (OC, N, P) -> (N, OC, P), adding the bias on the way.
  Tensor y = Tensor::empty({g.n, g.oc, g.oh, g.ow}, DType::F32, x.device());
  const float* pt = yt.data<float>();
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  float* py = y.data<float>();
  const std::int64_t P = g.p();
  parallel_for(g.n * g.oc, 16, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const std::int64_t n = r / g.oc, o = r % g.oc;
      const float* s = pt + (o * g.n + n) * P;
      float* d = py + r * P;
      const float b = pb ? pb[o] : 0.0f;
      for (std::int64_t k = 0; k < P; ++k) d[k] = s[k] + b;
    }
  });
  return y;
}

void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                     const Conv2dParams& p, Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias) {
  const Geometry g = geometry(x.shape(), w.shape(), p);
  const std::int64_t np = g.n * g.p(), P = g.p();
  // dy(N, OC, P) -> dy'(OC, N, P)
  Tensor gyt = Tensor::empty({g.oc, np}, DType::F32, x.device());
  const float* pg = grad_y.data<float>();
  float* pgt = gyt.data<float>();
  parallel_for(g.n * g.oc, 16, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const std::int64_t n = r / g.oc, o = r % g.oc;
      std::memcpy(pgt + (o * g.n + n) * P, pg + r * P, static_cast<std::size_t>(P) * sizeof(float));
    }
  });
  if (grad_bias) {
    *grad_bias = Tensor::empty({g.oc}, DType::F32, x.device());
    float* pb = grad_bias->data<float>();
    for (std::int64_t o = 0; o < g.oc; ++o) {
      double s = 0.0;
      for (std::int64_t k = 0; k < np; ++k) s += pgt[o * np + k];
      pb[o] = static_cast<float>(s);
    }
  }
  if (grad_w) {
    Tensor col = Tensor::empty({g.ckk(), np}, DType::F32, x.device());
    im2col(x.data<float>(), g, p, col.data<float>());
    *grad_w = Tensor::empty(w.shape(), DType::F32, x.device());
    gemm(false, true, g.oc, g.ckk(), np, 1.0f, pgt, np, col.data<float>(), np, 0.0f,
         grad_w->data<float>(), g.ckk());
  }
  if (grad_x) {
    Tensor dcol = Tensor::empty({g.ckk(), np}, DType::F32, x.device());
    gemm(true, false, g.ckk(), np, g.oc, 1.0f, w.data<float>(), g.ckk(), pgt, np, 0.0f,
         dcol.data<float>(), np);
    *grad_x = Tensor::zeros(x.shape(), DType::F32, x.device());
    col2im(dcol.data<float>(), g, p, grad_x->data<float>());
  }
}

}  // namespace hpm::kernels
