// A product on cuBLASLt with a fused epilogue: a Linear's bias added by the product itself, or its
// bias gradient (the output gradient's rows summed) computed while the product reads them. Each
// saves a pass over the (rows x out) matrix that blas_ops.cpp's plain cuBLAS path makes.
//
// Arguments are in cuBLAS's column-major terms, as cublasLtMatmul takes them: D (m x n, F32 or
// BF16, leading dimension ldd) = op_a(A) op_b(B) + beta D. An epilogue cuBLASLt has no algorithm
// for (a type combination, an alignment) returns false having done nothing, and the caller takes
// the unfused path: the fusion is a speed-up, never a requirement. HPM_CUDA_LT_EPILOGUES=0 turns it
// off (the A/B switch of bench/gpu_gpt.py --ab-env).
#pragma once
#include <cublasLt.h>

#include <cstdint>

namespace hpm::cuda {

struct LtProduct {
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  void* d = nullptr;
  std::int64_t ldd = 0;
  float beta = 0.0f;
  const void* c = nullptr;  // C, laid out as D, for beta C; null: D itself (accumulated into)
  bool bf16 = false;        // A and B BF16 (else F32)
  bool d_bf16 = false;      // D BF16 (A and B BF16, beta 0): the f32 result rounded as written; the
                            // bias BF16 too (below)
};

// D = op_a(A) op_b(B) + beta C (C: p.c, or D), no epilogue: the plain products' path under
// HPM_CUDA_LT_AUTOTUNE=1 (lt_autotune.h), whose plans time their candidates.
bool lt_matmul(const LtProduct& p);
// D = op_a(A) op_b(B) + beta C (C: p.c, or D), plus bias (m) on every column
// (CUBLASLT_EPILOGUE_BIAS): F32, or BF16 for a BF16 D. cuBLASLt documents a bias of D's type, and
// on the H100 (CUDA 13.0, run 6) offered no algorithm for an F32 bias beside a BF16 D: the bias is
// rounded to bf16 before it is added, as PyTorch's autocast rounds it (the CPU adds it in f32:
// within bf16's rounding).
bool lt_matmul_bias(const LtProduct& p, const void* bias);
// D = op_a(A) op_b(B) + beta D, and bias_grad (F32, n) = op_b(B) summed over k
// (CUBLASLT_EPILOGUE_BGRADB; written, not added to). HPM_CUDA_LT_BIAS_GRAD=0 declines it alone.
bool lt_matmul_bias_grad(const LtProduct& p, float* bias_grad);

}  // namespace hpm::cuda
