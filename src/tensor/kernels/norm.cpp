// Batch and layer normalization, forward beside backward. Statistics accumulate in double so a
// large batch does not lose the variance to cancellation.
#include <cmath>
#include <stdexcept>

#include "hpm/tensor/kernels.h"

namespace hpm::kernels {

namespace {
struct NCS {
  std::int64_t n, c, s;
};
NCS ncs(const Shape& x) {
  if (x.rank() < 2) throw std::invalid_argument("batch_norm: expected (N,C,...), got " + x.str());
  return {x[0], x[1], x.numel_from(2)};
}
}  // namespace

Tensor batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          Tensor& running_mean, Tensor& running_var, bool training,
                          float momentum, float eps, Tensor& save_mean, Tensor& save_invstd) {
  const NCS d = ncs(x.shape());
  const std::int64_t m = d.n * d.s;
  if (training && m <= 1) {
    throw std::invalid_argument("batch_norm: training needs more than one value per channel, got " +
                                x.shape().str());
  }
  save_mean = Tensor::empty({d.c}, DType::F32, x.device());
  save_invstd = Tensor::empty({d.c}, DType::F32, x.device());
  const float* px = x.data<float>();
  float* pm = save_mean.data<float>();
  float* pi = save_invstd.data<float>();
  for (std::int64_t c = 0; c < d.c; ++c) {
    if (training) {
      double s = 0.0, ss = 0.0;
      for (std::int64_t n = 0; n < d.n; ++n) {
        const float* row = px + (n * d.c + c) * d.s;
        for (std::int64_t k = 0; k < d.s; ++k) s += row[k];
      }
      const double mean = s / static_cast<double>(m);
      for (std::int64_t n = 0; n < d.n; ++n) {
        const float* row = px + (n * d.c + c) * d.s;
        for (std::int64_t k = 0; k < d.s; ++k) ss += (row[k] - mean) * (row[k] - mean);
      }
      const double var = ss / static_cast<double>(m);
      pm[c] = static_cast<float>(mean);
      pi[c] = static_cast<float>(1.0 / std::sqrt(var + eps));
      if (running_mean.defined()) {
        float* rm = running_mean.data<float>();
        float* rv = running_var.data<float>();
        rm[c] = (1.0f - momentum) * rm[c] + momentum * static_cast<float>(mean);
        rv[c] = (1.0f - momentum) * rv[c] +
                momentum * static_cast<float>(ss / static_cast<double>(m - 1));
      }
    } else {
      pm[c] = running_mean.data<float>()[c];
      pi[c] = 1.0f / std::sqrt(running_var.data<float>()[c] + eps);
    }
  }
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  float* py = y.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t c = 0; c < d.c; ++c) {
      const float scale = pi[c] * (pw ? pw[c] : 1.0f);
      const float shift = (pb ? pb[c] : 0.0f) - pm[c] * scale;
      const float* src = px + (n * d.c + c) * d.s;
      float* dst = py + (n * d.c + c) * d.s;
      for (std::int64_t k = 0; k < d.s; ++k) dst[k] = src[k] * scale + shift;
    }
  return y;
}

