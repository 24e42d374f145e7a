// Scaled dot-product attention under bf16 autocast: the products of each query block (two
// forward; backward recomputes the scores and runs four more) take bf16 operands and accumulate
// in f32 on oneDNN's native kernels; the softmax, its gradient and every result stay f32.
//
// Legend as in attention.cpp: B = batch (heads included), T queries, S keys, D head size.
//
// Why a different loop from the f32 tiles: one oneDNN call per 64 x 64 tile costs about what a
// 64 x 64 x 64 bf16 product computes, so the tile loop would give back the bf16 speed in call
// overhead. Here each product covers a block of 64 queries for a chunk of heads in one batched
// call (matmul_primitive.h), against all the keys the block sees (causally: up to its last
// query), so the block's whole score rows exist at once: the softmax is exact per row, with no
// running rescale, and the chunk's scores stay within a core's L2.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_heads.h"
#include "hpm/tensor/backend/cpu.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::cpu {

namespace {

constexpr std::int64_t kBlock = 64;  // query rows per block

using Dims = AttentionDims;

// Heads whose scores for one query block against every key fit kChunkScoreBytes.
std::int64_t block_heads_per_chunk(const Dims& n) {
  return std::clamp<std::int64_t>(
      kChunkScoreBytes / (kBlock * n.s * static_cast<std::int64_t>(sizeof(float))), 1, n.batch);
}

// Keys query block [i0, i0 + br) sees: [0, end).
std::int64_t block_end(bool causal, std::int64_t i0, std::int64_t br, std::int64_t s) {
  return causal ? std::min(s, i0 + br) : s;
}

// Row r of a block (query i0 + r) sees its first `visible` of the block's `end` keys.
std::int64_t visible(bool causal, std::int64_t i0, std::int64_t r, std::int64_t end) {
  return causal ? std::min(end, i0 + r + 1) : end;
}

// Scores to probabilities in place for rows [r0, r1) of a chunk's block (rows of `end`, `br` per
// head), 0 past each row's visible keys; each row's log-sum-exp to lse (head h's row r at
// lse[h * t + i0 + r]).
void softmax_rows(float* scores, std::int64_t r0, std::int64_t r1, std::int64_t br,
                  std::int64_t end, std::int64_t i0, std::int64_t t, bool causal, float* lse) {
  for (std::int64_t row = r0; row < r1; ++row)
    lse[row / br * t + i0 + row % br] =
        softmax_row(scores + row * end, end, visible(causal, i0, row % br, end));
}

// Recomputed probabilities exp(x - lse), 0 where masked, in place (the same rows).
void probability_rows(float* scores, std::int64_t r0, std::int64_t r1, std::int64_t br,
                      std::int64_t end, std::int64_t i0, std::int64_t t, bool causal,
                      const float* lse) {
  for (std::int64_t row = r0; row < r1; ++row)
    probability_row(scores + row * end, end, visible(causal, i0, row % br, end),
                    lse[row / br * t + i0 + row % br]);
}

// dS = P * (dP - Delta) in dp (the same rows; Delta indexed as lse).
HPM_SIMD_CLONES void score_gradient_rows(const float* p, float* dp, std::int64_t r0,
                                         std::int64_t r1, std::int64_t br, std::int64_t end,
                                         std::int64_t i0, std::int64_t t, const float* delta) {
  for (std::int64_t row = r0; row < r1; ++row) {
    const float d = delta[row / br * t + i0 + row % br];
#pragma omp simd
    for (std::int64_t c = 0; c < end; ++c)
      dp[row * end + c] = p[row * end + c] * (dp[row * end + c] - d);
  }
}

// Rows of `width` floats to bf16, spread over the kernel threads.
void rows_to_bf16(const float* x, std::uint16_t* y, std::int64_t rows, std::int64_t width) {
  parallel_for(rows, row_grain(width), [&](std::int64_t r0, std::int64_t r1) {
    f32_to_bf16(x + r0 * width, y + r0 * width, (r1 - r0) * width);
  });
}

const std::uint16_t* bits(const Tensor& t) { return t.data<std::uint16_t>(); }

}  // namespace

Tensor attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                              float scale, Tensor& lse) {
  const Dims n = attention_dims(q, k, v, DType::BF16, "attention (bf16)");
  Tensor out = Tensor::empty(q.shape(), DType::F32, q.device());
  std::vector<std::int64_t> lse_dims(q.shape().dims().begin(), q.shape().dims().end() - 1);
  lse = Tensor::empty(Shape(lse_dims), DType::F32, q.device());
  if (q.numel() == 0 || n.s == 0) {
    out.fill_(0.0f);
    lse.fill_(kNegInf);
    return out;
  }
  const std::int64_t chunk = block_heads_per_chunk(n);
  Tensor scores = Tensor::empty({chunk * kBlock * n.s}, DType::F32, q.device());
  Tensor probs = Tensor::empty({chunk * kBlock * n.s}, DType::BF16, q.device());
  float* ps = scores.data<float>();
  auto* pp = probs.data<std::uint16_t>();
  float* po = out.data<float>();
  float* pl = lse.data<float>();
  for (std::int64_t h0 = 0; h0 < n.batch; h0 += chunk) {
    const std::int64_t hc = std::min(chunk, n.batch - h0);
    const std::uint16_t* qh = bits(q) + h0 * n.t * n.d;
    const std::uint16_t* kh = bits(k) + h0 * n.s * n.d;
    const std::uint16_t* vh = bits(v) + h0 * n.s * n.d;
    for (std::int64_t i0 = 0; i0 < n.t; i0 += kBlock) {
      const std::int64_t br = std::min(kBlock, n.t - i0);
      const std::int64_t end = block_end(causal, i0, br, n.s);
      // S = scale Q_i K^T  (hc, br, end), P = softmax(S), O_i = P V
      heads_gemm(true, false, true, hc, br, end, n.d, scale, 0.0f, qh + i0 * n.d, n.d, n.t * n.d,
                 kh, n.d, n.s * n.d, ps, end, br * end);
      parallel_for(hc * br, row_grain(end), [&](std::int64_t r0, std::int64_t r1) {
        softmax_rows(ps, r0, r1, br, end, i0, n.t, causal, pl + h0 * n.t);
      });
      rows_to_bf16(ps, pp, hc * br, end);
      heads_gemm(true, false, false, hc, br, n.d, end, 1.0f, 0.0f, pp, end, br * end, vh, n.d,
                 n.s * n.d, po + (h0 * n.t + i0) * n.d, n.d, n.t * n.d);
    }
  }
  return out;
}

