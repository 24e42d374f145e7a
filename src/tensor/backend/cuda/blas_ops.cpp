// Products on cuBLAS. hpm's tensors are row-major and cuBLAS's matrices column-major: a row-major
// X (r x c) is the column-major X^T with leading dimension c, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T, B's view first.
#include "tensor/backend/cuda/blas_ops.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/backend/cuda/basic_ops.h"
#include "tensor/backend/cuda/bias_grad.h"
#include "tensor/backend/cuda/bias_rows.h"
#include "tensor/backend/cuda/lt_autotune.h"
#include "tensor/backend/cuda/lt_matmul.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

bool both_bf16(const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::BF16 && b.dtype() == DType::BF16;
}

void check_operands(const Tensor& a, const Tensor& b, const char* op) {
  const bool f32 = a.dtype() == DType::F32 && b.dtype() == DType::F32;
  if (!f32 && !both_bf16(a, b)) {
    throw std::invalid_argument(std::string(op) + ": operands must be both F32 or both BF16, got " +
                                dtype_name(a.dtype()) + " and " + dtype_name(b.dtype()));
  }
}

// c (M x N, F32 or with c_bf16 BF16, leading dimension ldc) = alpha op(a) op(b) + beta c,
// `batches` times with the given strides (in elements; 0 shares an operand across the batch).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
          std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb,
          std::int64_t stride_b, float beta, void* c, std::int64_t stride_c, std::int64_t batches,
          bool bf16, bool c_bf16 = false) {
  if (m == 0 || n == 0 || batches == 0) return;
  Context& ctx = current_context();
  const float alpha = 1.0f;
  const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t out = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      bf16 ? CUBLAS_COMPUTE_32F
           : (allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (k == 0) {
    // An empty sum: cuBLAS would leave C alone; the product is zero (times alpha) plus beta C.
    if (beta == 0.0f) {
      HPM_CUDA_CHECK(cudaMemsetAsync(
          c, 0, static_cast<std::size_t>(m * n * batches) * (c_bf16 ? 2 : 4), ctx.compute));
    }
    return;
  }
  // Column-major, C^T (n x m) = op(B)^T op(A)^T: b is cuBLAS's first operand.
  if (batches == 1 && lt_autotune_on() &&
      lt_matmul(LtProduct{.op_a = op_b,
                          .op_b = op_a,
                          .m = n,
                          .n = m,
                          .k = k,
                          .a = b,
                          .lda = ldb,
                          .b = a,
                          .ldb = lda,
                          .d = c,
                          .ldd = n,
                          .beta = beta,
                          .bf16 = bf16,
                          .d_bf16 = c_bf16})) {
    return;
  }
  if (batches == 1) {
    HPM_CUBLAS_CHECK(cublasGemmEx(ctx.blas, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, b, in, static_cast<int>(ldb), a, in,
                                  static_cast<int>(lda), &beta, c, out, static_cast<int>(n),
                                  compute, CUBLAS_GEMM_DEFAULT));
  } else {
    HPM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        ctx.blas, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha,
        b, in, static_cast<int>(ldb), stride_b, a, in, static_cast<int>(lda), stride_a, &beta, c,
        out, static_cast<int>(n), stride_c, static_cast<int>(batches), compute,
        CUBLAS_GEMM_DEFAULT));
  }
}

std::string t_suffix(bool t) { return t ? "^T" : ""; }

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, DType out) {
  if (a.dim() != 2 || b.dim() != 2) {
    throw std::invalid_argument("matmul needs 2-D tensors, got " + a.shape().str() + " and " +
                                b.shape().str());
  }
  check_operands(a, b, "matmul");
  const std::int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const std::int64_t kb = trans_b ? b.size(1) : b.size(0), n = trans_b ? b.size(0) : b.size(1);
  if (k != kb) {
    throw std::invalid_argument("matmul: inner dimensions differ: " + a.shape().str() +
                                t_suffix(trans_a) + " x " + b.shape().str() + t_suffix(trans_b));
  }
  // A BF16 output (BF16 operands, the dispatch checked): cuBLAS rounds its f32 result as it
  // writes it, no F32 matrix and no rounding pass.
  Tensor c = Tensor::empty({m, n}, out, a.device());
  gemm(trans_a, trans_b, m, n, k, device_ptr(a), a.size(1), 0, device_ptr(b), b.size(1), 0, 0.0f,
       device_ptr(c), 0, 1, both_bf16(a, b), out == DType::BF16);
  return c;
}

