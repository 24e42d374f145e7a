// Scaled dot-product attention as one fused, tiled kernel (FlashAttention's scheme on a CPU).
//
// Legend: B = batch (every leading dimension, heads included), T = query positions,
// S = key/value positions, D = head size; Br x Bc = one tile of the score matrix.
//
// Forward walks the keys a tile at a time per block of queries with an online softmax (running
// row max m and row sum l, the accumulator rescaled when m grows), so the T x S score matrix never
// exists: one Br x Bc tile per thread. It saves only the output and each row's log-sum-exp
// L = m + log(l). Backward recomputes each tile's probabilities P = exp(S - L) from Q, K and L,
// then
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - Delta)  with Delta = rowsum(dO * O),
//   dQ += scale dS K,  dK += scale dS^T Q,
// keys outer (dK, dV of a tile finished in registers of memory before moving on), queries inner.
// Causal masking is top-left aligned (query i sees keys j <= i), as PyTorch's is_causal; tiles
// wholly above the diagonal are skipped.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "attention_heads.h"
#include "hpm/tensor/backend/cpu.h"
#include "matmul_primitive.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::cpu {

namespace {

constexpr std::int64_t kBr = 64;  // query rows per tile
constexpr std::int64_t kBc = 64;  // key columns per tile

using Dims = AttentionDims;

// Masks the causal part of a score tile in place: entries of keys after the query's position.
void mask_tile(float* sc, std::int64_t i0, std::int64_t br, std::int64_t j0, std::int64_t bc) {
  for (std::int64_t r = 0; r < br; ++r)
    for (std::int64_t c = std::max<std::int64_t>(0, i0 + r + 1 - j0); c < bc; ++c)
      sc[r * kBc + c] = kNegInf;
}

// row[c] = e^(row[c] - shift) for c < n; returns their sum.
HPM_SIMD_CLONES float exp_shifted_sum(float* row, std::int64_t n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t c = 0; c < n; ++c) {
    row[c] = vec::exp(row[c] - shift);
    sum += row[c];
  }
  return sum;
}

// ---- short sequences: batched GEMMs over materialized scores ---------------------------------
// A head whose whole T x S score matrix is small runs as a few batched GEMMs over a chunk of
// heads (matmul_primitive.h: one JIT call for the chunk), with the softmax between them. The
// tiled path makes two oneDNN calls per 64 x 64 tile, which at T = 64 (one tile a head) cost
// more than the products. Measured on one Zen 5 core, forward + backward of 48 causal heads of
// 64 x 32: 0.74 ms against 0.86 tiled; 96 heads of 128 x 64, 9.1 against 9.5; at 256 x 64 the
// tiles win (29.5 against 34.5 ms: the causal half the tiles skip is computed here), so the
// line is drawn at 128. The chunk's scores stay in cache.
constexpr std::int64_t kMaterializedHeadBytes = 64 << 10;  // T = S = 128

bool materializes(const Dims& n) {
  return n.t * n.s * static_cast<std::int64_t>(sizeof(float)) <= kMaterializedHeadBytes;
}

std::int64_t heads_per_chunk(const Dims& n) {
  return std::max<std::int64_t>(
      1, kChunkScoreBytes / (n.t * n.s * static_cast<std::int64_t>(sizeof(float))));
}

// Keys query row r sees: all, or causally the first r + 1.
std::int64_t visible(bool causal, std::int64_t r, std::int64_t s) {
  return causal ? std::min(s, r + 1) : s;
}

// Scores (rows of s) to probabilities in place, the masked tail of each row 0; each row's
// log-sum-exp to lse.
void softmax_span(float* scores, std::int64_t r0, std::int64_t r1, std::int64_t t, std::int64_t s,
                  bool causal, float* lse) {
  for (std::int64_t row = r0; row < r1; ++row)
    lse[row] = softmax_row(scores + row * s, s, visible(causal, row % t, s));
}

// Scores to the forward pass's probabilities, exp(x - lse) (0 where masked), in place.
void probabilities_span(float* scores, std::int64_t r0, std::int64_t r1, std::int64_t t,
                        std::int64_t s, bool causal, const float* lse) {
  for (std::int64_t row = r0; row < r1; ++row)
    probability_row(scores + row * s, s, visible(causal, row % t, s), lse[row]);
}