void attention_backward_bf16(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse, bool causal,
                             float scale, Tensor* grad_q, Tensor* grad_k, Tensor* grad_v) {
  const Dims n = attention_dims(q, k, v, DType::BF16, "attention (bf16)");
  check_shape(grad_out, q.shape(), "attention backward (bf16): grad_out");
  check_shape(out, q.shape(), "attention backward (bf16): out");
  Tensor gq = Tensor::empty(q.shape(), DType::F32, q.device());
  Tensor gk = Tensor::zeros(k.shape(), DType::F32, k.device());
  Tensor gv = Tensor::zeros(v.shape(), DType::F32, v.device());
  if (q.numel() > 0 && n.s > 0) {
    // Delta = rowsum(dO * O) in f32; dO rounded once for the products.
    Tensor delta = Tensor::empty(lse.shape(), DType::F32, q.device());
    float* pd = delta.data<float>();
    row_dots(grad_out.data<float>(), out.data<float>(), pd, n.batch * n.t, n.d);
    const Tensor gb = to_bf16(grad_out);
    const std::int64_t chunk = block_heads_per_chunk(n);
    const std::int64_t block = chunk * kBlock * n.s;
    Tensor p = Tensor::empty({block}, DType::F32, q.device());
    Tensor dp = Tensor::empty({block}, DType::F32, q.device());
    Tensor half = Tensor::empty({block}, DType::BF16, q.device());  // P, then dS, in bf16
    float* pp = p.data<float>();
    float* pdp = dp.data<float>();
    auto* ph = half.data<std::uint16_t>();
    const float* pl = lse.data<float>();
    for (std::int64_t h0 = 0; h0 < n.batch; h0 += chunk) {
      const std::int64_t hc = std::min(chunk, n.batch - h0);
      const std::int64_t qo = h0 * n.t * n.d, ko = h0 * n.s * n.d;
      const std::uint16_t* qh = bits(q) + qo;
      const std::uint16_t* kh = bits(k) + ko;
      const std::uint16_t* vh = bits(v) + ko;
      const std::uint16_t* gh = bits(gb) + qo;
      for (std::int64_t i0 = 0; i0 < n.t; i0 += kBlock) {
        const std::int64_t br = std::min(kBlock, n.t - i0);
        const std::int64_t end = block_end(causal, i0, br, n.s);
        const std::int64_t rows = hc * br;
        // P = exp(scale Q_i K^T - L)
        heads_gemm(true, false, true, hc, br, end, n.d, scale, 0.0f, qh + i0 * n.d, n.d, n.t * n.d,
                   kh, n.d, n.s * n.d, pp, end, br * end);
        parallel_for(rows, row_grain(end), [&](std::int64_t r0, std::int64_t r1) {
          probability_rows(pp, r0, r1, br, end, i0, n.t, causal, pl + h0 * n.t);
        });
        rows_to_bf16(pp, ph, rows, end);
        // dV += P^T dO_i,  dP = dO_i V^T
        heads_gemm(true, true, false, hc, end, n.d, br, 1.0f, 1.0f, ph, end, br * end,
                   gh + i0 * n.d, n.d, n.t * n.d, gv.data<float>() + ko, n.d, n.s * n.d);
        heads_gemm(true, false, true, hc, br, end, n.d, 1.0f, 0.0f, gh + i0 * n.d, n.d, n.t * n.d,
                   vh, n.d, n.s * n.d, pdp, end, br * end);
        // dS = P * (dP - Delta)
        parallel_for(rows, row_grain(end), [&](std::int64_t r0, std::int64_t r1) {
          score_gradient_rows(pp, pdp, r0, r1, br, end, i0, n.t, pd + h0 * n.t);
        });
        rows_to_bf16(pdp, ph, rows, end);
        // dQ_i = scale dS K,  dK += scale dS^T Q_i
        heads_gemm(true, false, false, hc, br, n.d, end, scale, 0.0f, ph, end, br * end, kh, n.d,
                   n.s * n.d, gq.data<float>() + qo + i0 * n.d, n.d, n.t * n.d);
        heads_gemm(true, true, false, hc, end, n.d, br, scale, 1.0f, ph, end, br * end,
                   qh + i0 * n.d, n.d, n.t * n.d, gk.data<float>() + ko, n.d, n.s * n.d);
      }
    }
  } else {
    gq.fill_(0.0f);
  }
  if (grad_q != nullptr) *grad_q = gq;
  if (grad_k != nullptr) *grad_k = gk;
  if (grad_v != nullptr) *grad_v = gv;
}

}  // namespace hpm::cpu
