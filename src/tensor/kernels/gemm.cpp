// GEMM on oneDNN's dnnl_sgemm: JIT kernels picked for the CPU's instruction set (AVX-512 here).
#include <oneapi/dnnl/dnnl.h>

#include <stdexcept>
#include <string>

#include "hpm/tensor/kernels.h"

namespace hpm::kernels {

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                      lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) {
    throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(st) + " for M=" +
                             std::to_string(m) + " N=" + std::to_string(n) +
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

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (x.dim() != 2 || w.dim() != 2 || x.size(1) != w.size(1)) {
    throw std::invalid_argument("linear: input " + x.shape().str() + " does not match weight " +
                                w.shape().str());
  }
  const std::int64_t n = x.size(0), out = w.size(0);
  Tensor y = Tensor::empty({n, out}, DType::F32, x.device());
  float* py = y.data<float>();
  float beta = 0.0f;
  if (bias.defined()) {
    // Seed C with the bias rows so the GEMM adds into it: one pass over y instead of two.
    const float* pb = bias.data<float>();
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < out; ++j) py[i * out + j] = pb[j];
    beta = 1.0f;
  }
  gemm(false, true, n, out, x.size(1), 1.0f, x.data<float>(), x.size(1), w.data<float>(),
       w.size(1), beta, py, out);
  return y;
}

}  // namespace hpm::kernels