// dS = P * (dP - Delta), in dp.
HPM_SIMD_CLONES void score_gradient_span(const float* p, float* dp, const float* delta,
                                         std::int64_t r0, std::int64_t r1, std::int64_t s) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const float d = delta[r];
#pragma omp simd
    for (std::int64_t c = 0; c < s; ++c) dp[r * s + c] = p[r * s + c] * (dp[r * s + c] - d);
  }
}

// A chunk's scores, from the Device's caching allocator: reused step after step (a fresh
// std::vector of this size is mmap'ed, and its page faults cost more than the attention).
Tensor chunk_scores(const Dims& n, Device& device) {
  return Tensor::empty({heads_per_chunk(n) * n.t * n.s}, DType::F32, device);
}

void forward_materialized(const Dims& n, const float* q, const float* k, const float* v,
                          bool causal, float scale, float* out, float* lse, Device& device) {
  const std::int64_t chunk = heads_per_chunk(n);
  Tensor buffer = chunk_scores(n, device);
  float* scores = buffer.data<float>();
  for (std::int64_t h0 = 0; h0 < n.batch; h0 += chunk) {
    const std::int64_t hc = std::min(chunk, n.batch - h0);
    const float* qh = q + h0 * n.t * n.d;
    const float* kh = k + h0 * n.s * n.d;
    const float* vh = v + h0 * n.s * n.d;
    // S = scale Q K^T, P = softmax(S), O = P V
    heads_gemm(false, false, true, hc, n.t, n.s, n.d, scale, 0.0f, qh, n.d, n.t * n.d, kh, n.d,
               n.s * n.d, scores, n.s, n.t * n.s);
    parallel_for(hc * n.t, row_grain(n.s), [&](std::int64_t r0, std::int64_t r1) {
      softmax_span(scores, r0, r1, n.t, n.s, causal, lse + h0 * n.t);
    });
    heads_gemm(false, false, false, hc, n.t, n.d, n.s, 1.0f, 0.0f, scores, n.s, n.t * n.s, vh, n.d,
               n.s * n.d, out + h0 * n.t * n.d, n.d, n.t * n.d);
  }
}

void backward_materialized(const Dims& n, const float* q, const float* k, const float* v,
                           const float* g, const float* lse, const float* delta, bool causal,
                           float scale, float* gq, float* gk, float* gv, Device& device) {
  const std::int64_t chunk = heads_per_chunk(n);
  Tensor p_buffer = chunk_scores(n, device), dp_buffer = chunk_scores(n, device);
  float* p = p_buffer.data<float>();
  float* dp = dp_buffer.data<float>();
  for (std::int64_t h0 = 0; h0 < n.batch; h0 += chunk) {
    const std::int64_t hc = std::min(chunk, n.batch - h0);
    const std::int64_t qo = h0 * n.t * n.d, ko = h0 * n.s * n.d;
    // P = exp(scale Q K^T - L)
    heads_gemm(false, false, true, hc, n.t, n.s, n.d, scale, 0.0f, q + qo, n.d, n.t * n.d, k + ko,
               n.d, n.s * n.d, p, n.s, n.t * n.s);
    parallel_for(hc * n.t, row_grain(n.s), [&](std::int64_t r0, std::int64_t r1) {
      probabilities_span(p, r0, r1, n.t, n.s, causal, lse + h0 * n.t);
    });
    // dV = P^T dO,  dP = dO V^T
    heads_gemm(false, true, false, hc, n.s, n.d, n.t, 1.0f, 0.0f, p, n.s, n.t * n.s, g + qo, n.d,
               n.t * n.d, gv + ko, n.d, n.s * n.d);
    heads_gemm(false, false, true, hc, n.t, n.s, n.d, 1.0f, 0.0f, g + qo, n.d, n.t * n.d, v + ko,
               n.d, n.s * n.d, dp, n.s, n.t * n.s);
    // dS = P * (dP - Delta)
    const float* dl = delta + h0 * n.t;
    parallel_for(hc * n.t, row_grain(n.s), [&](std::int64_t r0, std::int64_t r1) {
      score_gradient_span(p, dp, dl, r0, r1, n.s);
    });
    // dQ = scale dS K,  dK = scale dS^T Q
    heads_gemm(false, false, false, hc, n.t, n.d, n.s, scale, 0.0f, dp, n.s, n.t * n.s, k + ko, n.d,
               n.s * n.d, gq + qo, n.d, n.t * n.d);
    heads_gemm(false, true, false, hc, n.s, n.d, n.t, scale, 0.0f, dp, n.s, n.t * n.s, q + qo, n.d,
               n.t * n.d, gk + ko, n.d, n.s * n.d);
  }
}