void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, bool training,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) {
  const NCS d = ncs(x.shape());
  const auto m = static_cast<double>(d.n * d.s);
  const float* pg = grad_y.data<float>();
  const float* px = x.data<float>();
  const float* pm = save_mean.data<float>();
  const float* pi = save_invstd.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  std::vector<double> sum_g(static_cast<std::size_t>(d.c), 0.0), sum_gx(sum_g);
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t c = 0; c < d.c; ++c) {
      const float* g = pg + (n * d.c + c) * d.s;
      const float* xr = px + (n * d.c + c) * d.s;
      double a = 0.0, b = 0.0;
      for (std::int64_t k = 0; k < d.s; ++k) {
        a += g[k];
        b += static_cast<double>(g[k]) * (xr[k] - pm[c]);
      }
      sum_g[static_cast<std::size_t>(c)] += a;
      sum_gx[static_cast<std::size_t>(c)] += b;
    }
  if (grad_bias) {
    *grad_bias = Tensor::empty({d.c}, DType::F32, x.device());
    for (std::int64_t c = 0; c < d.c; ++c)
      grad_bias->data<float>()[c] = static_cast<float>(sum_g[static_cast<std::size_t>(c)]);
  }
  if (grad_weight) {
    *grad_weight = Tensor::empty({d.c}, DType::F32, x.device());
    for (std::int64_t c = 0; c < d.c; ++c)
      grad_weight->data<float>()[c] =
          static_cast<float>(sum_gx[static_cast<std::size_t>(c)] * pi[c]);
  }
  if (!grad_x) return;
  *grad_x = Tensor::empty(x.shape(), DType::F32, x.device());
  float* pd = grad_x->data<float>();
  for (std::int64_t c = 0; c < d.c; ++c) {
    const double w = pw ? pw[c] : 1.0;
    const double invstd = pi[c];
    // dx = w * invstd * (g - mean(g) - xhat * mean(g * xhat)) in training; w * invstd * g in eval.
    const double mean_g = training ? sum_g[static_cast<std::size_t>(c)] / m : 0.0;
    const double k = training ? sum_gx[static_cast<std::size_t>(c)] * invstd * invstd / m : 0.0;
    for (std::int64_t n = 0; n < d.n; ++n) {
      const float* g = pg + (n * d.c + c) * d.s;
      const float* xr = px + (n * d.c + c) * d.s;
      float* dst = pd + (n * d.c + c) * d.s;
      for (std::int64_t s = 0; s < d.s; ++s)
        dst[s] = static_cast<float>(w * invstd * (g[s] - mean_g - (xr[s] - pm[c]) * k));
    }
  }
}

Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                          const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd) {
  if (normalized <= 0 || x.numel() % normalized != 0) {
    throw std::invalid_argument("layer_norm: cannot normalize " + x.shape().str() + " over " +
                                std::to_string(normalized) + " trailing elements");
  }
  const std::int64_t rows = x.numel() / normalized;
  save_mean = Tensor::empty({rows}, DType::F32, x.device());
  save_rstd = Tensor::empty({rows}, DType::F32, x.device());
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  const float* px = x.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  float* py = y.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * normalized;
    double s = 0.0, ss = 0.0;
    for (std::int64_t k = 0; k < normalized; ++k) s += xr[k];
    const double mean = s / static_cast<double>(normalized);
    for (std::int64_t k = 0; k < normalized; ++k) ss += (xr[k] - mean) * (xr[k] - mean);
    const auto rstd = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(normalized) + eps));
    save_mean.data<float>()[r] = static_cast<float>(mean);
    save_rstd.data<float>()[r] = rstd;
    float* yr = py + r * normalized;
    for (std::int64_t k = 0; k < normalized; ++k) {
      const float xhat = (xr[k] - static_cast<float>(mean)) * rstd;
      yr[k] = xhat * (pw ? pw[k] : 1.0f) + (pb ? pb[k] : 0.0f);
    }
  }
  return y;
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                         const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) {
  const std::int64_t rows = x.numel() / normalized;
  const float* pg = grad_y.data<float>();
  const float* px = x.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  const float* pm = save_mean.data<float>();
  const float* pr = save_rstd.data<float>();
  if (grad_weight) *grad_weight = Tensor::zeros({normalized}, DType::F32, x.device());
  if (grad_bias) *grad_bias = Tensor::zeros({normalized}, DType::F32, x.device());
  if (grad_x) *grad_x = Tensor::empty(x.shape(), DType::F32, x.device());
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* g = pg + r * normalized;
    const float* xr = px + r * normalized;
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    for (std::int64_t k = 0; k < normalized; ++k) {
      const float xhat = (xr[k] - pm[r]) * pr[r];
      const float dxhat = g[k] * (pw ? pw[k] : 1.0f);
      sum_dxhat += dxhat;
      sum_dxhat_xhat += static_cast<double>(dxhat) * xhat;
      if (grad_weight) grad_weight->data<float>()[k] += g[k] * xhat;
      if (grad_bias) grad_bias->data<float>()[k] += g[k];
    }
    if (!grad_x) continue;
    float* dst = grad_x->data<float>() + r * normalized;
    const double inv_n = 1.0 / static_cast<double>(normalized);
    for (std::int64_t k = 0; k < normalized; ++k) {
      const double xhat = (xr[k] - pm[r]) * pr[r];
      const double dxhat = g[k] * (pw ? pw[k] : 1.0f);
      dst[k] = static_cast<float>(pr[r] * (dxhat - sum_dxhat * inv_n - xhat * sum_dxhat_xhat * inv_n));
    }
  }
}

}  // namespace hpm::kernels
