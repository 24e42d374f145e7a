// Softmax, log-softmax and the fused cross-entropy of logits, along any dimension.
#include <cmath>
#include <limits>
#include <stdexcept>

#include "hpm/tensor/kernels.h"

namespace hpm::kernels {

namespace {

struct Axis {
  std::int64_t outer, len, inner;
};

Axis split_axis(const Shape& s, int dim) {
  const int d = s.wrap(dim);
  return {s.numel() / s.numel_from(d), s[d], s.numel_from(d + 1)};
}

// y = softmax or log-softmax of x along the axis, numerically stable (max subtracted).
template <bool kLog>
Tensor softmax_impl(const Tensor& x, int dim) {
  const Axis a = split_axis(x.shape(), dim);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (std::int64_t o = 0; o < a.outer; ++o)
    for (std::int64_t i = 0; i < a.inner; ++i) {
      const float* xr = px + o * a.len * a.inner + i;
      float* yr = py + o * a.len * a.inner + i;
      float mx = -std::numeric_limits<float>::infinity();
      for (std::int64_t l = 0; l < a.len; ++l) mx = std::max(mx, xr[l * a.inner]);
      double sum = 0.0;
      for (std::int64_t l = 0; l < a.len; ++l) sum += std::exp(xr[l * a.inner] - mx);
      if constexpr (kLog) {
        const float lse = mx + static_cast<float>(std::log(sum));
        for (std::int64_t l = 0; l < a.len; ++l) yr[l * a.inner] = xr[l * a.inner] - lse;
      } else {
        const float inv = static_cast<float>(1.0 / sum);
        for (std::int64_t l = 0; l < a.len; ++l)
          yr[l * a.inner] = std::exp(xr[l * a.inner] - mx) * inv;
      }
    }
  return y;
}

void check_labels(const Tensor& logits, const Tensor& labels) {
  if (logits.dim() != 2 || labels.dim() != 1 || labels.size(0) != logits.size(0) ||
      labels.dtype() != DType::I64) {
    throw std::invalid_argument("cross_entropy: expected logits (N, C) and I64 labels (N), got " +
                                logits.shape().str() + " and " + labels.shape().str());
  }
  const auto* y = labels.data<std::int64_t>();
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    if (y[i] < 0 || y[i] >= logits.size(1)) {
      throw std::out_of_range("cross_entropy: label " + std::to_string(y[i]) + " at row " +
                              std::to_string(i) + " is not a class index in [0, " +
                              std::to_string(logits.size(1)) + ")");
    }
  }
}

}  // namespace

Tensor softmax(const Tensor& x, int dim) { return softmax_impl<false>(x, dim); }
Tensor log_softmax(const Tensor& x, int dim) { return softmax_impl<true>(x, dim); }

// dx = y * (g - sum(g * y))
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) {
  const Axis a = split_axis(y.shape(), dim);
  Tensor gx = Tensor::empty(y.shape(), DType::F32, y.device());
  const float* pg = grad_y.data<float>();
  const float* py = y.data<float>();
  float* px = gx.data<float>();
  for (std::int64_t o = 0; o < a.outer; ++o)
    for (std::int64_t i = 0; i < a.inner; ++i) {
      const std::int64_t base = o * a.len * a.inner + i;
      double dot = 0.0;
      for (std::int64_t l = 0; l < a.len; ++l)
        dot += static_cast<double>(pg[base + l * a.inner]) * py[base + l * a.inner];
      for (std::int64_t l = 0; l < a.len; ++l) {
        const std::int64_t k = base + l * a.inner;
        px[k] = py[k] * (pg[k] - static_cast<float>(dot));
      }
    }
  return gx;
}

// dx = g - exp(y) * sum(g)
Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) {
  const Axis a = split_axis(y.shape(), dim);
  Tensor gx = Tensor::empty(y.shape(), DType::F32, y.device());
  const float* pg = grad_y.data<float>();
  const float* py = y.data<float>();
  float* px = gx.data<float>();
  for (std::int64_t o = 0; o < a.outer; ++o)
    for (std::int64_t i = 0; i < a.inner; ++i) {
      const std::int64_t base = o * a.len * a.inner + i;
      double sum = 0.0;
      for (std::int64_t l = 0; l < a.len; ++l) sum += pg[base + l * a.inner];
      for (std::int64_t l = 0; l < a.len; ++l) {
        const std::int64_t k = base + l * a.inner;
        px[k] = pg[k] - std::exp(py[k]) * static_cast<float>(sum);
      }
    }
  return gx;
}

// loss_i = (1 - eps) * -log p[i, y_i] + eps * mean_c(-log p[i, c]), averaged over i.
float cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                            Tensor& probs) {
  check_labels(logits, labels);
  const std::int64_t n = logits.size(0), c = logits.size(1);
  probs = Tensor::empty(logits.shape(), DType::F32, logits.device());
  const float* px = logits.data<float>();
  float* pp = probs.data<float>();
  const auto* y = labels.data<std::int64_t>();
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = px + i * c;
    float* prow = pp + i * c;
    float mx = row[0];
    for (std::int64_t j = 1; j < c; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (std::int64_t j = 0; j < c; ++j) {
      const float e = std::exp(row[j] - mx);
      prow[j] = e;
      sum += e;
    }
    const double lse = mx + std::log(sum);
    const auto inv = static_cast<float>(1.0 / sum);
    double mean_nll = 0.0;
    for (std::int64_t j = 0; j < c; ++j) {
      prow[j] *= inv;
      mean_nll += lse - row[j];
    }
    const double nll = lse - row[y[i]];
    total += (1.0 - label_smoothing) * nll + label_smoothing * mean_nll / static_cast<double>(c);
  }
  return static_cast<float>(total / static_cast<double>(n));
}

Tensor cross_entropy_backward(const Tensor& probs, const Tensor& labels, float label_smoothing,
                              float grad) {
  const std::int64_t n = probs.size(0), c = probs.size(1);
  Tensor gx = Tensor::empty(probs.shape(), DType::F32, probs.device());
  const float* pp = probs.data<float>();
  const auto* y = labels.data<std::int64_t>();
  float* pg = gx.data<float>();
  const float scale = grad / static_cast<float>(n);
  const float smooth = label_smoothing / static_cast<float>(c);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < c; ++j) pg[i * c + j] = (pp[i * c + j] - smooth) * scale;
    pg[i * c + y[i]] -= (1.0f - label_smoothing) * scale;
  }
  return gx;
}

}  // namespace hpm::kernels