// Key tiles a query block [i0, i0 + br) attends to: [0, end).
std::int64_t key_end(bool causal, std::int64_t i0, std::int64_t br, std::int64_t s) {
  return causal ? std::min(s, i0 + br) : s;
}

void tiled_backward(const Dims& n, const float* pq, const float* pk, const float* pv,
                    const float* pg, const float* pl, const float* pd, bool causal, float scale,
                    float* pgq, float* pgk, float* pgv) {
  parallel_for(n.batch, 1, [&](std::int64_t b0, std::int64_t b1) {
    std::vector<float> p_tile(kBr * kBc), dp_tile(kBr * kBc);
    float* p = p_tile.data();
    float* dp = dp_tile.data();
    for (std::int64_t b = b0; b < b1; ++b) {
      const float* qb = pq + b * n.t * n.d;
      const float* kb = pk + b * n.s * n.d;
      const float* vb = pv + b * n.s * n.d;
      const float* gb = pg + b * n.t * n.d;
      const float* lb = pl + b * n.t;
      const float* db = pd + b * n.t;
      float* gqb = pgq + b * n.t * n.d;
      for (std::int64_t j0 = 0; j0 < n.s; j0 += kBc) {
        const std::int64_t bc = std::min(kBc, n.s - j0);
        float* dk = pgk + (b * n.s + j0) * n.d;  // (bc, D)
        float* dv = pgv + (b * n.s + j0) * n.d;
        std::fill(dk, dk + bc * n.d, 0.0f);
        std::fill(dv, dv + bc * n.d, 0.0f);
        // Causal: queries before j0 see none of these keys.
        const std::int64_t first = causal ? (j0 / kBr) * kBr : 0;
        for (std::int64_t i0 = first; i0 < n.t; i0 += kBr) {
          const std::int64_t br = std::min(kBr, n.t - i0);
          if (causal && i0 + br <= j0) continue;
          // P = exp(scale Q_i K_j^T - L)  (br, bc)
          gemm(false, true, br, bc, n.d, scale, qb + i0 * n.d, n.d, kb + j0 * n.d, n.d, 0.0f, p,
               kBc);
          if (causal && j0 + bc > i0 + 1) mask_tile(p, i0, br, j0, bc);
          for (std::int64_t r = 0; r < br; ++r) {
            const float lr = lb[i0 + r];
            float* row = p + r * kBc;
            if (lr == kNegInf) {
              std::fill(row, row + bc, 0.0f);
            } else {
              exp_shifted_sum(row, bc, lr);
            }
          }
          // dV_j += P^T dO_i  (bc, D)
          gemm(true, false, bc, n.d, br, 1.0f, p, kBc, gb + i0 * n.d, n.d, 1.0f, dv, n.d);
          // dP = dO_i V_j^T  (br, bc)
          gemm(false, true, br, bc, n.d, 1.0f, gb + i0 * n.d, n.d, vb + j0 * n.d, n.d, 0.0f, dp,
               kBc);
          // dS = P * (dP - Delta), kept in dp
          for (std::int64_t r = 0; r < br; ++r) {
            const float dr = db[i0 + r];
            for (std::int64_t c = 0; c < bc; ++c)
              dp[static_cast<std::size_t>(r * kBc + c)] =
                  p[static_cast<std::size_t>(r * kBc + c)] *
                  (dp[static_cast<std::size_t>(r * kBc + c)] - dr);
          }
          // dQ_i += scale dS K_j  (br, D);  dK_j += scale dS^T Q_i  (bc, D)
          gemm(false, false, br, n.d, bc, scale, dp, kBc, kb + j0 * n.d, n.d, 1.0f, gqb + i0 * n.d,
               n.d);
          gemm(true, false, bc, n.d, br, scale, dp, kBc, qb + i0 * n.d, n.d, 1.0f, dk, n.d);
        }
      }
    }
  });
}

}  // namespace

