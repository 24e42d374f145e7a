// Optimizer updates (Adam(W), SGD): element-wise over a parameter and its state, in place. The
// formulas and their order are optimizer_updates.cpp's; the products and sums use the _rn
// intrinsics so that nvcc does not contract them into FMAs, keeping the CPU's roundings.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

// p = w - step * m / (sqrt(v or vmax) / bias2_sqrt + eps), w = p * decay, d = g + l2 * w.
__global__ void adam_kernel(kernels::AdamStep s, float* __restrict__ p, const float* __restrict__ g,
                            float* __restrict__ m, float* __restrict__ v, float* __restrict__ vmax,
                            std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    const float w = __fmul_rn(p[k], s.decay);
    const float d = __fadd_rn(g[k], __fmul_rn(s.l2, w));
    const float mk = __fadd_rn(__fmul_rn(m[k], s.beta1), __fmul_rn(1.0f - s.beta1, d));
    const float vk =
        __fadd_rn(__fmul_rn(v[k], s.beta2), __fmul_rn(__fmul_rn(1.0f - s.beta2, d), d));
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
