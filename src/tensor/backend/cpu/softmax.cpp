// Softmax, log-softmax and the fused cross-entropy of logits, along any dimension.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "f32_block.h"
#include "hpm/tensor/backend/cpu.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::cpu {

namespace {

struct Axis {
  std::int64_t outer, len, inner;
};

Axis split_axis(const Shape& s, int dim) {
  const int d = s.wrap(dim);
  return {s.numel_before(d), s[d], s.numel_from(d + 1)};
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
      if (mx == -std::numeric_limits<float>::infinity()) {
        // Every entry masked: no distribution to normalize. Zeros (log: -inf), not NaN, so a
        // padded row contributes nothing. Unless an entry is NaN (the max passes over it): then
        // NaN, as torch's, or a diverged score would vanish from the loss and its gradient.
        bool nan = false;
        for (std::int64_t l = 0; l < a.len; ++l) nan |= std::isnan(xr[l * a.inner]);
        const float masked = nan ? std::numeric_limits<float>::quiet_NaN() : kLog ? mx : 0.0f;
        for (std::int64_t l = 0; l < a.len; ++l) yr[l * a.inner] = masked;
        continue;
      }
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

// logits (..., C) and I64 labels (...); returns the number of rows (the product of "...").
std::int64_t check_labels(const Tensor& logits, const Tensor& labels, std::int64_t ignore_index) {
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
  const auto* y = labels.data<std::int64_t>();
  const std::int64_t c = logits.size(-1);
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    if (y[i] != ignore_index && (y[i] < 0 || y[i] >= c)) {
      throw std::out_of_range("cross_entropy: label " + std::to_string(y[i]) + " at row " +
                              std::to_string(i) + " is not a class index in [0, " +
                              std::to_string(c) + ")");
    }
  }
  return labels.numel();
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

namespace {

// The row loops of cross-entropy, vectorized (HPM_SIMD_CLONES, omp simd): a sum's order then
// follows the machine's vector width, a difference in the last bits of a double.

// The largest value of a row, NaNs passed over (-inf when there is none): a NaN in the row makes
// its sum of exponentials NaN below, and so its loss, whatever this says.
HPM_SIMD_CLONES float row_max(const float* x, std::int64_t c) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (std::int64_t j = 0; j < c; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// The first j with x[j] == value, c when there is none; 64 elements compared at a time.
HPM_SIMD_CLONES std::int64_t first_equal(const float* x, std::int64_t c, float value) {
  constexpr std::int64_t kChunk = 64;
  std::int64_t j = 0;
  for (; j + kChunk <= c; j += kChunk) {
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (std::int64_t k = 0; k < kChunk; ++k) hit |= x[j + k] == value ? 1 : 0;
    if (hit != 0) break;
  }
  for (; j < c; ++j)
    if (x[j] == value) return j;
  return c;
}

// Sums of a row's terms: float sums of blocks of kSumBlock (so that the loops vectorize: GCC
// leaves a float-to-double reduction scalar), added in double.
constexpr std::int64_t kSumBlock = 256;

// sum_j e^(x[j] - shift).
HPM_SIMD_CLONES double exp_sum(const float* x, std::int64_t c, float shift) {
  double sum = 0.0;
  for (std::int64_t j0 = 0; j0 < c; j0 += kSumBlock) {
    const std::int64_t end = std::min(c, j0 + kSumBlock);
    float block = 0.0f;
#pragma omp simd reduction(+ : block)
    for (std::int64_t j = j0; j < end; ++j) block += vec::exp(x[j] - shift);
    sum += block;
  }
  return sum;
}

// sum_j x[j].
HPM_SIMD_CLONES double row_sum(const float* x, std::int64_t c) {
  double sum = 0.0;
  for (std::int64_t j0 = 0; j0 < c; j0 += kSumBlock) {
    const std::int64_t end = std::min(c, j0 + kSumBlock);
    float block = 0.0f;
#pragma omp simd reduction(+ : block)
    for (std::int64_t j = j0; j < end; ++j) block += x[j];
    sum += block;
  }
  return sum;
}

// g[j] = (e^(x[j] - mx) * inv - smooth) * scale: softmax as the forward's row had it (its max and
// 1 / sum), less the smoothing's share. g may be x.
HPM_SIMD_CLONES void softmax_gradient_row(const float* x, float* g, std::int64_t c, float mx,
                                          float inv, float smooth, float scale) {
#pragma omp simd
  for (std::int64_t j = 0; j < c; ++j) g[j] = (vec::exp(x[j] - mx) * inv - smooth) * scale;
}

// Rows a thread takes at a time: enough logits to pay for waking the other threads.
std::int64_t row_grain(std::int64_t c) {
  return std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(c, 1));
}

// Row i's forward: its max and 1 / sum(exp(x - max)) into st, its argmax_last into *pred (when
// given), and its loss term (0 for an ignored row):
//   (1 - eps) * (lse - x[y]) + eps * (lse - mean_c(x))
double cross_entropy_row(const float* row, std::int64_t c, std::int64_t y,
                         std::int64_t ignore_index, float label_smoothing, float* st,
                         std::int64_t* pred) {
  const float mx = row_max(row, c);
  if (pred != nullptr) {
    // argmax_last's choice: the first largest value, unless the first is NaN (which no
    // comparison beats there).
    const std::int64_t best = c == 0 || std::isnan(row[0]) ? 0 : first_equal(row, c, mx);
    *pred = best == c ? 0 : best;
  }
  const double sum = exp_sum(row, c, mx);
  const double lse = mx + std::log(sum);
  st[0] = mx;
  st[1] = static_cast<float>(1.0 / sum);
  if (y == ignore_index) return 0.0;
  const double nll = lse - row[y];
  // Without smoothing the mean term is left out, not multiplied by 0: a -inf logit (a masked
  // class) makes it infinite, and 0 * inf would be NaN.
  return label_smoothing != 0.0f
             ? (1.0 - label_smoothing) * nll +
                   label_smoothing * (lse - row_sum(row, c) / static_cast<double>(c))
             : nll;
}

// The mean of the row terms over the rows not ignored (NaN when none is, as PyTorch), summed in
// row order.
float mean_of_counted(const std::vector<double>& row_loss, const std::int64_t* y, std::int64_t n,
                      std::int64_t ignore_index) {
  double total = 0.0;
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (y[i] == ignore_index) continue;
    ++counted;
    total += row_loss[static_cast<std::size_t>(i)];
  }
  return static_cast<float>(total / static_cast<double>(counted));
}

// Row i's gradient into g (c floats; it may be x): softmax from the row's stats less the smoothed
// one-hot, times scale; zeros on an ignored row.
void cross_entropy_gradient_row(const float* x, float* g, std::int64_t c, std::int64_t y,
                                std::int64_t ignore_index, const float* st, float label_smoothing,
                                float scale) {
  if (y == ignore_index) {
    std::fill(g, g + c, 0.0f);
    return;
  }
  softmax_gradient_row(x, g, c, st[0], st[1], label_smoothing / static_cast<float>(c), scale);
  g[y] -= (1.0f - label_smoothing) * scale;
}

std::int64_t count_counted(const std::int64_t* y, std::int64_t n, std::int64_t ignore_index) {
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < n; ++i) counted += y[i] != ignore_index;
  return counted;
}

}  // namespace

