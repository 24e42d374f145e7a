// Batch norm over x(N,C,S...) (S the product of the trailing dimensions, 1 for BatchNorm1d) and
// the deferred running statistics: norm.cpp's formulas. The per-channel sums (the training
// statistics, mean then the centred variance; the backward's sums of g and g (x - mean); the
// moments) run one block per channel, each thread over a fixed stride of the channel's N*S values
// and then the block's fixed tree, all in double: the same result run to run. The element-wise
// formulas are spelled with explicitly rounded operations where the CPU's (compiled without FMA)
// would otherwise differ from a contracted multiply-add.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/runtime.h"
#include "tensor/backend/cuda/vision_ops.h"

namespace hpm::cuda {

namespace {

constexpr int kBlock = 256;         // element-wise kernels
constexpr int kChannelBlock = 512;  // a channel's reduction

struct NCS {
  std::int64_t n, c, s;
};

// norm.cpp's ncs, with its message.
NCS ncs(const Shape& x) {
  if (x.rank() < 2) throw std::invalid_argument("batch_norm: expected (N,C,...), got " + x.str());
  return {x[0], x[1], x.numel_from(2)};
}

// An optional per-channel F32 tensor (weight, bias, running statistics): its pointer, or null
// when undefined. The CPU reads them unchecked; here a wrong size is an error, not a stray read.
const float* per_channel(const Tensor& t, std::int64_t c, const char* what) {
  if (!t.defined()) return nullptr;
  require_dtype(t, DType::F32);
  if (t.numel() != c) {
    throw std::invalid_argument(std::string("batch_norm: ") + what + " of " + t.shape().str() +
                                " for " + std::to_string(c) + " channels");
  }
  return ptr<float>(t);
}

// Calls f(offset) for this thread's share of channel ch's n*s values of a (N,C,S) tensor: values
// threadIdx.x, threadIdx.x + blockDim.x, ... of the channel in (n, s) order. The (n, s) position
// steps without a division per value.
template <typename F>
__device__ void for_channel(std::int64_t ch, std::int64_t n, std::int64_t c, std::int64_t s, F f) {
  const std::int64_t m = n * s, step = blockDim.x;
  if (m <= 0) return;
  const std::int64_t dn = step / s, ds = step - dn * s;
  std::int64_t i = static_cast<std::int64_t>(threadIdx.x) / s;
  std::int64_t k = static_cast<std::int64_t>(threadIdx.x) - i * s;
  for (std::int64_t j = threadIdx.x; j < m; j += step) {
    f((i * c + ch) * s + k);
    i += dn;
    k += ds;
    if (k >= s) {
      k -= s;
      ++i;
    }
  }
}

// Training statistics, one block per channel: mean, then the sum of squared deviations from it,
// in double; save_mean, save_invstd and (when given) the running statistics updated with the
// unbiased variance, in float as the CPU's.
__global__ void batch_norm_stats_kernel(const float* __restrict__ x, float* __restrict__ save_mean,
                                        float* __restrict__ save_invstd,
                                        float* __restrict__ running_mean,
                                        float* __restrict__ running_var, std::int64_t n,
                                        std::int64_t c, std::int64_t s, float momentum, float eps) {
  const std::int64_t m = n * s;
  for (std::int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double sum = 0.0;
    for_channel(ch, n, c, s, [&](std::int64_t at) { sum += x[at]; });
    const double mean = block_sum(sum) / static_cast<double>(m);
    double ss = 0.0;
    for_channel(ch, n, c, s, [&](std::int64_t at) {
      const double d = static_cast<double>(x[at]) - mean;
      ss += d * d;
    });
    ss = block_sum(ss);
    if (threadIdx.x != 0) continue;
    const double var = ss / static_cast<double>(m);
    save_mean[ch] = static_cast<float>(mean);
    save_invstd[ch] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
    if (running_mean != nullptr) {
      const float keep = 1.0f - momentum;
      running_mean[ch] = __fadd_rn(__fmul_rn(keep, running_mean[ch]),
                                   __fmul_rn(momentum, static_cast<float>(mean)));
      running_var[ch] =
          __fadd_rn(__fmul_rn(keep, running_var[ch]),
                    __fmul_rn(momentum, static_cast<float>(ss / static_cast<double>(m - 1))));
    }
  }
}

// Evaluation: the running statistics as the saved ones.
__global__ void batch_norm_eval_stats_kernel(const float* __restrict__ running_mean,
                                             const float* __restrict__ running_var,
                                             float* __restrict__ save_mean,
                                             float* __restrict__ save_invstd, std::int64_t c,
                                             float eps) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t ch = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; ch < c;
       ch += stride) {
    save_mean[ch] = running_mean[ch];
    save_invstd[ch] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(running_var[ch], eps)));
  }
}

