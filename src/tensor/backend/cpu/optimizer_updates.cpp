// Optimizer updates: element-wise over a parameter and its state, vectorized (vec.h).
#include <cmath>

#include "hpm/tensor/backend/cpu.h"
#include "vec.h"

namespace hpm::cpu {

HPM_SIMD_CLONES void adam_step(const AdamStep& s, float* p, const float* g, float* m, float* v,
                               float* vmax, std::int64_t n) {
  const float b1 = s.beta1, b2 = s.beta2, eps = s.eps, decay = s.decay, l2 = s.l2;
  const float step = s.step_size, bias2_sqrt = s.bias2_sqrt;
  if (vmax == nullptr) {
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) {
      const float w = p[k] * decay;
      const float d = g[k] + l2 * w;
      m[k] = m[k] * b1 + (1.0f - b1) * d;
      v[k] = v[k] * b2 + (1.0f - b2) * d * d;
      p[k] = w - step * (m[k] / (std::sqrt(v[k]) / bias2_sqrt + eps));  // torch's order
    }
    return;
  }
#pragma omp simd
  for (std::int64_t k = 0; k < n; ++k) {
    const float w = p[k] * decay;
    const float d = g[k] + l2 * w;
    m[k] = m[k] * b1 + (1.0f - b1) * d;
    v[k] = v[k] * b2 + (1.0f - b2) * d * d;
    vmax[k] = vmax[k] > v[k] ? vmax[k] : v[k];
    p[k] = w - step * (m[k] / (std::sqrt(vmax[k]) / bias2_sqrt + eps));
  }
}

// Compiled for the baseline instruction set, as when it was the optimizer's own loop: the same
// roundings (no contraction into FMAs) as every earlier hpm release's SGD.
void sgd_step(const SgdStep& s, float* p, const float* g, float* buf, std::int64_t n) {
  const float lr = s.lr, wd = s.weight_decay, mom = s.momentum, keep = s.keep, take = s.take;
  if (buf == nullptr) {
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) p[k] -= lr * (g[k] + wd * p[k]);
    return;
  }
  const bool nesterov = s.nesterov;
#pragma omp simd
  for (std::int64_t k = 0; k < n; ++k) {
    const float d = g[k] + wd * p[k];
    const float b = keep * buf[k] + take * d;
    buf[k] = b;
    p[k] -= lr * (nesterov ? d + mom * b : b);
  }
}

}  // namespace hpm::cpu
