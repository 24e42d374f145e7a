// Scaled dot-product attention (fused, tiled) and its gradient rule.
// Rules save inputs as they are and outputs detached (an output saving itself would be a
// reference cycle).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include "autograd/ops/common.h"
#include "hpm/autograd/deferred.h"

namespace hpm {

// ---- attention -------------------------------------------------------------------------------

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    float scale) {
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(q.size(-1)));
  Tensor lse;
  if (autocast_precision() == Precision::BF16) {
    // q, k, v rounded once: the products' operands, and what backward keeps.
    const Tensor qb = kernels::to_bf16(q), kb = kernels::to_bf16(k), vb = kernels::to_bf16(v);
    Tensor y = kernels::attention_forward(qb, kb, vb, causal, scale, lse);
    return record("AttentionBF16", {q, k, v}, y,
                  [qb, kb, vb, ys = SavedActivation(y.detach()), lse, causal, scale](
                      const Tensor& g, const Needs& n) {
                    Tensor gq, gk, gv;
                    kernels::attention_backward(g, qb, kb, vb, ys.kept(), lse, causal, scale,
                                                n[0] ? &gq : nullptr, n[1] ? &gk : nullptr,
                                                n[2] ? &gv : nullptr);
                    return Tensors{gq, gk, gv};
                  });
  }
  Tensor y = kernels::attention_forward(q, k, v, causal, scale, lse);
  return record(
      "Attention", {q, k, v}, y,
      [qs = SavedActivation(q), ks = SavedActivation(k), vs = SavedActivation(v),
       ys = SavedActivation(y.detach()), lse, causal, scale](const Tensor& g, const Needs& n) {
        Tensor gq, gk, gv;
        kernels::attention_backward(g, qs.get(), ks.get(), vs.get(), ys.get(), lse, causal, scale,
                                    n[0] ? &gq : nullptr, n[1] ? &gk : nullptr,
                                    n[2] ? &gv : nullptr);
        return Tensors{gq, gk, gv};
      });
}

Tensor packed_self_attention(const Tensor& qkv, std::int64_t heads, bool causal, float scale) {
  const bool bf16 = autocast_precision() == Precision::BF16;
  Tensor q, k, v, lse;
  kernels::split_qkv_heads(qkv, heads, bf16 ? DType::BF16 : DType::F32, q, k, v);
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(q.size(-1)));
  if (bf16) {
    Tensor y = kernels::attention_forward(q, k, v, causal, scale, lse);
    return record("PackedAttentionBF16", {qkv}, kernels::merge_heads(y),
                  [q, k, v, ys = SavedActivation(y), lse, causal, scale, heads](const Tensor& g,
                                                                                const Needs&) {
                    Tensor gq, gk, gv;
                    kernels::attention_backward(kernels::split_heads(g, heads), q, k, v, ys.kept(),
                                                lse, causal, scale, &gq, &gk, &gv);
                    return Tensors{kernels::merge_qkv_heads(gq, gk, gv)};
                  });
  }
  Tensor y = kernels::attention_forward(q, k, v, causal, scale, lse);
  return record(
      "PackedAttention", {qkv}, kernels::merge_heads(y),
      [qs = SavedActivation(q), ks = SavedActivation(k), vs = SavedActivation(v),
       ys = SavedActivation(y), lse, causal, scale, heads](const Tensor& g, const Needs&) {
        Tensor gq, gk, gv;
        kernels::attention_backward(kernels::split_heads(g, heads), qs.get(), ks.get(), vs.get(),
                                    ys.get(), lse, causal, scale, &gq, &gk, &gv);
        return Tensors{kernels::merge_qkv_heads(gq, gk, gv)};
      });
}

}  // namespace hpm