// y = x * scale + shift with scale = invstd * w, shift = b - mean * scale, per channel.
__global__ void batch_norm_apply_kernel(const float* __restrict__ x, const float* __restrict__ mean,
                                        const float* __restrict__ invstd,
                                        const float* __restrict__ w, const float* __restrict__ b,
                                        float* __restrict__ y, std::int64_t total, std::int64_t c,
                                        std::int64_t s) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const std::int64_t ch = (e / s) % c;
    const float scale = __fmul_rn(invstd[ch], w != nullptr ? w[ch] : 1.0f);
    const float shift = __fsub_rn(b != nullptr ? b[ch] : 0.0f, __fmul_rn(mean[ch], scale));
    y[e] = __fadd_rn(__fmul_rn(x[e], scale), shift);
  }
}

// The backward's per-channel sums in double: sums[ch] = sum g, sums[c + ch] = sum g (x - mean)
// (x - mean in float, as the CPU's); grad_bias and grad_weight from them where asked for.
__global__ void batch_norm_backward_sums_kernel(
    const float* __restrict__ g, const float* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ invstd, double* __restrict__ sums, float* __restrict__ grad_weight,
    float* __restrict__ grad_bias, std::int64_t n, std::int64_t c, std::int64_t s) {
  for (std::int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const float mu = mean[ch];
    double a = 0.0, b = 0.0;
    for_channel(ch, n, c, s, [&](std::int64_t at) {
      a += g[at];
      b += static_cast<double>(g[at]) * static_cast<double>(__fsub_rn(x[at], mu));
    });
    a = block_sum(a);
    b = block_sum(b);
    if (threadIdx.x != 0) continue;
    sums[ch] = a;
    sums[c + ch] = b;
    if (grad_bias != nullptr) grad_bias[ch] = static_cast<float>(a);
    if (grad_weight != nullptr)
      grad_weight[ch] = static_cast<float>(__dmul_rn(b, static_cast<double>(invstd[ch])));
  }
}

// dx = w invstd (g - mean(g) - (x - mean) k), k = sum(g (x - mean)) invstd^2 / m, in training;
// w invstd g in evaluation. In double, as the CPU's.
__global__ void batch_norm_backward_dx_kernel(
    const float* __restrict__ g, const float* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ invstd, const float* __restrict__ w, const double* __restrict__ sums,
    float* __restrict__ dx, std::int64_t total, std::int64_t c, std::int64_t s, bool training) {
  const auto m = static_cast<double>(total / c);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const std::int64_t ch = (e / s) % c;
    const double wc = w != nullptr ? static_cast<double>(w[ch]) : 1.0;
    const auto is = static_cast<double>(invstd[ch]);
    const double mean_g = training ? __ddiv_rn(sums[ch], m) : 0.0;
    const double k = training ? __ddiv_rn(__dmul_rn(__dmul_rn(sums[c + ch], is), is), m) : 0.0;
    const auto d = static_cast<double>(__fsub_rn(x[e], mean[ch]));
    const double t = __dsub_rn(__dsub_rn(static_cast<double>(g[e]), mean_g), __dmul_rn(d, k));
    dx[e] = static_cast<float>(__dmul_rn(__dmul_rn(wc, is), t));
  }
}

