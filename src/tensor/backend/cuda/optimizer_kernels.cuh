// The optimizer kernels of optimizer.cu (its opening comment tells their rounding), apart from
// the launchers so that tests/cuda_emulated can compile them for the CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>

#include "hpm/tensor/op_params.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/tensor_lists.h"

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

// Whether a gated update (halted given) must leave everything as it is: the norm is not finite,
// or an earlier update was skipped. Every block of a launch reaches the same verdict, and halted
// is written only when every thread skips without reading it (a non-finite norm), so no thread
// reads it while another writes it.
__device__ __forceinline__ bool update_halted(const double* norm_sq, int* halted) {
  if (halted == nullptr) return false;
  if (norm_sq != nullptr && !isfinite(*norm_sq)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *halted = 1;
    return true;
  }
  return *halted != 0;
}

__global__ void adam_multi_kernel(kernels::AdamStep s, AdamList l, const double* norm_sq,
                                  float max_norm, int* halted) {
  if (update_halted(norm_sq, halted)) return;
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

// Packs the parameters of one adam_step_multi_ into AdamLists as the launcher walks them
// (tensor_lists.h).
class AdamPacker {
 public:
  template <typename Launch>
  void add(float* p, float* g, float* m, float* v, float* vmax, std::int64_t n, Launch&& launch) {
    packer_.add(
        n,
        [&](AdamList& l, int t) {
          l.p[t] = p;
          l.g[t] = g;
          l.m[t] = m;
          l.v[t] = v;
          l.vmax[t] = vmax;
        },
        launch);
  }
  template <typename Launch>
  void flush(Launch&& launch) {
    packer_.flush(launch);
  }

 private:
  TensorListPacker<AdamList, kListTensors, kChunk> packer_;
};

// The index checks a step's gate reads (halt_unless_finite_): their words' places in the device's
// check words.
struct GateChecks {
  int count;
  int word[64];  // Context::kMaxChecks
};

// halted = 1 unless *value is finite and every check word in `checks` is clear; one thread.
__global__ void halt_unless_finite_kernel(int* halted, const float* value,
                                          const unsigned long long* check_words,
                                          GateChecks checks) {
  bool bad = !isfinite(*value);
  for (int i = 0; i < checks.count; ++i) bad = bad || check_words[checks.word[i]] != kNoError;
  if (bad) *halted = 1;
}

}  // namespace

}  // namespace hpm::cuda
