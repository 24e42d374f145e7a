// GEMM on oneDNN's dnnl_sgemm: JIT kernels picked for the CPU's instruction set.
#include <oneapi/dnnl/dnnl.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "hpm/tensor/backend/cpu.h"
#include "linear_output.h"

namespace hpm::cpu {

namespace {

// oneDNN sends short products (1/m + 1/n >= 0.0038, m the rows of A here) to "no-copy" kernels
// that read B where it lies instead of packing it. When B's rows are a multiple of 2 KiB apart,
// those reads fall into the same few L1 sets and the GEMM runs at half speed: dX = dY W for a
// 1024 x 1024 weight costs 107 ms per 2048 rows as 256-row products against 55 ms in one
// (bench/gemm_rows_bench, AVX2). Micro-batches (pipeline stages, accumulation) are exactly such
// products. One pass copying B to rows padded by 64 bytes restores full speed; the copy of a 4 MB
// weight took 0.2-0.3 ms in a scratch measurement, against ~7 ms for the 256-row product. Below
// 32 rows we leave B alone: the copy's share grows as the product shrinks (not measured there).
constexpr std::int64_t kAliasingStride = 512;  // floats: 2 KiB
constexpr std::int64_t kPadding = 16;          // floats: one cache line
constexpr std::int64_t kMinRowsForCopy = 32;
constexpr double kNoCopyThreshold = 0.0038;  // oneDNN 2.6 gemm_driver, AVX2 (AVX-512: 0.00196)

// Per thread, grown to the largest B seen: a pipeline stage's weights, a few MB.
float* padded_scratch(std::size_t floats) {
  thread_local std::unique_ptr<float[]> buffer;
  thread_local std::size_t capacity = 0;
  if (floats > capacity) {
    buffer = std::make_unique<float[]>(floats);
    capacity = floats;
  }
  return buffer.get();
}

}  // namespace

bool gemm_pads_b(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t ldb) {
  return !trans_b && ldb % kAliasingStride == 0 && m >= kMinRowsForCopy &&
         1.0 / static_cast<double>(m) + 1.0 / static_cast<double>(n) >= kNoCopyThreshold;
}

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (gemm_pads_b(trans_b, m, n, ldb)) {
    const std::int64_t padded_ld = n + kPadding;
    float* padded = padded_scratch(static_cast<std::size_t>(k * padded_ld));
    for (std::int64_t row = 0; row < k; ++row)
      std::memcpy(padded + row * padded_ld, b + row * ldb,
                  static_cast<std::size_t>(n) * sizeof(float));
    b = padded;
    ldb = padded_ld;
  }
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                      lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) {
    throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(st) +
                             " for M=" + std::to_string(m) + " N=" + std::to_string(n) +
                             " K=" + std::to_string(k));
  }
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  if (a.dim() != 2 || b.dim() != 2) {
    throw std::invalid_argument("matmul needs 2-D tensors, got " + a.shape().str() + " and " +
                                b.shape().str());
  }
  const std::int64_t m = trans_a ? a.size(1) : a.size(0);
  const std::int64_t k = trans_a ? a.size(0) : a.size(1);
  const std::int64_t kb = trans_b ? b.size(1) : b.size(0);
  const std::int64_t n = trans_b ? b.size(0) : b.size(1);
  if (k != kb) {
    throw std::invalid_argument("matmul: inner dimensions differ: " + a.shape().str() +
                                (trans_a ? "^T" : "") + " x " + b.shape().str() +
                                (trans_b ? "^T" : ""));
  }
  Tensor c = Tensor::empty({m, n}, DType::F32, a.device());
  gemm(trans_a, trans_b, m, n, k, 1.0f, a.data<float>(), a.size(1), b.data<float>(), b.size(1),
       0.0f, c.data<float>(), n);
  return c;
}

LinearOutput linear_output(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (x.dim() != 2 || w.dim() != 2 || x.size(1) != w.size(1)) {
    throw std::invalid_argument("linear: input " + x.shape().str() + " does not match weight " +
                                w.shape().str());
  }
  const std::int64_t n = x.size(0), out = w.size(0);
  LinearOutput o{Tensor::empty({n, out}, DType::F32, x.device()), 0.0f};
  if (bias.defined()) {
    float* py = o.y.data<float>();
    const float* pb = bias.data<float>();
    for (std::int64_t i = 0; i < n; ++i)
      std::memcpy(py + i * out, pb, static_cast<std::size_t>(out) * sizeof(float));
    o.beta = 1.0f;
  }
  return o;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  LinearOutput o = linear_output(x, w, bias);
  gemm(false, true, x.size(0), w.size(0), x.size(1), 1.0f, x.data<float>(), x.size(1),
       w.data<float>(), w.size(1), o.beta, o.y.data<float>(), w.size(0));
  return o.y;
}

}  // namespace hpm::cpu