AttentionDims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v, DType dtype,
                             const char* what) {
  const auto same_batch = [](const Tensor& a, const Tensor& b) {
    if (a.dim() != b.dim()) return false;
    for (int i = 0; i < a.dim() - 2; ++i)
      if (a.size(i) != b.size(i)) return false;
    return true;
  };
  if (q.dim() < 3 || !same_batch(q, k) || !same_batch(q, v) || k.shape() != v.shape() ||
      q.size(-1) != k.size(-1) || q.dtype() != dtype || k.dtype() != dtype || v.dtype() != dtype) {
    throw std::invalid_argument(std::string(what) + ": expected " + dtype_name(dtype) +
                                " q (..., T, D), k and v (..., S, D) with the same leading "
                                "dimensions, got " +
                                q.shape().str() + ", " + k.shape().str() + ", " + v.shape().str());
  }
  return {q.numel() / (q.size(-1) * q.size(-2)), q.size(-2), k.size(-2), q.size(-1)};
}

void heads_gemm(bool bf16, bool ta, bool tb, std::int64_t heads, std::int64_t m, std::int64_t n,
                std::int64_t k, float alpha, float beta, const void* a, std::int64_t lda,
                std::int64_t stride_a, const void* b, std::int64_t ldb, std::int64_t stride_b,
                float* c, std::int64_t ldc, std::int64_t stride_c) {
  const BatchedGemm g{.bf16 = bf16,
                      .trans_a = ta,
                      .trans_b = tb,
                      .batch = heads,
                      .m = m,
                      .n = n,
                      .k = k,
                      .lda = lda,
                      .ldb = ldb,
                      .ldc = ldc,
                      .stride_a = stride_a,
                      .stride_b = stride_b,
                      .stride_c = stride_c,
                      .alpha = alpha,
                      .beta = beta};
  run_batched_gemm(g, a, b, c);
}

