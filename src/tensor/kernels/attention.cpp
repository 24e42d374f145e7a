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

#include "hpm/tensor/kernels.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::kernels {

namespace {

constexpr std::int64_t kBr = 64;  // query rows per tile
constexpr std::int64_t kBc = 64;  // key columns per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Dims {
  std::int64_t batch, t, s, d;
};

Dims check(const Tensor& q, const Tensor& k, const Tensor& v) {
  const auto same_batch = [](const Tensor& a, const Tensor& b) {
    if (a.dim() != b.dim()) return false;
    for (int i = 0; i < a.dim() - 2; ++i)
      if (a.size(i) != b.size(i)) return false;
    return true;
  };
  if (q.dim() < 3 || !same_batch(q, k) || !same_batch(q, v) || k.shape() != v.shape() ||
      q.size(-1) != k.size(-1) || q.dtype() != DType::F32 || k.dtype() != DType::F32 ||
      v.dtype() != DType::F32) {
    throw std::invalid_argument(
        "attention: expected float q (..., T, D), k and v (..., S, D) with the same leading "
        "dimensions, got " +
        q.shape().str() + ", " + k.shape().str() + ", " + v.shape().str());
  }
  return {q.numel() / (q.size(-1) * q.size(-2)), q.size(-2), k.size(-2), q.size(-1)};
}

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

// Key tiles a query block [i0, i0 + br) attends to: [0, end).
std::int64_t key_end(bool causal, std::int64_t i0, std::int64_t br, std::int64_t s) {
  return causal ? std::min(s, i0 + br) : s;
}

}  // namespace

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& lse) {
  const Dims n = check(q, k, v);
  Tensor out = Tensor::empty(q.shape(), DType::F32, q.device());
  std::vector<std::int64_t> lse_dims(q.shape().dims().begin(), q.shape().dims().end() - 1);
  lse = Tensor::empty(Shape(lse_dims), DType::F32, q.device());
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  float* po = out.data<float>();
  float* pl = lse.data<float>();
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
  const Dims n = check(q, k, v);
  check_shape(grad_out, q.shape(), "attention backward: grad_out");
  // Every gradient is computed (they share the recomputed tiles); the caller drops what it
  // does not need.
  Tensor gq = Tensor::zeros(q.shape(), DType::F32, q.device());
  Tensor gk = Tensor::empty(k.shape(), DType::F32, k.device());
  Tensor gv = Tensor::empty(v.shape(), DType::F32, v.device());
  // Delta = rowsum(dO * O)  (batch, T)
  Tensor delta = Tensor::empty(lse.shape(), DType::F32, q.device());
  {
    const float* g = grad_out.data<float>();
    const float* o = out.data<float>();
    float* pd = delta.data<float>();
    for (std::int64_t r = 0; r < n.batch * n.t; ++r) {
      float acc = 0.0f;
      for (std::int64_t e = 0; e < n.d; ++e) acc += g[r * n.d + e] * o[r * n.d + e];
      pd[r] = acc;
    }
  }
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  const float* pg = grad_out.data<float>();
  const float* pl = lse.data<float>();
  const float* pd = delta.data<float>();
  float* pgq = gq.data<float>();
  float* pgk = gk.data<float>();
  float* pgv = gv.data<float>();
  parallel_for(n.batch, 1, [&](std::int64_t b0, std::int64_t b1) {
    std::vector<float> p(kBr * kBc), dp(kBr * kBc);
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
          gemm(false, true, br, bc, n.d, scale, qb + i0 * n.d, n.d, kb + j0 * n.d, n.d, 0.0f,
               p.data(), kBc);
          if (causal && j0 + bc > i0 + 1) mask_tile(p.data(), i0, br, j0, bc);
          for (std::int64_t r = 0; r < br; ++r) {
            const float lr = lb[i0 + r];
            float* row = p.data() + r * kBc;
            if (lr == kNegInf) {
              std::fill(row, row + bc, 0.0f);
            } else {
              exp_shifted_sum(row, bc, lr);
            }
          }
          // dV_j += P^T dO_i  (bc, D)
          gemm(true, false, bc, n.d, br, 1.0f, p.data(), kBc, gb + i0 * n.d, n.d, 1.0f, dv, n.d);
          // dP = dO_i V_j^T  (br, bc)
          gemm(false, true, br, bc, n.d, 1.0f, gb + i0 * n.d, n.d, vb + j0 * n.d, n.d, 0.0f,
               dp.data(), kBc);
          // dS = P * (dP - Delta), kept in dp
          for (std::int64_t r = 0; r < br; ++r) {
            const float dr = db[i0 + r];
            for (std::int64_t c = 0; c < bc; ++c)
              dp[static_cast<std::size_t>(r * kBc + c)] =
                  p[static_cast<std::size_t>(r * kBc + c)] *
                  (dp[static_cast<std::size_t>(r * kBc + c)] - dr);
          }
          // dQ_i += scale dS K_j  (br, D);  dK_j += scale dS^T Q_i  (bc, D)
          gemm(false, false, br, n.d, bc, scale, dp.data(), kBc, kb + j0 * n.d, n.d, 1.0f,
               gqb + i0 * n.d, n.d);
          gemm(true, false, bc, n.d, br, scale, dp.data(), kBc, qb + i0 * n.d, n.d, 1.0f, dk, n.d);
        }
      }
    }
  });
  if (grad_q != nullptr) *grad_q = gq;
  if (grad_k != nullptr) *grad_k = gk;
  if (grad_v != nullptr) *grad_v = gv;
}

}  // namespace hpm::kernels
