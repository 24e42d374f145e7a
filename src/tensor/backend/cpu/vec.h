// Vector code for the element-wise hot loops of a transformer step (GELU, softmax's exp, layer
// norm, AdamW): as libm's scalar erff/expf and scalar loops, they were about half of a GPT step on
// one core (`perf`, BENCHMARKS.md, issue 16 second part).
//
// The build targets baseline x86-64 (SSE2), so that one binary runs on every machine a job
// lands on. HPM_SIMD_CLONES compiles a function three times (AVX-512, AVX2+FMA, baseline) and
// picks one at load time from the CPU (GCC's target_clones, an ifunc): the loops inside are
// written so that `#pragma omp simd` vectorizes them at each width.
#pragma once
#include <bit>
#include <cstdint>
#include <limits>

#if defined(__SANITIZE_THREAD__)
// The clones' ifunc resolvers run while the dynamic loader relocates, before ThreadSanitizer's
// runtime is up, and its instrumentation of them crashes every binary at load. ThreadSanitizer
// builds check threading, not speed: one baseline version there.
#define HPM_SIMD_CLONES
#else
#define HPM_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

namespace hpm::cpu::vec {

// e^x within 2 ulp on [-86.6, 88.7] (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6
// polynomial for e^r, 2^n built in the exponent bits), 0 below (where e^x is within 2.6e-38 of
// it), +inf above, NaN for NaN.
// Branch-free so that loops calling it vectorize.
inline float exp(float x) {
  constexpr float kLo = -86.6f, kHi = 88.72283f;
  const float xc = x < kLo ? kLo : (x > kHi ? kHi : x);
  // Round to nearest by the 1.5 * 2^23 trick: the add leaves no fraction bits.
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
  // 2^(n - 1) then doubled: n reaches 128 just below kHi, which 2^n itself cannot hold.
  const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 126) << 23;
  const float y = p * std::bit_cast<float>(bits) * 2.0f;
  return x < kLo ? 0.0f : (x > kHi ? std::numeric_limits<float>::infinity() : y);
}

// The standard normal CDF Phi(x) = (1 + erf(x / sqrt 2)) / 2 and density phi(x), sharing one
// exp. erf(a) = a P(a^2) below a = 1 and erfc(a) = e^(-a^2) Q(1 / (1 + a/2)) above (to 4.5,
// beyond which erfc is below 2e-10): polynomials fitted (least squares on Chebyshev nodes, in
// double) to 1.4e-9 and 1.1e-9 relative, so float rounding is what is left: as close to the
// double GELU as libm's erff (tests/tensor/vector_math_test.cpp measures it), where the one-piece
// Abramowitz & Stegun 7.1.26 form is several times further, a bias ten Adam steps of a GPT show.
struct NormalCdfPdf {
  float cdf, pdf;
};
inline NormalCdfPdf normal_cdf_pdf(float x) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  const float a = (x < 0.0f ? -x : x) * kInvSqrt2;
  const float a2 = a * a;
  const float e = vec::exp(-a2);
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
  // Phi(x) = (1 + erf(a)) / 2 for x >= 0 and erfc(a) / 2 below, each from the side that does
  // not cancel.
  const float upper = small ? 1.0f + erf_small : 2.0f - erfc_big;
  const float lower = small ? 1.0f - erf_small : erfc_big;
  return {0.5f * (x >= 0.0f ? upper : lower), kInvSqrt2Pi * e};
}

}  // namespace hpm::cpu::vec
