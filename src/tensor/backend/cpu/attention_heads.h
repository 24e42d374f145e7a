// What the f32 attention (attention.cpp) and the bf16 one (attention_bf16.cpp) share: the check
// of q, k and v, a product batched over heads, one softmax row (forward and recomputed), and the
// row work split and sums around them.
#pragma once
#include <cstdint>
#include <limits>

#include "hpm/tensor/tensor.h"

namespace hpm::cpu {

// B = batch (every leading dimension, heads included), T queries, S keys/values, D head size.
struct AttentionDims {
  std::int64_t batch, t, s, d;
};

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The f32 scores a chunk of heads holds at once: within a core's L2.
inline constexpr std::int64_t kChunkScoreBytes = 512 << 10;

// q (..., T, D), k and v (..., S, D) with the same leading dimensions, all of `dtype`; else
// std::invalid_argument "<what>: expected ..." naming the three shapes.
AttentionDims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v, DType dtype,
                             const char* what);

// C_h = alpha op(A_h) op(B_h) + beta C_h for `heads` consecutive heads, each operand's matrices
// `stride_*` elements apart and rows `ld*` apart; A and B f32, or bf16 bits when `bf16`. One
// oneDNN call for all of them (matmul_primitive.h).
void heads_gemm(bool bf16, bool ta, bool tb, std::int64_t heads, std::int64_t m, std::int64_t n,
                std::int64_t k, float alpha, float beta, const void* a, std::int64_t lda,
                std::int64_t stride_a, const void* b, std::int64_t ldb, std::int64_t stride_b,
                float* c, std::int64_t ldc, std::int64_t stride_c);

// Rows of `width` floats a kernel thread takes at once.
std::int64_t row_grain(std::int64_t width);
// Delta = rowsum(dO * O) over rows of d: softmax backward's per-row term.
void row_dots(const float* g, const float* o, float* delta, std::int64_t rows, std::int64_t d);

// One row of `len` scores to probabilities in place, 0 from position `unmasked` on (masked);
// returns the row's log-sum-exp. `unmasked` >= 1. Whole rows with the mask as a select, so every
// loop has the same trip count and vectorizes without remainders (exp(-inf) is 0).
float softmax_row(float* x, std::int64_t len, std::int64_t unmasked);
// The probabilities again from scores and the row's log-sum-exp: exp(x - lse), 0 from `unmasked`.
void probability_row(float* x, std::int64_t len, std::int64_t unmasked, float lse);

}  // namespace hpm::cpu
