// The unary activations and their gradients of elementwise.cu (the formulas are the CPU's,
// cpu/elementwise.cpp and cpu/vec.h, exp and erf approximations included, but for the exact GELU's
// normal CDF on the card: gelu_cdf, apply_unary_to_bf16 and apply_unary_backward_to_bf16 below),
// apart from the launchers
// so that tests/cuda_emulated can compile them for the CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "hpm/tensor/op_params.h"
#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

using kernels::UnaryOp;

namespace {

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation

// cpu/vec.h's exp (Cephes' expf): within 2 ulp of e^x, 0 below -86.6, +inf above 88.72, NaN for
// NaN; the CPU's exp and GELU use it, so this backend does too (expf would differ at the edges).
__device__ inline float vec_exp(float x) {
  constexpr float kLo = -86.6f, kHi = 88.72283f;
  const float xc = x < kLo ? kLo : (x > kHi ? kHi : x);
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + (r + 1.0f);
  const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 126) << 23;
  const float y = p * __uint_as_float(bits) * 2.0f;
  return x < kLo ? 0.0f : (x > kHi ? __int_as_float(0x7f800000) : y);
}

// cpu/vec.h's standard normal CDF and density (one exp shared), for the exact GELU.
struct NormalCdfPdf {
  float cdf, pdf;
};
__device__ inline NormalCdfPdf normal_cdf_pdf(float x) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  const float a = (x < 0.0f ? -x : x) * kInvSqrt2;
  const float a2 = a * a;
  const float e = vec_exp(-a2);
  float p = 7.898210206e-05f;
  p = p * a2 - 8.024354128e-04f;
  p = p * a2 + 5.190053578e-03f;
  p = p * a2 - 2.685480854e-02f;
  p = p * a2 + 1.128361243e-01f;
  p = p * a2 - 3.761262884e-01f;
  p = p * a2 + 1.128379167e+00f;
  const float erf_small = a * p;
  const float t = 1.0f / (1.0f + 0.5f * a);
  float q = 1.156064052e-01f;
  q = q * t - 4.582943490e-01f;
  q = q * t + 5.443685942e-01f;
  q = q * t - 8.837625125e-02f;
  q = q * t + 3.405025593e-01f;
  q = q * t + 2.617668365e-01f;
  q = q * t + 2.845866309e-01f;
  q = q * t - 1.324968887e-04f;
  const float eq = e * q;
  const float erfc_big = a > 4.5f ? 0.0f : (eq > 0.0f ? eq : 0.0f);
  const bool small = a < 1.0f;
  const float upper = small ? 1.0f + erf_small : 2.0f - erfc_big;
  const float lower = small ? 1.0f - erf_small : erfc_big;
  return {0.5f * (x >= 0.0f ? upper : lower), kInvSqrt2Pi * e};
}

// The exact GELU's normal CDF, forward into F32 (a bf16 output: apply_unary_to_bf16). On the card,
// CUDA's normcdff (an erfc: accurate in the far negative tail, where 1 + erf cancels), within a few
// ulp of the CPU's Cephes polynomials: run 9 measured the GELU forward at 1.85 times PyTorch's
// (1.89 ms against 1.02 a GPT-2 small step) and computing both of normal_cdf_pdf's branches for
// every element; run 10 measured 1.79 with this. The gradient keeps normal_cdf_pdf (one exp for the
// CDF and the density): run 10 measured normcdff with an expf for the density slower there (1.91
// -> 2.11 ms). The CPU emulation (tests/cuda_emulated) keeps the CPU's formula, which it checks to
// a few ulp; the card's is checked against the CPU kernel by the CUDA suite's conformance cases
// (1e-4).
__device__ inline float gelu_cdf(float x) {
#if defined(__CUDACC__) && !defined(HPM_SIMT_EMULATION)
  return normcdff(x);
#else
  return normal_cdf_pdf(x).cdf;
#endif
}

constexpr float kSqrt2OverPi = 0.79788456080286535588f;