// loss_i = (1 - eps) * -log p[i, y_i] + eps * mean_c(-log p[i, c]), averaged over the rows i
// whose label is not ignore_index (NaN when every row is ignored, as PyTorch). Rows in parallel,
// their losses summed in row order.
float cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                            Tensor& stats, std::int64_t ignore_index, Tensor* predicted) {
  const std::int64_t n = check_labels(logits, labels, ignore_index), c = logits.size(-1);
  stats = Tensor::empty(Shape{n, 2}, DType::F32, logits.device());
  std::int64_t* pred = nullptr;
  if (predicted != nullptr) {
    *predicted = Tensor::empty(labels.shape(), DType::I64, logits.device());
    pred = predicted->data<std::int64_t>();
  }
  float* ps = stats.data<float>();
  const auto* y = labels.data<std::int64_t>();
  std::vector<double> row_loss(static_cast<std::size_t>(n), 0.0);
  parallel_for(n, row_grain(c), [&](std::int64_t first, std::int64_t last) {
    std::vector<float> widened(logits.dtype() == DType::BF16 ? static_cast<std::size_t>(c) : 0);
    for (std::int64_t i = first; i < last; ++i) {
      const float* row = f32_block(logits, i * c, c, widened.data());
      row_loss[static_cast<std::size_t>(i)] = cross_entropy_row(
          row, c, y[i], ignore_index, label_smoothing, ps + 2 * i, pred ? pred + i : nullptr);
    }
  });
  return mean_of_counted(row_loss, y, n, ignore_index);
}

