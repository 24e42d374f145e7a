// Products whose operand is made by the op before them, fused with it under bf16 autocast: the op
// writes the product's bf16 operand (and the bf16 copy of what its backward reads) in one pass,
// where the composition writes its f32 output, rounds it for the product and rounds its input
// for backward: GELU, layer norm and attention, each followed by a Linear. Each is bit-identical to
// its composition (values and gradients); outside bf16 autocast it is the composition.
//
// A norm's product may also write its output in bf16 (out = BF16) for the fused op after it: for
// a GELU (the rounding PyTorch's autocast makes there), which reads and keeps that bf16 output and
// whose backward takes the next product's input gradient in bf16 too, as autocast's would; for the
// packed attention, whose heads were rounded on the split anyway (the same values).
#include <cmath>
#include <string>
#include <utility>

#include "autograd/ops/common.h"

namespace hpm {

namespace {

// Whether the fused path runs for an f32 input x: under bf16 autocast with the fusions on.
bool fusing(const Tensor& x) {
  return autocast_precision() == Precision::BF16 && autograd::bf16_fusions() &&
         x.dtype() == DType::F32;
}

// Whether x is a product's bf16 output (layer_norm_linear with out BF16, made only when fusing);
// a BF16 x anywhere else is an error naming `op`.
bool bf16_product_output(const Tensor& x, const char* op) {
  if (x.dtype() != DType::BF16) return false;
  if (autocast_precision() != Precision::BF16 || !autograd::bf16_fusions()) {
    throw std::invalid_argument(std::string(op) + ": a BF16 input outside bf16 autocast's fusions");
  }
  return true;
}

}  // namespace

Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& residual) {
  const bool bf16_x = bf16_product_output(x, "gelu_linear");
  const bool fused_residual = residual.defined() && residual.dtype() == DType::F32 &&
                              residual.shape() == Shape{x.size(0), weight.size(0)};
  if (residual.defined() && (!fused_residual || (!bf16_x && !fusing(x))))
    return add(residual, gelu_linear(x, weight, bias));
  if (!bf16_x && !fusing(x)) return linear(gelu(x), weight, bias);
  // One pass over x makes the product's operand and the bf16 copy of x that GELU's backward
  // reads (what gelu() would keep under autocast): to_bf16 of GELU's output and of its input are
  // no passes of their own, and GELU's f32 output is never written. A BF16 x is its own copy.
  Tensor xb;
  const Tensor ab = kernels::unary_bf16(UnaryOp::Gelu, x, &xb);
  Tensor y = kernels::linear(ab, bf16_parameter(weight), bias, DType::F32, residual);
  // x's gradient in bf16 when it goes to a bf16 product's rule (in a GPT, the fc product's), which
  // would round it first thing: half the bytes written, and no rounding pass there.
  const bool bf16_dx = bf16_gradient_taken(x);
  return record(
      "GeluLinearBF16", {x, weight, bias, residual}, y,
      [xb, ab, weight, bias, bf16_dx](const Tensor& g, const Needs& n) {
        const Tensor gb = bf16_gradient(g);
        Tensor dx;
        if (n[0]) {
          // GELU's output gradient rounded to bf16 as the product writes it (linear_bf16's dx).
          const Tensor da = kernels::matmul(gb, bf16_parameter(weight), false, false, DType::BF16);
          dx = bf16_dx ? kernels::unary_backward_bf16(UnaryOp::Gelu, da, xb, Tensor())
                       : kernels::unary_backward(UnaryOp::Gelu, da, xb, Tensor());
        }
        Tensors grads = linear_gradients(g, gb, ab, n, std::move(dx), weight, bias);
        // The residual's: the output's gradient as it is (the sum's rule), in f32 as the
        // residual is.
        if (n.size() > 3) grads.push_back(n[3] ? kernels::to_f32(g) : Tensor());
        return grads;
      },
      Bf16Grad::kTaken);
}