void matmul_add_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  if (a.dim() != 2 || b.dim() != 2) {
    throw std::invalid_argument("matmul_add_: 2-D operands expected, got " + a.shape().str() +
                                " and " + b.shape().str());
  }
  check_operands(a, b, "matmul_add_");
  const std::int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const std::int64_t n = trans_b ? b.size(0) : b.size(1);
  if ((trans_b ? b.size(1) : b.size(0)) != k) {
    throw std::invalid_argument("matmul_add_: inner dimensions differ: " + a.shape().str() +
                                " and " + b.shape().str());
  }
  if (c.shape() != Shape{m, n} || c.dtype() != DType::F32) {
    throw std::invalid_argument("matmul_add_ accumulator: expected F32 " + Shape{m, n}.str() +
                                ", got " + c.shape().str());
  }
  gemm(trans_a, trans_b, m, n, k, device_ptr(a), a.size(1), 0, device_ptr(b), b.size(1), 0, 1.0f,
       ptr<float>(c), 0, 1, both_bf16(a, b));
}

Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  if (a.dim() < 2 || b.dim() < 2 || a.dtype() != DType::F32 || b.dtype() != DType::F32) {
    throw std::invalid_argument("bmm: expected float tensors of rank >= 2, got " + a.shape().str() +
                                " and " + b.shape().str());
  }
  const std::int64_t m = trans_a ? a.size(-1) : a.size(-2), k = trans_a ? a.size(-2) : a.size(-1);
  const std::int64_t kb = trans_b ? b.size(-1) : b.size(-2), n = trans_b ? b.size(-2) : b.size(-1);
  if (k != kb) {
    throw std::invalid_argument("bmm: inner dimensions differ: " + a.shape().str() +
                                t_suffix(trans_a) + " x " + b.shape().str() + t_suffix(trans_b));
  }
  const int rank = std::max(a.dim(), b.dim()) - 2;
  auto batch = [rank](const Tensor& t) {
    std::vector<std::int64_t> d(static_cast<std::size_t>(rank), 1);
    const int own = t.dim() - 2;
    for (int i = 0; i < own; ++i) d[static_cast<std::size_t>(rank - own + i)] = t.size(i);
    return d;
  };
  const auto da = batch(a), db = batch(b);
  std::vector<std::int64_t> out;
  std::int64_t batches = 1;
  for (int i = 0; i < rank; ++i) {
    const auto ai = da[static_cast<std::size_t>(i)], bi = db[static_cast<std::size_t>(i)];
    if (ai != bi && ai != 1 && bi != 1) {
      throw std::invalid_argument("bmm: batch dimensions do not broadcast: " + a.shape().str() +
                                  " and " + b.shape().str());
    }
    out.push_back(std::max(ai, bi));
    batches *= out.back();
  }
  std::vector<std::int64_t> shape = out;
  shape.push_back(m);
  shape.push_back(n);
  Tensor y = Tensor::empty(Shape(shape), DType::F32, a.device());
  const std::int64_t sa = a.size(-1) * a.size(-2), sb = b.size(-1) * b.size(-2);
  std::int64_t a_batches = 1, b_batches = 1;
  for (auto d : da) a_batches *= d;
  for (auto d : db) b_batches *= d;
  const auto* pa = static_cast<const float*>(device_ptr(a));
  const auto* pb = static_cast<const float*>(device_ptr(b));
  float* py = ptr<float>(y);
  // One strided call when each operand is either whole or shared (a 2-D weight, attention's
  // heads); other broadcasts, one call per output matrix.
  if ((a_batches == batches || a_batches == 1) && (b_batches == batches || b_batches == 1)) {
    gemm(trans_a, trans_b, m, n, k, pa, a.size(-1), a_batches == 1 ? 0 : sa, pb, b.size(-1),
         b_batches == 1 ? 0 : sb, 0.0f, py, m * n, batches, false);
    return y;
  }
  for (std::int64_t flat = 0; flat < batches; ++flat) {
    std::int64_t oa = 0, ob = 0, stride_a = 1, stride_b = 1, rest = flat;
    for (int i = rank; i-- > 0;) {
      const auto idx = rest % out[static_cast<std::size_t>(i)];
      rest /= out[static_cast<std::size_t>(i)];
      if (da[static_cast<std::size_t>(i)] != 1) oa += idx * stride_a;
      if (db[static_cast<std::size_t>(i)] != 1) ob += idx * stride_b;
      stride_a *= da[static_cast<std::size_t>(i)];
      stride_b *= db[static_cast<std::size_t>(i)];
    }
    gemm(trans_a, trans_b, m, n, k, pa + oa * sa, a.size(-1), 0, pb + ob * sb, b.size(-1), 0, 0.0f,
         py + flat * m * n, 0, 1, false);
  }
  return y;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType out_dtype,
              const Tensor& residual) {
  if (x.dim() != 2 || w.dim() != 2 || x.size(1) != w.size(1)) {
    throw std::invalid_argument("linear: input " + x.shape().str() + " does not match weight " +
                                w.shape().str());
  }
  check_operands(x, w, "linear");
  const std::int64_t n = x.size(0), out = w.size(0), in = x.size(1);
  const bool bf16 = both_bf16(x, w), bf16_out = out_dtype == DType::BF16;
  // A residual without a bias: the product, then the sum (the fused path is the bias epilogue's).
  if (residual.defined() && !bias.defined())
    return binary(BinaryOp::Add, residual, linear(x, w, bias, DType::F32));
  Tensor y = Tensor::empty({n, out}, out_dtype, x.device());
  float beta = 0.0f;
  if (bias.defined()) {
    if (bias.dtype() != DType::F32 || bias.numel() != out) {
      throw std::invalid_argument("linear: bias " + bias.shape().str() + " does not match weight " +
                                  w.shape().str());
    }
    // Column-major, y^T (out x n) = W (out x in, i.e. w's rows transposed) x^T, the bias on
    // every column: added by the product's epilogue.
    const LtProduct p{.op_a = CUBLAS_OP_T,
                      .op_b = CUBLAS_OP_N,
                      .m = out,
                      .n = n,
                      .k = in,
                      .a = device_ptr(w),
                      .lda = in,
                      .b = device_ptr(x),
                      .ldb = in,
                      .d = device_ptr(y),
                      .ldd = out,
                      .beta = 0.0f,
                      .bf16 = bf16,
                      .d_bf16 = bf16_out};
    if (residual.defined()) {
      // The residual as the product's C (beta 1): y = residual + x W^T + bias in one pass. Without
      // an algorithm for it, the product and then the sum (correct, unfused).
      LtProduct with_c = p;
      with_c.beta = 1.0f;
      with_c.c = device_ptr(residual);
      if (lt_matmul_bias(with_c, device_ptr(bias))) return y;
      y = Tensor();
      return binary(BinaryOp::Add, residual, linear(x, w, bias, DType::F32));
    }
    // A BF16 output's bias goes in BF16 (lt_matmul.h says why).
    const Tensor lt_bias = bf16_out ? to_bf16(bias) : bias;
    if (lt_matmul_bias(p, device_ptr(lt_bias))) return y;
    // A BF16 output without the epilogue: the F32 product with its bias, rounded once (a product
    // writing bf16 onto bf16 bias rows would round twice).
    if (bf16_out) {
      y = Tensor();  // not held beside the F32 product's output (the step's peak may be here)
      return to_bf16(linear(x, w, bias, DType::F32));
    }
    // Otherwise every row seeded with the bias, which the product then adds into (beta 1).
    bias_rows(ptr<float>(y), ptr<float>(bias), n, out);
    beta = 1.0f;
  }
  gemm(false, true, n, out, in, device_ptr(x), in, 0, device_ptr(w), w.size(1), 0, beta,
       device_ptr(y), 0, 1, bf16, bf16_out);
  return y;
}