// channel_moments_: sum[ch] += sum x, sum_squares[ch] += sum x^2, in double.
__global__ void channel_moments_kernel(const float* __restrict__ x, double* __restrict__ sum,
                                       double* __restrict__ sum_squares, std::int64_t n,
                                       std::int64_t c, std::int64_t s) {
  for (std::int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double a = 0.0, b = 0.0;
    for_channel(ch, n, c, s, [&](std::int64_t at) {
      const auto v = static_cast<double>(x[at]);
      a += v;
      b += v * v;
    });
    a = block_sum(a);
    b = block_sum(b);
    if (threadIdx.x != 0) continue;
    sum[ch] += a;
    sum_squares[ch] += b;
  }
}

// running_stats_update_: norm.cpp's formulas in double, rounded operation by operation as there.
__global__ void running_stats_update_kernel(float* __restrict__ mean, float* __restrict__ var,
                                            const double* __restrict__ sum,
                                            const double* __restrict__ sum_squares, std::int64_t c,
                                            double count, double momentum) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t ch = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; ch < c;
       ch += stride) {
    const double mu = __ddiv_rn(sum[ch], count);
    const double v =
        count > 1 ? __ddiv_rn(__dsub_rn(sum_squares[ch], __dmul_rn(__dmul_rn(count, mu), mu)),
                              __dsub_rn(count, 1.0))
                  : 0.0;
    const double keep = __dsub_rn(1.0, momentum);
    mean[ch] = static_cast<float>(
        __dadd_rn(__dmul_rn(keep, static_cast<double>(mean[ch])), __dmul_rn(momentum, mu)));
    var[ch] = static_cast<float>(
        __dadd_rn(__dmul_rn(keep, static_cast<double>(var[ch])), __dmul_rn(momentum, v)));
  }
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
  require_dtype(x, DType::F32);
  const float* pw = per_channel(weight, d.c, "weight");
  const float* pb = per_channel(bias, d.c, "bias");
  // Running statistics: both or neither in training (updated when given), both in evaluation.
  per_channel(running_mean, d.c, "running_mean");
  per_channel(running_var, d.c, "running_var");
  float* prm = running_mean.defined() ? ptr<float>(running_mean) : nullptr;
  float* prv = running_var.defined() ? ptr<float>(running_var) : nullptr;
  if ((prm == nullptr) != (prv == nullptr) || (!training && prm == nullptr)) {
    throw std::invalid_argument(std::string("batch_norm: ") +
                                (training ? "running_mean and running_var must both be given"
                                          : "evaluation needs running_mean and running_var"));
  }
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  if (d.c == 0) return y;
  cudaStream_t stream = current_stream();
  float* pm = ptr<float>(save_mean);
  float* pi = ptr<float>(save_invstd);
  if (training) {
    batch_norm_stats_kernel<<<grid_for(d.c), kChannelBlock, 0, stream>>>(
        ptr<float>(x), pm, pi, prm, prv, d.n, d.c, d.s, momentum, eps);
    HPM_CUDA_LAUNCH_CHECK("batch_norm_stats_kernel");
  } else {
    batch_norm_eval_stats_kernel<<<blocks_for(d.c, kBlock), kBlock, 0, stream>>>(prm, prv, pm, pi,
                                                                                 d.c, eps);
    HPM_CUDA_LAUNCH_CHECK("batch_norm_eval_stats_kernel");
  }
  const std::int64_t total = x.numel();
  if (total == 0) return y;
  batch_norm_apply_kernel<<<blocks_for(total, kBlock), kBlock, 0, stream>>>(
      ptr<float>(x), pm, pi, pw, pb, ptr<float>(y), total, d.c, d.s);
  HPM_CUDA_LAUNCH_CHECK("batch_norm_apply_kernel");
  return y;
}

