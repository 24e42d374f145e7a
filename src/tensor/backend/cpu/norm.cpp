// Batch and layer normalization, forward beside backward. Statistics accumulate in double so a
// large batch does not lose the variance to cancellation.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "f32_block.h"
#include "hpm/tensor/backend/cpu.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::cpu {

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
                          Tensor& running_mean, Tensor& running_var, bool training, float momentum,
                          float eps, Tensor& save_mean, Tensor& save_invstd) {
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

namespace {

// Layer norm rows [r0, r1) of width n: two passes (mean, then the centred variance, which does
// not cancel), summed in double lanes (the ten Adam steps of the golden test showed float sums'
// rounding in the biases; layer norm was 1.9% of a GPT step after this change), vectorized across
// the row.
HPM_SIMD_CLONES void layer_norm_rows(const float* x, const float* w, const float* b, float* y,
                                     float* mean, float* rstd, std::int64_t r0, std::int64_t r1,
                                     std::int64_t n, float eps) {
  const double inv_n = 1.0 / static_cast<double>(n);
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (std::int64_t k = 0; k < n; ++k) s += xr[k];
    const double mu = s * inv_n;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (std::int64_t k = 0; k < n; ++k) ss += (xr[k] - mu) * (xr[k] - mu);
    const auto m = static_cast<float>(mu);
    const auto rs = static_cast<float>(1.0 / std::sqrt(ss * inv_n + eps));
    mean[r] = m;
    rstd[r] = rs;
    if (w != nullptr && b != nullptr) {
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k) yr[k] = (xr[k] - m) * rs * w[k] + b[k];
    } else {
#pragma omp simd
      for (std::int64_t k = 0; k < n; ++k)
        yr[k] = (xr[k] - m) * rs * (w ? w[k] : 1.0f) + (b ? b[k] : 0.0f);
    }
  }
}

// Backward of rows [r0, r1): dx (if dx; added into it through `row`, n floats, when row is not
// null), and dw, db accumulated into this span's own sums.
HPM_SIMD_CLONES void layer_norm_backward_rows(const float* g, const float* x, const float* w,
                                              const float* mean, const float* rstd, float* dx,
                                              float* row, double* dw, double* db, std::int64_t r0,
                                              std::int64_t r1, std::int64_t n) {
  const double inv_n = 1.0 / static_cast<double>(n);
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* gr = g + r * n;
    const float* xr = x + r * n;
    const float mu = mean[r], rs = rstd[r];
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
#pragma omp simd reduction(+ : sum_dxhat, sum_dxhat_xhat)
    for (std::int64_t k = 0; k < n; ++k) {
      const float xhat = (xr[k] - mu) * rs;
      const float dxhat = gr[k] * (w ? w[k] : 1.0f);
      sum_dxhat += dxhat;
      sum_dxhat_xhat += static_cast<double>(dxhat) * xhat;
      dw[k] += static_cast<double>(gr[k]) * xhat;
      db[k] += gr[k];
    }
    if (dx == nullptr) continue;
    float* dr = dx + r * n;
    float* out = row != nullptr ? row : dr;
    const auto a = static_cast<float>(sum_dxhat * inv_n);
    const auto c = static_cast<float>(sum_dxhat_xhat * inv_n);
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) {
      const float xhat = (xr[k] - mu) * rs;
      out[k] = rs * (gr[k] * (w ? w[k] : 1.0f) - a - xhat * c);
    }
    if (row == nullptr) continue;
      // Added from memory, in a loop of its own: no multiply-add contracted across, so the sum is
      // the one the engine's addition of a separate dx would make, bit for bit.
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) dr[k] += row[k];
  }
}

// Rows a kernel thread takes at once: enough elements to pay for waking it.
std::int64_t row_grain(std::int64_t n) { return std::max<std::int64_t>(1, kElementwiseGrain / n); }

// What every layer norm forward begins with: x's rows of `normalized` elements, checked, and
// their statistics' tensors made.
std::int64_t normalized_rows(const Tensor& x, std::int64_t normalized, Tensor& save_mean,
                             Tensor& save_rstd) {
  if (normalized <= 0 || x.numel() % normalized != 0) {
    throw std::invalid_argument("layer_norm: cannot normalize " + x.shape().str() + " over " +
                                std::to_string(normalized) + " trailing elements");
  }
  const std::int64_t rows = x.numel() / normalized;
  save_mean = Tensor::empty({rows}, DType::F32, x.device());
  save_rstd = Tensor::empty({rows}, DType::F32, x.device());
  return rows;
}

}  // namespace

Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                          const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd) {
  const std::int64_t rows = normalized_rows(x, normalized, save_mean, save_rstd);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  const float* px = x.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  float* py = y.data<float>();
  float* pm = save_mean.data<float>();
  float* pr = save_rstd.data<float>();
  parallel_for(rows, row_grain(normalized), [&](std::int64_t r0, std::int64_t r1) {
    layer_norm_rows(px, pw, pb, py, pm, pr, r0, r1, normalized, eps);
  });
  return y;
}

