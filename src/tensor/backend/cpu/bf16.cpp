// bfloat16: conversions, and GEMMs with bf16 inputs accumulating in f32 on oneDNN's matmul
// primitive (matmul_primitive.h; on AVX512_BF16 its brgemm kernels: vdpbf16ps, twice the f32 FMA
// rate per cycle).
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

#include "hpm/tensor/backend/cpu.h"
#include "linear_output.h"
#include "matmul_primitive.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::cpu {

namespace {

// Round to nearest even, NaN kept a (quiet) NaN: what oneDNN, PyTorch and vcvtneps2bf16 do.
HPM_SIMD_CLONES void f32_to_bf16_span(const float* x, std::uint16_t* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = std::bit_cast<std::uint32_t>(x[i]);
    const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    y[i] = static_cast<std::uint16_t>(nan ? (u >> 16) | 0x40u : rounded >> 16);
  }
}

HPM_SIMD_CLONES void bf16_to_f32_span(const std::uint16_t* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(std::uint32_t{x[i]} << 16);
}

// One problem of batch 1.
BatchedGemm single(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, std::int64_t lda, std::int64_t ldb, float beta, std::int64_t ldc) {
  return BatchedGemm{.bf16 = true,
                     .trans_a = trans_a,
                     .trans_b = trans_b,
                     .m = m,
                     .n = n,
                     .k = k,
                     .lda = lda,
                     .ldb = ldb,
                     .ldc = ldc,
                     .stride_a = (trans_a ? k : m) * lda,
                     .stride_b = (trans_b ? n : k) * ldb,
                     .stride_c = m * ldc,
                     .alpha = alpha,
                     .beta = beta};
}

void check_bf16(const Tensor& t, const char* what) {
  if (t.dtype() != DType::BF16 || t.dim() != 2) {
    throw std::invalid_argument(std::string(what) + ": expected a 2-D BF16 tensor, got " +
                                dtype_name(t.dtype()) + " " + t.shape().str());
  }
}

}  // namespace

void f32_to_bf16(const float* x, std::uint16_t* y, std::int64_t n) { f32_to_bf16_span(x, y, n); }
void bf16_to_f32(const std::uint16_t* x, float* y, std::int64_t n) { bf16_to_f32_span(x, y, n); }

bool native_bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

Tensor to_bf16(const Tensor& x) {
  if (x.dtype() == DType::BF16) return x;
  Tensor y = Tensor::empty(x.shape(), DType::BF16, x.device());
  const float* px = x.data<float>();
  auto* py = y.data<std::uint16_t>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
    f32_to_bf16_span(px + lo, py + lo, hi - lo);
  });
  return y;
}

namespace {

// IEEE 754 binary16 <-> binary32, exactly (subnormals, infinities and NaN included); narrowing
// rounds to nearest, ties to even, and overflows to infinity.
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: mant * 2^-24, exact in f32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    std::memcpy(&bits, &v, sizeof bits);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (a quiet NaN stays a NaN)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded to nearest even by
    // the float addition itself.
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float r = a + 0.5f;  // 0.5 = 2^23 * 2^-24: the sum's last bit is the 2^-24 unit
    std::uint32_t rb;
    std::memcpy(&rb, &r, sizeof rb);
    return static_cast<std::uint16_t>(sign | (rb - 0x3f000000u));
  }
  const std::uint32_t mant_odd = (abs >> 13) & 1u;
  const std::uint32_t rounded = abs + 0xfffu + mant_odd;  // to nearest, ties to even
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

}  // namespace

Tensor to_f32(const Tensor& x) {
  if (x.dtype() == DType::F32) return x;
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  float* py = y.data<float>();
  switch (x.dtype()) {
    case DType::BF16: {
      const auto* px = x.data<std::uint16_t>();
      parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
        bf16_to_f32_span(px + lo, py + lo, hi - lo);
      });
      return y;
    }
    case DType::F16: {
      const auto* px = x.data<Float16Bits>();
      for (std::int64_t i = 0; i < x.numel(); ++i) py[i] = half_to_float(px[i].bits);
      return y;
    }
    case DType::F64: {
      const double* px = x.data<double>();
      for (std::int64_t i = 0; i < x.numel(); ++i) py[i] = static_cast<float>(px[i]);
      return y;
    }
    default:
      throw std::invalid_argument(std::string("to_f32: expected a floating-point tensor, got ") +
                                  dtype_name(x.dtype()));
  }
}

Tensor to_f16(const Tensor& x) {
  if (x.dtype() == DType::F16) return x;
  const Tensor f = to_f32(x);
  Tensor y = Tensor::empty(x.shape(), DType::F16, x.device());
  const float* pf = f.data<float>();
  auto* py = y.data<Float16Bits>();
  for (std::int64_t i = 0; i < x.numel(); ++i) py[i].bits = float_to_half(pf[i]);
  return y;
}

void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b,
               std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  run_batched_gemm(single(trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc), a, b, c);
}

std::string gemm_bf16_implementation(std::int64_t m, std::int64_t n, std::int64_t k) {
  return batched_gemm_implementation(single(false, false, m, n, k, 1.0f, k, n, 0.0f, n));
}

Tensor matmul_bf16(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, bool out_bf16) {
  check_bf16(a, "matmul_bf16");
  check_bf16(b, "matmul_bf16");
  const std::int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const std::int64_t kb = trans_b ? b.size(1) : b.size(0), n = trans_b ? b.size(0) : b.size(1);
  if (k != kb) {
    throw std::invalid_argument("matmul_bf16: inner dimensions differ: " + a.shape().str() +
                                (trans_a ? "^T" : "") + " x " + b.shape().str() +
                                (trans_b ? "^T" : ""));
  }
  Tensor c = Tensor::empty({m, n}, out_bf16 ? DType::BF16 : DType::F32, a.device());
  if (m == 0 || n == 0) return c;
  BatchedGemm g = single(trans_a, trans_b, m, n, k, 1.0f, a.size(1), b.size(1), 0.0f, n);
  g.c_bf16 = out_bf16;
  run_batched_gemm(g, a.data<std::uint16_t>(), b.data<std::uint16_t>(), c.raw_data());
  return c;
}

Tensor linear_bf16(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_bf16(x, "linear_bf16");
  check_bf16(w, "linear_bf16");
  LinearOutput o = linear_output(x, w, bias);
  gemm_bf16(false, true, x.size(0), w.size(0), x.size(1), 1.0f, x.data<std::uint16_t>(), x.size(1),
            w.data<std::uint16_t>(), w.size(1), o.beta, o.y.data<float>(), w.size(0));
  return o.y;
}

}  // namespace hpm::cpu