// Each row's forward, then its gradient (for an upstream 1) over it while the row is at hand.
float cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels, float label_smoothing,
                                   std::int64_t ignore_index, Tensor* predicted) {
  const std::int64_t n = check_labels(logits, labels, ignore_index), c = logits.size(-1);
  std::int64_t* pred = nullptr;
  if (predicted != nullptr) {
    *predicted = Tensor::empty(labels.shape(), DType::I64, logits.device());
    pred = predicted->data<std::int64_t>();
  }
  const auto* y = labels.data<std::int64_t>();
  // cross_entropy_backward's scale for a gradient of 1: the same bits.
  const float scale = 1.0f / static_cast<float>(count_counted(y, n, ignore_index));
  const bool bf16 = logits.dtype() == DType::BF16;
  std::vector<double> row_loss(static_cast<std::size_t>(n), 0.0);
  parallel_for(n, row_grain(c), [&](std::int64_t first, std::int64_t last) {
    // A BF16 row is widened whole before its gradient is rounded back over it.
    std::vector<float> widened(bf16 ? static_cast<std::size_t>(c) : 0);
    for (std::int64_t i = first; i < last; ++i) {
      const float* row = f32_block(logits, i * c, c, widened.data());
      float st[2];
      row_loss[static_cast<std::size_t>(i)] = cross_entropy_row(
          row, c, y[i], ignore_index, label_smoothing, st, pred ? pred + i : nullptr);
      float* g = bf16 ? widened.data() : logits.data<float>() + i * c;
      cross_entropy_gradient_row(row, g, c, y[i], ignore_index, st, label_smoothing, scale);
      if (bf16) f32_to_bf16(g, logits.data<std::uint16_t>() + i * c, c);
    }
  });
  return mean_of_counted(row_loss, y, n, ignore_index);
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                              float label_smoothing, float grad, std::int64_t ignore_index,
                              bool overwrite_logits, DType out) {
  const std::int64_t n = labels.numel(), c = logits.size(-1);
  // In place, each row is read (a BF16 one widened whole) before it is written.
  Tensor gx = overwrite_logits && logits.dtype() == out
                  ? logits
                  : Tensor::empty(logits.shape(), out, logits.device());
  const float* ps = stats.data<float>();
  const auto* y = labels.data<std::int64_t>();
  const float scale = grad / static_cast<float>(count_counted(y, n, ignore_index));
  parallel_for(n, row_grain(c), [&](std::int64_t first, std::int64_t last) {
    std::vector<float> widened(logits.dtype() == DType::BF16 ? static_cast<std::size_t>(c) : 0);
    // A BF16 gradient row is computed in f32, then rounded as it is stored.
    std::vector<float> row_f32(out == DType::BF16 ? static_cast<std::size_t>(c) : 0);
    for (std::int64_t i = first; i < last; ++i) {
      const float* px = f32_block(logits, i * c, c, widened.data());
      float* pg = out == DType::BF16 ? row_f32.data() : gx.data<float>() + i * c;
      cross_entropy_gradient_row(px, pg, c, y[i], ignore_index, ps + 2 * i, label_smoothing, scale);
      if (out == DType::BF16) f32_to_bf16(pg, gx.data<std::uint16_t>() + i * c, c);
    }
  });
  return gx;
}

// ---- nll and KL divergence (host loops in double, as the losses were written first) ------------

float nll_loss_forward(const Tensor& log_probs, const Tensor& labels) {
  if (log_probs.dim() != 2 || labels.dim() != 1 || labels.size(0) != log_probs.size(0)) {
    throw std::invalid_argument("nll_loss: expected (N,C) and (N), got " + log_probs.shape().str() +
                                " and " + labels.shape().str());
  }
  const std::int64_t n = log_probs.size(0), c = log_probs.size(1);
  const float* lp = log_probs.data<float>();
  const auto* y = labels.data<std::int64_t>();
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (y[i] < 0 || y[i] >= c) {
      throw std::out_of_range("nll_loss: label " + std::to_string(y[i]) + " at row " +
                              std::to_string(i) + " out of range [0, " + std::to_string(c) + ")");
    }
    total -= lp[i * c + y[i]];
  }
  return static_cast<float>(total / static_cast<double>(n));
}

Tensor nll_loss_backward(float grad, const Tensor& labels, const Shape& shape) {
  Tensor gx = Tensor::zeros(shape);
  const float v = -grad / static_cast<float>(shape[0]);
  const auto* y = labels.data<std::int64_t>();
  float* g = gx.data<float>();
  for (std::int64_t i = 0; i < shape[0]; ++i) g[i * shape[1] + y[i]] = v;
  return gx;
}

namespace {
float batch_of(const Tensor& x) { return static_cast<float>(x.dim() > 0 ? x.size(0) : 1); }
}  // namespace

float kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs) {
  check_shape(target_probs, input_log_probs.shape(), "kl_div: target");
  const float* x = input_log_probs.data<float>();
  const float* t = target_probs.data<float>();
  double total = 0.0;
  // torch's xlogy: a 0 target adds 0; a NaN (or negative) one makes the loss NaN, as torch's,
  // where `t > 0` skipped it (a diverged teacher's row taught nothing, without a word).
  for (std::int64_t i = 0; i < input_log_probs.numel(); ++i)
    if (t[i] != 0.0f) total += t[i] * (std::log(static_cast<double>(t[i])) - x[i]);
  return static_cast<float>(total / batch_of(input_log_probs));
}

void kl_div_backward(float grad, const Tensor& input_log_probs, const Tensor& target_probs,
                     Tensor* grad_input, Tensor* grad_target) {
  const float scale = grad / batch_of(input_log_probs);
  if (grad_input != nullptr) *grad_input = mul_scalar(target_probs, -scale);
  if (grad_target != nullptr) {
    // d/dt [t (log t - x)] = log t + 1 - x
    Tensor gt = Tensor::empty(target_probs.shape());
    const float* tp = target_probs.data<float>();
    const float* xp = input_log_probs.data<float>();
    float* g = gt.data<float>();
    for (std::int64_t i = 0; i < gt.numel(); ++i)
      g[i] = tp[i] != 0.0f ? scale * (std::log(tp[i]) + 1.0f - xp[i]) : 0.0f;
    *grad_target = gt;
  }
}

}  // namespace hpm::cpu