namespace {

// layer_norm_forward_bf16 of x, or (b defined) of x + b written into *sum as it goes.
Tensor layer_norm_bf16_rows(const Tensor& x, const Tensor& b, Tensor* sum, std::int64_t normalized,
                            const Tensor& weight, const Tensor& bias, float eps, Tensor& save_mean,
                            Tensor& save_rstd, Tensor* x_bf16) {
  const std::int64_t rows = normalized_rows(x, normalized, save_mean, save_rstd);
  Tensor y = Tensor::empty(x.shape(), DType::BF16, x.device());
  if (x_bf16 != nullptr) *x_bf16 = Tensor::empty(x.shape(), DType::BF16, x.device());
  const float* px = x.data<float>();
  const float* padd = b.defined() ? b.data<float>() : nullptr;
  float* psum = nullptr;
  if (padd != nullptr) {
    *sum = Tensor::empty(x.shape(), DType::F32, x.device());
    psum = sum->data<float>();
  }
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  auto* py = y.data<std::uint16_t>();
  std::uint16_t* pxb = x_bf16 != nullptr ? x_bf16->data<std::uint16_t>() : nullptr;
  float* pm = save_mean.data<float>();
  float* pr = save_rstd.data<float>();
  // Rows normalized a few at a time into a cache-sized f32 block, then rounded: the f32 output
  // never exists whole (its bytes are neither written nor counted at the step's peak).
  const std::int64_t block = std::max<std::int64_t>(1, 4096 / normalized);
  parallel_for(rows, row_grain(normalized), [&](std::int64_t r0, std::int64_t r1) {
    std::vector<float> out(static_cast<std::size_t>(std::min(block, r1 - r0) * normalized));
    for (std::int64_t r = r0; r < r1; r += block) {
      const std::int64_t len = std::min(block, r1 - r), at = r * normalized;
      const float* in = px + at;
      if (padd != nullptr) {
#pragma omp simd
        for (std::int64_t k = 0; k < len * normalized; ++k)
          psum[at + k] = px[at + k] + padd[at + k];
        in = psum + at;
      }
      layer_norm_rows(in, pw, pb, out.data(), pm + r, pr + r, 0, len, normalized, eps);
      f32_to_bf16(out.data(), py + at, len * normalized);
      if (pxb != nullptr) f32_to_bf16(in, pxb + at, len * normalized);
    }
  });
  return y;
}

}  // namespace

Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                               const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd,
                               Tensor* x_bf16) {
  return layer_norm_bf16_rows(x, Tensor(), nullptr, normalized, weight, bias, eps, save_mean,
                              save_rstd, x_bf16);
}

Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b, std::int64_t normalized,
                                   const Tensor& weight, const Tensor& bias, float eps, Tensor& sum,
                                   Tensor& save_mean, Tensor& save_rstd, Tensor* sum_bf16) {
  return layer_norm_bf16_rows(a, b, &sum, normalized, weight, bias, eps, save_mean, save_rstd,
                              sum_bf16);
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                         const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                         Tensor* grad_x_bf16) {
  const std::int64_t rows = x.numel() / normalized;
  // A bf16 copy kept for backward, and a bf16 gradient (a bf16 product's input gradient), are
  // widened span by span into cache-sized blocks (f32_block; exactly: the values are those of
  // to_f32, without its f32 tensor).
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  const float* pm = save_mean.data<float>();
  const float* pr = save_rstd.data<float>();
  float* pdx = nullptr;
  const bool accumulate = grad_x != nullptr && grad_x->defined();
  if (grad_x) {
    if (!accumulate) *grad_x = Tensor::empty(x.shape(), DType::F32, x.device());
    pdx = grad_x->data<float>();
  }
  std::uint16_t* pdxb = nullptr;
  if (grad_x_bf16 != nullptr && pdx != nullptr) {
    *grad_x_bf16 = Tensor::empty(x.shape(), DType::BF16, x.device());
    pdxb = grad_x_bf16->data<std::uint16_t>();
  }
  // Spans of a fixed number of rows each sum dw and db into their own slot, and the slots are
  // added in span order: the result does not depend on the thread count or on which thread
  // finished first, so a replica on one kernel thread computes what one on two does.
  const std::int64_t chunk = std::max<std::int64_t>(16, row_grain(normalized));
  const std::int64_t spans = (rows + chunk - 1) / chunk;
  std::vector<double> sums(static_cast<std::size_t>(2 * spans * normalized), 0.0);
  parallel_for(spans, 1, [&](std::int64_t s0, std::int64_t s1) {
    // The thread's own blocks, kept from call to call: a block of 128 KiB or more would be
    // mapped and zeroed afresh by each call's allocation (glibc's mmap threshold), which cost more
    // than the widening itself (a 768 x 128 GPT's norm: 66 us a call for an f32 gradient, 126 for
    // a bf16 one with a fresh block).
    thread_local std::vector<float> blocks;
    const auto block = static_cast<std::size_t>(chunk * normalized);
    if (blocks.size() < 2 * block + static_cast<std::size_t>(normalized)) {
      blocks.resize(2 * block + static_cast<std::size_t>(normalized));
    }
    float* const widened = blocks.data();
    float* const widened_g = widened + block;
    float* const row = widened_g + block;
    for (std::int64_t s = s0; s < s1; ++s) {
      double* dw = sums.data() + 2 * s * normalized;
      const std::int64_t r0 = s * chunk, len = std::min(rows, r0 + chunk) - r0,
                         at = r0 * normalized;
      const float* xs = f32_block(x, at, len * normalized, widened);
      const float* gs = f32_block(grad_y, at, len * normalized, widened_g);
      layer_norm_backward_rows(gs, xs, pw, pm + r0, pr + r0, pdx ? pdx + at : nullptr,
                               accumulate ? row : nullptr, dw, dw + normalized, 0, len, normalized);
      if (pdxb != nullptr) f32_to_bf16(pdx + at, pdxb + at, len * normalized);  // still in cache
    }
  });
  for (std::int64_t s = 1; s < spans; ++s)
    for (std::int64_t k = 0; k < 2 * normalized; ++k) sums[k] += sums[2 * s * normalized + k];
  if (grad_weight) {
    *grad_weight = Tensor::empty({normalized}, DType::F32, x.device());
    float* pdw = grad_weight->data<float>();
    for (std::int64_t k = 0; k < normalized; ++k) pdw[k] = static_cast<float>(sums[k]);
  }
  if (grad_bias) {
    *grad_bias = Tensor::empty({normalized}, DType::F32, x.device());
    float* pdb = grad_bias->data<float>();
    for (std::int64_t k = 0; k < normalized; ++k) pdb[k] = static_cast<float>(sums[normalized + k]);
  }
}