void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, bool training,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) {
  const NCS d = ncs(x.shape());
  require_dtype(grad_y, DType::F32);
  require_dtype(x, DType::F32);
  // The CPU reads grad_y as x's shape; here a mismatch is an error rather than a stray read.
  check_shape(grad_y, x.shape(), "batch_norm backward: grad_y");
  const float* pm = per_channel(save_mean, d.c, "save_mean");
  const float* pi = per_channel(save_invstd, d.c, "save_invstd");
  if (pm == nullptr || pi == nullptr) {
    throw std::invalid_argument("batch_norm backward: save_mean and save_invstd must be given");
  }
  const float* pw = per_channel(weight, d.c, "weight");
  float* pgw = nullptr;
  float* pgb = nullptr;
  if (grad_bias != nullptr) {
    *grad_bias = Tensor::empty({d.c}, DType::F32, x.device());
    pgb = ptr<float>(*grad_bias);
  }
  if (grad_weight != nullptr) {
    *grad_weight = Tensor::empty({d.c}, DType::F32, x.device());
    pgw = ptr<float>(*grad_weight);
  }
  if (grad_x != nullptr) *grad_x = Tensor::empty(x.shape(), DType::F32, x.device());
  if (d.c == 0) return;
  cudaStream_t stream = current_stream();
  const float* pg = ptr<float>(grad_y);
  const float* px = ptr<float>(x);
  const bool need_sums = pgw != nullptr || pgb != nullptr || (grad_x != nullptr && training);
  Tensor sums = Tensor::empty({2 * d.c}, DType::F64, x.device());
  auto* ps = ptr<double>(sums);
  if (need_sums) {
    batch_norm_backward_sums_kernel<<<grid_for(d.c), kChannelBlock, 0, stream>>>(
        pg, px, pm, pi, ps, pgw, pgb, d.n, d.c, d.s);
    HPM_CUDA_LAUNCH_CHECK("batch_norm_backward_sums_kernel");
  }
  const std::int64_t total = x.numel();
  if (grad_x == nullptr || total == 0) return;
  batch_norm_backward_dx_kernel<<<blocks_for(total, kBlock), kBlock, 0, stream>>>(
      pg, px, pm, pi, pw, ps, ptr<float>(*grad_x), total, d.c, d.s, training);
  HPM_CUDA_LAUNCH_CHECK("batch_norm_backward_dx_kernel");
}

void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x) {
  const std::int64_t n = x.size(0), c = x.size(1),
                     inner = x.numel() / std::max<std::int64_t>(n * c, 1);
  if (sum.numel() != c || sum_squares.numel() != c) {
    throw std::invalid_argument("channel_moments_: accumulators of " + sum.shape().str() + " for " +
                                std::to_string(c) + " channels");
  }
  require_dtype(x, DType::F32);
  require_dtype(sum, DType::F64);
  require_dtype(sum_squares, DType::F64);
  if (c == 0) return;
  channel_moments_kernel<<<grid_for(c), kChannelBlock, 0, current_stream()>>>(
      ptr<float>(x), ptr<double>(sum), ptr<double>(sum_squares), n, c, inner);
  HPM_CUDA_LAUNCH_CHECK("channel_moments_kernel");
}

void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                           const Tensor& sum_squares, std::int64_t count, float momentum) {
  require_dtype(running_mean, DType::F32);
  require_dtype(running_var, DType::F32);
  require_dtype(sum, DType::F64);
  require_dtype(sum_squares, DType::F64);
  const std::int64_t c = running_mean.numel();
  // The CPU reads the others as running_mean's size; here a mismatch is an error.
  if (running_var.numel() != c || sum.numel() != c || sum_squares.numel() != c) {
    throw std::invalid_argument("running_stats_update_: running_var " + running_var.shape().str() +
                                ", sum " + sum.shape().str() + " and sum_squares " +
                                sum_squares.shape().str() + " for " + std::to_string(c) +
                                " channels");
  }
  if (c == 0) return;
  running_stats_update_kernel<<<blocks_for(c, kBlock), kBlock, 0, current_stream()>>>(
      ptr<float>(running_mean), ptr<float>(running_var), ptr<double>(sum), ptr<double>(sum_squares),
      c, static_cast<double>(count), static_cast<double>(momentum));
  HPM_CUDA_LAUNCH_CHECK("running_stats_update_kernel");
}

}  // namespace hpm::cuda