HPM_SIMD_CLONES float softmax_row(float* x, std::int64_t len, std::int64_t unmasked) {
  float mx = kNegInf;
#pragma omp simd reduction(max : mx)
  for (std::int64_t c = 0; c < len; ++c) {
    const float v = c < unmasked ? x[c] : kNegInf;
    x[c] = v;
    mx = v > mx ? v : mx;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t c = 0; c < len; ++c) {
    const float e = vec::exp(x[c] - mx);
    x[c] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (std::int64_t c = 0; c < len; ++c) x[c] *= inv;
  return mx + std::log(sum);
}

HPM_SIMD_CLONES void probability_row(float* x, std::int64_t len, std::int64_t unmasked, float lse) {
#pragma omp simd
  for (std::int64_t c = 0; c < len; ++c) x[c] = c < unmasked ? vec::exp(x[c] - lse) : 0.0f;
}

std::int64_t row_grain(std::int64_t width) {
  return std::max<std::int64_t>(1, kElementwiseGrain / width);
}

// Delta = rowsum(dO * O) over rows of d.
HPM_SIMD_CLONES void row_dots(const float* g, const float* o, float* delta, std::int64_t rows,
                              std::int64_t d) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (std::int64_t e = 0; e < d; ++e) acc += g[r * d + e] * o[r * d + e];
    delta[r] = acc;
  }
}

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& lse) {
  const Dims n = attention_dims(q, k, v, DType::F32, "attention");
  Tensor out = Tensor::empty(q.shape(), DType::F32, q.device());
  std::vector<std::int64_t> lse_dims(q.shape().dims().begin(), q.shape().dims().end() - 1);
  lse = Tensor::empty(Shape(lse_dims), DType::F32, q.device());
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  float* po = out.data<float>();
  float* pl = lse.data<float>();
  if (materializes(n)) {
    forward_materialized(n, pq, pk, pv, causal, scale, po, pl, q.device());
    return out;
  }
  parallel_for(n.batch, 1, [&](std::int64_t b0, std::int64_t b1) {
    std::vector<float> sc(kBr * kBc), m(kBr), l(kBr);
    for (std::int64_t b = b0; b < b1; ++b) {
      const float* qb = pq + b * n.t * n.d;
      const float* kb = pk + b * n.s * n.d;
      const float* vb = pv + b * n.s * n.d;
      float* ob = po + b * n.t * n.d;
      for (std::int64_t i0 = 0; i0 < n.t; i0 += kBr) {
        const std::int64_t br = std::min(kBr, n.t - i0);
        float* acc = ob + i0 * n.d;  // (br, D): the output rows accumulate in place
        std::fill(acc, acc + br * n.d, 0.0f);
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.0f);
        const std::int64_t end = key_end(causal, i0, br, n.s);
        for (std::int64_t j0 = 0; j0 < end; j0 += kBc) {
          const std::int64_t bc = std::min(kBc, end - j0);
          // S = scale Q_i K_j^T  (br, bc)
          gemm(false, true, br, bc, n.d, scale, qb + i0 * n.d, n.d, kb + j0 * n.d, n.d, 0.0f,
               sc.data(), kBc);
          if (causal && j0 + bc > i0 + 1) mask_tile(sc.data(), i0, br, j0, bc);
          for (std::int64_t r = 0; r < br; ++r) {
            float* row = sc.data() + r * kBc;
            float mx = m[static_cast<std::size_t>(r)];
            for (std::int64_t c = 0; c < bc; ++c) mx = std::max(mx, row[c]);
            // A row that has seen only masked keys so far keeps m = -inf and adds nothing.
            const float shift = mx == kNegInf ? 0.0f : mx;
            const float sum = exp_shifted_sum(row, bc, shift);
            const float rescale = std::exp(m[static_cast<std::size_t>(r)] - shift);
            l[static_cast<std::size_t>(r)] = l[static_cast<std::size_t>(r)] * rescale + sum;
            m[static_cast<std::size_t>(r)] = mx;
            if (rescale != 1.0f)
              for (std::int64_t e = 0; e < n.d; ++e) acc[r * n.d + e] *= rescale;
          }
          // O_i += P V_j  (br, D)
          gemm(false, false, br, n.d, bc, 1.0f, sc.data(), kBc, vb + j0 * n.d, n.d, 1.0f, acc, n.d);
        }
        for (std::int64_t r = 0; r < br; ++r) {
          const float lr = l[static_cast<std::size_t>(r)];
          const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
          for (std::int64_t e = 0; e < n.d; ++e) acc[r * n.d + e] *= inv;
          pl[b * n.t + i0 + r] =
              lr > 0.0f ? m[static_cast<std::size_t>(r)] + std::log(lr) : kNegInf;
        }
      }
    }
  });
  return out;
}

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, float scale,
                        Tensor* grad_q, Tensor* grad_k, Tensor* grad_v) {
  const Dims n = attention_dims(q, k, v, DType::F32, "attention");
  check_shape(grad_out, q.shape(), "attention backward: grad_out");
  // Every gradient is computed (they share the recomputed tiles); the caller drops what it
  // does not need.
  Tensor gq = Tensor::zeros(q.shape(), DType::F32, q.device());
  Tensor gk = Tensor::empty(k.shape(), DType::F32, k.device());
  Tensor gv = Tensor::empty(v.shape(), DType::F32, v.device());
  // Delta = rowsum(dO * O)  (batch, T)
  Tensor delta = Tensor::empty(lse.shape(), DType::F32, q.device());
  row_dots(grad_out.data<float>(), out.data<float>(), delta.data<float>(), n.batch * n.t, n.d);
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  const float* pg = grad_out.data<float>();
  const float* pl = lse.data<float>();
  const float* pd = delta.data<float>();
  float* pgq = gq.data<float>();
  float* pgk = gk.data<float>();
  float* pgv = gv.data<float>();
  if (materializes(n)) {
    backward_materialized(n, pq, pk, pv, pg, pl, pd, causal, scale, pgq, pgk, pgv, q.device());
  } else {
    tiled_backward(n, pq, pk, pv, pg, pl, pd, causal, scale, pgq, pgk, pgv);
  }
  if (grad_q != nullptr) *grad_q = gq;
  if (grad_k != nullptr) *grad_k = gk;
  if (grad_v != nullptr) *grad_v = gv;
}

}  // namespace hpm::cpu
