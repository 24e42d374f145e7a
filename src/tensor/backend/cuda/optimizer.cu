// Optimizer updates (Adam(W), SGD): element-wise over a parameter and its state, in place. The
// formulas and their order are optimizer_updates.cpp's; the products and sums use the _rn
// intrinsics so that nvcc does not contract them into FMAs, keeping the CPU's roundings.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

// Element k's update from its gradient gk: p = w - step * m / (sqrt(v or vmax) / bias2_sqrt +
// eps), w = p * decay, d = g + l2 * w.
__device__ __forceinline__ void adam_update(const kernels::AdamStep& s, float* __restrict__ p,
                                            float gk, float* __restrict__ m, float* __restrict__ v,
                                            float* __restrict__ vmax, std::int64_t k) {
  const float w = __fmul_rn(p[k], s.decay);
  const float d = __fadd_rn(gk, __fmul_rn(s.l2, w));
  const float mk = __fadd_rn(__fmul_rn(m[k], s.beta1), __fmul_rn(1.0f - s.beta1, d));
  const float vk = __fadd_rn(__fmul_rn(v[k], s.beta2), __fmul_rn(__fmul_rn(1.0f - s.beta2, d), d));
  m[k] = mk;
  v[k] = vk;
  float denom_v = vk;
  if (vmax != nullptr) {
    const float vm = vmax[k] > vk ? vmax[k] : vk;  // the CPU's select (a NaN v is kept)
    vmax[k] = vm;
    denom_v = vm;
  }
  const float denom = __fadd_rn(__fdiv_rn(sqrtf(denom_v), s.bias2_sqrt), s.eps);
  p[k] = __fsub_rn(w, __fmul_rn(s.step_size, __fdiv_rn(mk, denom)));
}

__global__ void adam_kernel(kernels::AdamStep s, float* __restrict__ p, const float* __restrict__ g,
                            float* __restrict__ m, float* __restrict__ v, float* __restrict__ vmax,
                            std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    adam_update(s, p, g[k], m, v, vmax, k);
  }
}

// Up to kListTensors parameters of one launch, passed by value (the kernel's argument stays under
// the 4 KiB every architecture takes). Tensor t owns blocks [first_block[t], first_block[t + 1]),
// each of kChunk elements.
constexpr int kListTensors = 32;
constexpr std::int64_t kChunk = 8192;
struct AdamList {
  float* p[kListTensors];
  float* g[kListTensors];
  float* m[kListTensors];
  float* v[kListTensors];
  float* vmax[kListTensors];
  std::int64_t n[kListTensors];
  int first_block[kListTensors + 1];
  int count;
};
static_assert(sizeof(AdamList) < 3500, "AdamList must fit a kernel argument");

// clip_grad_norm's factor, as the CPU computes it (the norm in double, the factor in float); 1
// when no clipping applies (no norm given, or the factor would not shrink anything).
__device__ __forceinline__ float clip_factor(const double* norm_sq, float max_norm) {
  if (norm_sq == nullptr) return 1.0f;
  const auto norm = static_cast<float>(sqrt(*norm_sq));
  const float c = __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f));
  return c < 1.0f ? c : 1.0f;  // a NaN factor clips nothing, as on the CPU
}

__global__ void adam_multi_kernel(kernels::AdamStep s, AdamList l, const double* norm_sq,
                                  float max_norm) {
  int t = 0;
  while (t + 1 < l.count && l.first_block[t + 1] <= static_cast<int>(blockIdx.x)) ++t;
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x - l.first_block[t]) * kChunk;
  const std::int64_t end = begin + kChunk < l.n[t] ? begin + kChunk : l.n[t];
  const float coef = clip_factor(norm_sq, max_norm);
  float* __restrict__ g = l.g[t];
  for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    float gk = g[k];
    if (coef != 1.0f) {
      gk = __fmul_rn(gk, coef);
      g[k] = gk;  // left clipped, as clip_grad_norm leaves it
    }
    adam_update(s, l.p[t], gk, l.m[t], l.v[t], l.vmax[t], k);
  }
}

// d = g + wd * p; with a buffer b = keep * buf + take * d, p -= lr * (nesterov ? d + mom * b : b);
// without, p -= lr * d.
__global__ void sgd_kernel(kernels::SgdStep s, float* __restrict__ p, const float* __restrict__ g,
                           float* __restrict__ buf, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    const float d = __fadd_rn(g[k], __fmul_rn(s.weight_decay, p[k]));
    if (buf == nullptr) {
      p[k] = __fsub_rn(p[k], __fmul_rn(s.lr, d));
      continue;
    }
    const float b = __fadd_rn(__fmul_rn(s.keep, buf[k]), __fmul_rn(s.take, d));
    buf[k] = b;
    const float step = s.nesterov ? __fadd_rn(d, __fmul_rn(s.momentum, b)) : b;
    p[k] = __fsub_rn(p[k], __fmul_rn(s.lr, step));
  }
}

}  // namespace