namespace {

// Records linear(layer_norm(x)) under bf16 autocast from what its forward made: the product's
// operand yb, x's bf16 copy xb and the norm's statistics.
Tensor record_layer_norm_linear(const Tensor& x, const Tensor& xb, const Tensor& yb,
                                const Tensor& mean, const Tensor& rstd, const Tensor& ln_weight,
                                const Tensor& ln_bias, const Tensor& weight, const Tensor& bias,
                                DType out) {
  const std::int64_t normalized = x.size(1);
  Tensor y = kernels::linear(yb, bf16_parameter(weight), bias, out);
  // x's gradient (a residual stream's) goes on to a bf16 product that would round it: the norm's
  // backward writes that rounding as it writes the gradient.
  const bool copy_wanted = bf16_copy_wanted(x);
  return record(
      "LayerNormLinearBF16", {x, ln_weight, ln_bias, weight, bias}, y,
      [xb, yb, mean, rstd, normalized, ln_weight, weight, bias, copy_wanted](const Tensor& g,
                                                                             const Needs& n) {
        const Tensor gb = bf16_gradient(g);
        // Added into x's pending gradient, as layer_norm's rule does.
        Tensor gx = n[0] ? take_pending_gradient(0, xb.shape()) : Tensor();
        Tensor gw, gbias, gx_bf16;
        const bool copy = copy_wanted && n[0] && completes_gradient(0);
        if (n[0] || n[1] || n[2]) {
          // The norm's output gradient rounded to bf16 as the product writes it (linear_bf16's
          // dx), read by the norm's backward as it is: half the bytes each way.
          kernels::layer_norm_backward(
              kernels::matmul(gb, bf16_parameter(weight), false, false, DType::BF16), xb,
              normalized, ln_weight, mean, rstd, n[0] ? &gx : nullptr, n[1] ? &gw : nullptr,
              n[2] ? &gbias : nullptr, copy ? &gx_bf16 : nullptr);
        }
        if (copy) offer_bf16_copy(gx, gx_bf16);
        Tensors product =
            linear_gradients(g, gb, yb, Needs{false, n[3], n[4]}, Tensor(), weight, bias);
        return Tensors{std::move(gx), gw.defined() ? gw.reshape(ln_weight.shape()) : gw,
                       gbias.defined() ? gbias.reshape(ln_weight.shape()) : gbias,
                       std::move(product[1]), std::move(product[2])};
      },
      Bf16Grad::kTaken);
}

}  // namespace

Tensor layer_norm_linear(const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, float eps,
                         const Tensor& weight, const Tensor& bias, DType out) {
  if (!fusing(x) || x.dim() != 2) {  // out applies to the fused path alone
    return linear(layer_norm(x, x.size(-1), ln_weight, ln_bias, eps), weight, bias);
  }
  // One pass over x makes the product's operand and the bf16 copy of x the norm's backward reads
  // (what layer_norm() keeps under autocast): neither rounding is a pass of its own, and the
  // norm's f32 output is never written.
  Tensor mean, rstd, xb;
  const Tensor yb =
      kernels::layer_norm_forward_bf16(x, x.size(1), ln_weight, ln_bias, eps, mean, rstd, &xb);
  return record_layer_norm_linear(x, xb, yb, mean, rstd, ln_weight, ln_bias, weight, bias, out);
}