template <UnaryOp Op>
__device__ inline float apply_unary(float v) {
  if constexpr (Op == UnaryOp::Neg) return -v;
  if constexpr (Op == UnaryOp::Exp) return vec_exp(v);
  if constexpr (Op == UnaryOp::Log) return logf(v);
  if constexpr (Op == UnaryOp::Sqrt) return sqrtf(v);
  if constexpr (Op == UnaryOp::Relu) return v < 0.0f ? 0.0f : v;  // NaN passes, as the CPU
  if constexpr (Op == UnaryOp::Tanh) return tanhf(v);
  if constexpr (Op == UnaryOp::Sigmoid) return 1.0f / (1.0f + expf(-v));
  if constexpr (Op == UnaryOp::Gelu) return v * gelu_cdf(v);
  if constexpr (Op == UnaryOp::GeluTanh) {
    return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
  if constexpr (Op == UnaryOp::Square) return v * v;
  return 0.0f;
}

// The activation of a bf16 output: apply_unary's, but GELU as PyTorch's kernel computes it,
// 0.5 x (1 + erf(x / sqrt 2)): fewer instructions than normcdff, and runs 11 and 12 measured the
// step 0-1% (GPT-2 small) and 3-7% (shakespeare) faster with it (the A/B HPM_CUDA_GELU=erf).
// 1 + erf cancels in the far negative tail: its error there stays under the output's bf16
// rounding for x > -4, and beyond, where GELU is under 1.3e-4 in magnitude, it is a few 1e-7 in
// absolute terms. An F32 output (unary_kernel) keeps normcdff's accuracy. The CPU emulation keeps
// apply_unary's formula.
template <UnaryOp Op>
__device__ inline float apply_unary_to_bf16(float v) {
#if defined(__CUDACC__) && !defined(HPM_SIMT_EMULATION)
  if constexpr (Op == UnaryOp::Gelu) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
#endif
  return apply_unary<Op>(v);
}

// The GELUs' bf16 results on the card, rounded to nearest even by one instruction a pair
// (cvt.rn.bf16x2.f32) where f32_to_bf16_bits takes eight (run 12's kernel: a fifth of the
// forward's instructions). The same bits for every number; a NaN stays a NaN but with the card's
// canonical payload, which is no loss where the card's GELU is within ulps of the CPU's, not its
// bits, anyway. Every other op, and the CPU emulation, round by store8 (the CPU's bits).
template <UnaryOp Op>
__device__ inline void store8_result(std::uint16_t* p, const float (&v)[8]) {
#if defined(__CUDA_ARCH__) && !defined(HPM_SIMT_EMULATION)
  if constexpr (Op == UnaryOp::Gelu || Op == UnaryOp::GeluTanh) {
    Bytes16 a;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // the first operand goes to the upper half
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(a.w[k]) : "f"(v[2 * k + 1]), "f"(v[2 * k]));
    }
    store16(p, a);
    return;
  }
#endif
  store8(p, v);
}
template <UnaryOp Op>
__device__ inline void store8_result(float* p, const float (&v)[8]) {
  store8(p, v);
}

// dL/dx from g = dL/dy, the input u and the output v (0 for an operand the caller left undefined,
// as the CPU's ternary map reads it).
template <UnaryOp Op>
__device__ inline float apply_unary_backward(float g, float u, float v) {
  if constexpr (Op == UnaryOp::Neg) return -g;
  if constexpr (Op == UnaryOp::Exp) return g * v;
  if constexpr (Op == UnaryOp::Log) return g / u;
  if constexpr (Op == UnaryOp::Sqrt) return 0.5f * g / v;
  if constexpr (Op == UnaryOp::Relu) return v <= 0.0f ? 0.0f : g;
  if constexpr (Op == UnaryOp::Tanh) return g * (1 - v * v);
  if constexpr (Op == UnaryOp::Sigmoid) return g * v * (1 - v);
  if constexpr (Op == UnaryOp::Gelu) {
    const NormalCdfPdf c = normal_cdf_pdf(u);
    return g * (c.cdf + u * c.pdf);
  }
  if constexpr (Op == UnaryOp::GeluTanh) {
    const float inner = kSqrt2OverPi * (u + 0.044715f * u * u * u);
    const float t = tanhf(inner);
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * u * u);
    return g * (0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * dinner);
  }
  if constexpr (Op == UnaryOp::Square) return 2.0f * g * u;
  return 0.0f;
}

// The gradient of a bf16 result: apply_unary_backward's, but on the card the exact GELU's as
// PyTorch's kernel computes it, g (Phi(u) + u phi(u)) with Phi(u) = (1 + erf(u / sqrt 2)) / 2 and
// phi(u) = exp(-u^2 / 2) / sqrt(2 pi) by the card's fast exp: 42 instructions an element where
// normal_cdf_pdf's two branches, IEEE division and Cephes exp took 82, and that kernel was
// issue-bound (run 12: 1.96 ms a GPT-2 small step, at 55% of the bandwidth). Within a few f32 ulp
// of the exact gradient but where 1 + erf cancels, beyond u = -4, where the gradient is under
// 5e-4 |g| and its error a few 1e-7 |g|, as the forward's (apply_unary_to_bf16). An F32 result
// keeps normal_cdf_pdf; the CPU emulation keeps apply_unary_backward's formula.
template <UnaryOp Op>
__device__ inline float apply_unary_backward_to_bf16(float g, float u, float v) {
#if defined(__CUDACC__) && !defined(HPM_SIMT_EMULATION)
  if constexpr (Op == UnaryOp::Gelu) {
    constexpr float kInvSqrt2 = 0.70710678118654752440f, kInvSqrt2Pi = 0.39894228040143267794f;
    const float cdf = 0.5f * (1.0f + erff(u * kInvSqrt2));
    return g * (cdf + u * (kInvSqrt2Pi * __expf(-0.5f * u * u)));
  }
#endif
  return apply_unary_backward<Op>(g, u, v);
}