// ---- deferred running statistics ----------------------------------------------------------------

void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x) {
  const std::int64_t n = x.size(0), c = x.size(1),
                     inner = x.numel() / std::max<std::int64_t>(n * c, 1);
  if (sum.numel() != c || sum_squares.numel() != c) {
    throw std::invalid_argument("channel_moments_: accumulators of " + sum.shape().str() + " for " +
                                std::to_string(c) + " channels");
  }
  const float* p = x.data<float>();
  double* s = sum.data<double>();
  double* q = sum_squares.data<double>();
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t ch = 0; ch < c; ++ch) {
      double a = 0, b = 0;
      for (std::int64_t k = 0; k < inner; ++k, ++p) {
        a += *p;
        b += static_cast<double>(*p) * *p;
      }
      s[ch] += a;
      q[ch] += b;
    }
  }
}

void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                           const Tensor& sum_squares, std::int64_t count, float momentum) {
  float* mean = running_mean.data<float>();
  float* var = running_var.data<float>();
  const double* s = sum.data<double>();
  const double* q = sum_squares.data<double>();
  const double m = momentum, n = static_cast<double>(count);
  for (std::int64_t ch = 0; ch < running_mean.numel(); ++ch) {
    const double mu = s[ch] / n;
    // Unbiased, as the running variance of an undeferred forward is.
    const double v = n > 1 ? (q[ch] - n * mu * mu) / (n - 1) : 0.0;
    mean[ch] = static_cast<float>((1 - m) * mean[ch] + m * mu);
    var[ch] = static_cast<float>((1 - m) * var[ch] + m * v);
  }
}

}  // namespace hpm::cpu