void adam_step_(const kernels::AdamStep& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                Tensor& vmax) {
  // cpu_backend.cpp's checks, in its order.
  const std::int64_t n = p.numel();
  for (const Tensor* t : {&g, static_cast<const Tensor*>(&m), static_cast<const Tensor*>(&v)}) {
    if (t->numel() != n) throw std::invalid_argument("adam_step_: state of another size");
  }
  if (vmax.defined() && vmax.numel() != n) {
    throw std::invalid_argument("adam_step_: vmax of another size");
  }
  for (const Tensor* t : {static_cast<const Tensor*>(&p), &g, static_cast<const Tensor*>(&m),
                          static_cast<const Tensor*>(&v)}) {
    require_dtype(*t, DType::F32);
  }
  if (vmax.defined()) require_dtype(vmax, DType::F32);
  if (n == 0) return;
  adam_kernel<<<blocks_for(n), 256, 0, current_stream()>>>(
      s, ptr<float>(p), ptr<float>(g), ptr<float>(m), ptr<float>(v),
      vmax.defined() ? ptr<float>(vmax) : nullptr, n);
  HPM_CUDA_LAUNCH_CHECK("adam_kernel");
}

void adam_step_multi_(const kernels::AdamStep& s, const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                      const std::vector<Tensor>& exp_avg_sq,
                      const std::vector<Tensor>& max_exp_avg_sq, const Tensor& grad_norm_sq,
                      float max_norm) {
  const double* norm_sq = nullptr;
  if (grad_norm_sq.defined() && max_norm > 0.0f) {
    require_dtype(grad_norm_sq, DType::F64);
    if (grad_norm_sq.numel() != 1) {
      throw std::invalid_argument("adam_step_multi_: grad_norm_sq must be one F64 value");
    }
    norm_sq = ptr<double>(grad_norm_sq);
  }
  const bool ams = !max_exp_avg_sq.empty();
  AdamList l{};
  const auto launch = [&] {
    if (l.count == 0) return;
    adam_multi_kernel<<<static_cast<unsigned>(l.first_block[l.count]), 256, 0, current_stream()>>>(
        s, l, norm_sq, max_norm);
    HPM_CUDA_LAUNCH_CHECK("adam_multi_kernel");
    l = AdamList{};
  };
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const std::int64_t n = p.numel();
    for (const Tensor* t : {&grads[i], &exp_avg[i], &exp_avg_sq[i]}) {
      if (t->numel() != n) throw std::invalid_argument("adam_step_multi_: state of another size");
    }
    if (ams && max_exp_avg_sq[i].numel() != n) {
      throw std::invalid_argument("adam_step_multi_: vmax of another size");
    }
    for (const Tensor* t : {&p, &grads[i], &exp_avg[i], &exp_avg_sq[i]})
      require_dtype(*t, DType::F32);
    if (ams) require_dtype(max_exp_avg_sq[i], DType::F32);
    if (n == 0) continue;
    const auto chunks = static_cast<int>((n + kChunk - 1) / kChunk);
    if (l.count == kListTensors || l.first_block[l.count] > (1 << 30) - chunks) launch();
    const int t = l.count;
    l.p[t] = ptr<float>(p);
    l.g[t] = ptr<float>(grads[i]);
    l.m[t] = ptr<float>(exp_avg[i]);
    l.v[t] = ptr<float>(exp_avg_sq[i]);
    l.vmax[t] = ams ? ptr<float>(max_exp_avg_sq[i]) : nullptr;
    l.n[t] = n;
    l.first_block[t + 1] = l.first_block[t] + chunks;
    l.count = t + 1;
  }
  launch();
}

void sgd_step_(const kernels::SgdStep& s, Tensor& p, const Tensor& g, Tensor& buf) {
  const std::int64_t n = p.numel();
  if (g.numel() != n || (buf.defined() && buf.numel() != n)) {
    throw std::invalid_argument("sgd_step_: state of another size");
  }
  require_dtype(p, DType::F32);
  require_dtype(g, DType::F32);
  if (buf.defined()) require_dtype(buf, DType::F32);
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), 256, 0, current_stream()>>>(
      s, ptr<float>(p), ptr<float>(g), buf.defined() ? ptr<float>(buf) : nullptr, n);
  HPM_CUDA_LAUNCH_CHECK("sgd_kernel");
}

}  // namespace hpm::cuda