Tensor linear_param_grads_(Tensor& dw, const Tensor& g, const Tensor& x, bool accumulate) {
  check_operands(g, x, "linear_param_grads_");  // shapes checked by the dispatch
  const std::int64_t out = g.size(1), in = x.size(1), n = g.size(0);
  const bool bf16 = both_bf16(g, x);
  const float beta = accumulate ? 1.0f : 0.0f;
  Tensor db = Tensor::empty({out}, DType::F32, g.device());
  // Column-major, dw^T (in x out) = x^T (in x n) g (n x out), g's n rows summed by the epilogue.
  const LtProduct p{.op_a = CUBLAS_OP_N,
                    .op_b = CUBLAS_OP_T,
                    .m = in,
                    .n = out,
                    .k = n,
                    .a = device_ptr(x),
                    .lda = in,
                    .b = device_ptr(g),
                    .ldb = out,
                    .d = ptr<float>(dw),
                    .ldd = in,
                    .beta = beta,
                    .bf16 = bf16};
  if (lt_matmul_bias_grad(p, ptr<float>(db))) return db;
  gemm(true, false, out, in, n, device_ptr(g), out, 0, device_ptr(x), in, 0, beta, ptr<float>(dw),
       0, 1, bf16);
  bias_grad(g, db);  // g's rows summed as read, bf16 or not (no f32 copy of g)
  return db;
}

}  // namespace hpm::cuda