template <UnaryOp Op>
__global__ void unary_kernel(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = apply_unary<Op>(x[i]);
}

// The activation rounded as f32_to_bf16_kernel rounds: to_bf16(unary(x)) bit for bit; and x
// rounded too into xb when it is given. x F32 or BF16 (X float or its bits; xb then null).
template <UnaryOp Op, typename X>
__global__ void unary_bf16_kernel(const X* x, std::uint16_t* y, std::uint16_t* xb, std::int64_t n) {
  // Eight elements a 16-byte access where every operand is 16-byte aligned, and two such groups a
  // thread, both read before either is computed (launch ceil(n / 16) threads); the rest one by
  // one. With one group a thread the GELU of GPT-2 small's MLP ran at 39% of the H100's bandwidth
  // and under half its issue rate (run 12: 0.154 ms a layer where PyTorch's took 0.085): each
  // thread's one 16-byte read was all that it had in flight while its 300 instructions waited.
  const bool vec = aligned16(x) && aligned16(y) && (xb == nullptr || aligned16(xb));
  const std::int64_t groups = vec ? n / 8 : 0, stride = grid_stride();
  for (std::int64_t g = first_index(); g < groups; g += 2 * stride) {
    const std::int64_t h = g + stride;
    const bool second = h < groups;
    float v[2][8] = {}, r[8];
    load8(x + 8 * g, v[0]);
    if (second) load8(x + 8 * h, v[1]);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (k == 1 && !second) break;
      const std::int64_t at = 8 * (k == 0 ? g : h);
#pragma unroll
      for (int e = 0; e < 8; ++e) r[e] = apply_unary_to_bf16<Op>(v[k][e]);
      store8_result<Op>(y + at, r);
      if (xb != nullptr) store8(xb + at, v[k]);
    }
  }
  for (std::int64_t i = 8 * groups + first_index(); i < n; i += stride) {
    const float v = as_f32(x[i]);
    y[i] = f32_to_bf16_bits(apply_unary_to_bf16<Op>(v));
    if (xb != nullptr) xb[i] = f32_to_bf16_bits(v);
  }
}

// x F32 or BF16 (X float or its bits), g likewise (G); out F32 or rounded to BF16 (Out float or
// its bits).
template <UnaryOp Op, typename G, typename X, typename Out>
__global__ void unary_backward_kernel(const G* g, const X* x, const float* y, Out* out,
                                      std::int64_t n) {
  constexpr bool kBf16 = std::is_same_v<Out, std::uint16_t>;
  const auto gradient = [](float gv, float u, float v) {
    if constexpr (kBf16) {
      return apply_unary_backward_to_bf16<Op>(gv, u, v);
    } else {
      return apply_unary_backward<Op>(gv, u, v);
    }
  };
  // Vector bodies, two groups a thread, and a scalar tail, as unary_bf16_kernel's (launch
  // ceil(n / 16) threads).
  const bool vec = aligned16(g) && aligned16(out) && (x == nullptr || aligned16(x)) &&
                   (y == nullptr || aligned16(y));
  const std::int64_t groups = vec ? n / 8 : 0, stride = grid_stride();
  for (std::int64_t q = first_index(); q < groups; q += 2 * stride) {
    const std::int64_t h = q + stride;
    const bool second = h < groups;
    float gv[2][8] = {}, u[2][8] = {}, v[2][8] = {}, d[8];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (k == 1 && !second) break;
      const std::int64_t at = 8 * (k == 0 ? q : h);
      load8(g + at, gv[k]);
      if (x != nullptr) load8(x + at, u[k]);
      if (y != nullptr) load8(y + at, v[k]);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (k == 1 && !second) break;
#pragma unroll
      for (int e = 0; e < 8; ++e) d[e] = gradient(gv[k][e], u[k][e], v[k][e]);
      store8_result<Op>(out + 8 * (k == 0 ? q : h), d);
    }
  }
  for (std::int64_t i = 8 * groups + first_index(); i < n; i += stride) {
    const float u = x != nullptr ? as_f32(x[i]) : 0.0f;
    const float v = y != nullptr ? y[i] : 0.0f;
    const float d = gradient(as_f32(g[i]), u, v);
    if constexpr (kBf16) {
      out[i] = f32_to_bf16_bits(d);
    } else {
      out[i] = d;
    }
  }
}

#endif

}  // namespace

}  // namespace hpm::cuda