Tensor residual_layer_norm_linear(const Tensor& a, const Tensor& b, Tensor& sum,
                                  const Tensor& ln_weight, const Tensor& ln_bias, float eps,
                                  const Tensor& weight, const Tensor& bias, DType out) {
  if (!fusing(a) || a.dim() != 2 || b.dtype() != DType::F32 || b.shape() != a.shape()) {
    sum = add(a, b);
    return layer_norm_linear(sum, ln_weight, ln_bias, eps, weight, bias, out);
  }
  // The sum, the norm's bf16 output and the sum's bf16 copy from one pass over a and b: add's
  // output is not read again by the norm. Recorded as add() and layer_norm_linear() record
  // themselves (the same gradients).
  Tensor s, mean, rstd, sb;
  const Tensor yb = kernels::add_layer_norm_forward_bf16(a, b, a.size(1), ln_weight, ln_bias, eps,
                                                         s, mean, rstd, &sb);
  sum = record("Add", {a, b}, s, [](const Tensor& g, const Needs& n) {
    return Tensors{n[0] ? g : Tensor(), n[1] ? g : Tensor()};
  });
  if (sum.grad_fn()) sum.grad_fn()->hands_gradient_on = true;
  return record_layer_norm_linear(sum, sb, yb, mean, rstd, ln_weight, ln_bias, weight, bias, out);
}

Tensor packed_self_attention_linear(const Tensor& qkv, std::int64_t heads, bool causal,
                                    const Tensor& weight, const Tensor& bias) {
  // A BF16 qkv's heads are its bits moved: the rounding the F32 split would make.
  const bool bf16_qkv = bf16_product_output(qkv, "packed_self_attention_linear");
  if (bf16_qkv && qkv.dim() != 3) {
    throw std::invalid_argument("packed_self_attention_linear: expected a (B, T, 3E) qkv, got " +
                                qkv.shape().str());
  }
  if (!bf16_qkv && (!fusing(qkv) || qkv.dim() != 3)) {
    const Tensor merged = packed_self_attention(qkv, heads, causal);
    const std::int64_t b = merged.size(0), t = merged.size(1);
    return reshape(linear(reshape(merged, {b * t, merged.size(2)}), weight, bias),
                   {b, t, weight.size(0)});
  }
  // The attention reads the heads where the qkv product put them and writes its output merged
  // and rounded for the next product, which is also what its backward reads (the bf16 copy
  // autocast keeps): no split or merge pass, and no copy of q, k, v or the output kept.
  const std::int64_t d = qkv.size(2) / (3 * heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // An F32 qkv (a product that wrote f32) is rounded once here: the values the split rounded.
  const Tensor qkv_bf16 = (qkv.dtype() == DType::BF16 ? qkv : kernels::to_bf16(qkv)).detach();
  Tensor lse;
  const Tensor merged = kernels::packed_attention_forward_bf16(qkv_bf16, heads, causal, scale, lse);
  const std::int64_t b = merged.size(0), t = merged.size(1), e = merged.size(2);
  const Tensor rows = merged.reshape({b * t, e});
  Tensor y = kernels::linear(rows, bf16_parameter(weight), bias).reshape({b, t, weight.size(0)});
  // qkv's gradient in bf16 when it goes to a bf16 product's rule (the qkv product's).
  const bool bf16_dqkv = bf16_gradient_taken(qkv);
  return record(
      "PackedAttentionLinearBF16", {qkv, weight, bias}, y,
      [qkv_bf16, merged, lse, rows, causal, scale, heads, weight, bias, bf16_dqkv](const Tensor& g,
                                                                                   const Needs& n) {
        const Tensor g2 = g.reshape({rows.size(0), weight.size(0)});
        const Tensor gb = bf16_gradient(g2);
        Tensor gqkv;
        if (n[0]) {
          // The attention's output gradient rounded to bf16 as the product writes it
          // (linear_bf16's dx): the operand of its backward's products as it is.
          const Tensor d_merged =
              kernels::matmul(gb, bf16_parameter(weight), false, false, DType::BF16)
                  .reshape(merged.shape());
          gqkv = kernels::packed_attention_backward(d_merged, qkv_bf16, merged, lse, heads, causal,
                                                    scale, bf16_dqkv ? DType::BF16 : DType::F32);
        }
        return linear_gradients(g2, gb, rows, n, std::move(gqkv), weight, bias);
      },
      Bf16Grad::kTaken);
}

}  // namespace hpm
