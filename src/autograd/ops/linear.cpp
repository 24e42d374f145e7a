// Products (matmul, batched matmul, Linear; bf16 under autocast) and their gradient rules; the
// Linear's parameter gradients (linear_gradients), shared with fused_linear.cpp's products.
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

// ---- linear algebra --------------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2) {
    const Shape sa = a.shape(), sb = b.shape();
    return record("BatchedMatMul", {a, b}, kernels::bmm(a, b),
                  [a, b, sa, sb](const Tensor& g, const Needs& n) {
                    // dA = G B^T, dB = A^T G, each summed over the batch dimensions it was
                    // broadcast along.
                    return Tensors{
                        n[0] ? kernels::sum_to(kernels::bmm(g, b, false, true), sa) : Tensor(),
                        n[1] ? kernels::sum_to(kernels::bmm(a, g, true, false), sb) : Tensor()};
                  });
  }
  if (autocast_precision() == Precision::BF16) {
    // Operands kept in bf16 for backward: dA = G B^T, dB = A^T G with G rounded to bf16.
    const Tensor ab = kernels::to_bf16(a), bb = kernels::to_bf16(b);
    return record("MatMulBF16", {a, b}, kernels::matmul(ab, bb),
                  [ab, bb](const Tensor& g, const Needs& n) {
                    const Tensor gb = bf16_gradient(g);
                    return Tensors{n[0] ? kernels::matmul(gb, bb, false, true) : Tensor(),
                                   n[1] ? kernels::matmul(ab, gb, true, false) : Tensor()};
                  });
  }
  return record("MatMul", {a, b}, kernels::matmul(a, b), [a, b](const Tensor& g, const Needs& n) {
    // dA = G B^T, dB = A^T G
    return Tensors{n[0] ? kernels::matmul(g, b, false, true) : Tensor(),
                   n[1] ? kernels::matmul(a, g, true, false) : Tensor()};
  });
}

namespace {

// What the engine would do with a gradient for `leaf`: its accumulator adds it (hooks included).
void add_to_leaf(const Tensor& leaf, const Tensor& grad) {
  if (!grad.defined()) return;
  autograd::gradient_edge(leaf).fn->apply(Tensors{grad});
}

// A Linear's dW = gp^T xp and db = g's rows summed, each when needed (gp and xp are g and x as the
// product takes them: the f32 ones, or both rounded to bf16). dW is added by the product itself
// into W's gradient when that is the same thing (see accumulate_into), else returned. With both
// needed, one product whose epilogue sums gp's rows (linear_param_grads_).
Tensors param_gradients(const Tensor& g, const Tensor& gp, const Tensor& xp, const Tensor& weight,
                        bool need_w, bool need_b) {
  if (!need_w) {
    if (!need_b) return Tensors{Tensor(), Tensor()};
    return Tensors{Tensor(),
                   kernels::sum_dim(g.dtype() == DType::BF16 ? kernels::to_f32(g) : g, 0, false)};
  }
  Tensor acc = accumulate_into(weight);
  const bool into = acc.defined() && acc.shape() == weight.shape();
  if (!need_b) {
    if (!into) return Tensors{kernels::matmul(gp, xp, true, false), Tensor()};
    kernels::matmul_add_(acc, gp, xp, true, false);
    return Tensors{Tensor(), Tensor()};
  }
  if (into) return Tensors{Tensor(), kernels::linear_param_grads_(acc, gp, xp, true)};
  Tensor dw = Tensor::empty(weight.shape(), DType::F32, gp.device());
  Tensor db = kernels::linear_param_grads_(dw, gp, xp, false);
  return Tensors{std::move(dw), std::move(db)};
}

}  // namespace

// What a Linear's backward does after dx: dW and db now, or, in a zero-bubble pipeline's B pass,
// queued for its W pass. Shared by the f32 and bf16 Linears.
Tensors autograd::rules::linear_gradients(const Tensor& g, const Tensor& gp, const Tensor& xp,
                                          const Needs& n, Tensor gx, const Tensor& weight,
                                          const Tensor& bias) {
  autograd::DeferredWeightGradients* later = autograd::deferred_weight_gradients();
  if (later != nullptr && (n[1] || n[2]) && (!n[1] || weight.is_leaf()) &&
      (!n[2] || bias.is_leaf())) {
    later->push([g, gp, xp, weight, bias, nw = n[1], nb = n[2]] {
      const Tensors wb = param_gradients(g, gp, xp, weight, nw, nb);
      if (nw) add_to_leaf(weight, wb[0]);
      if (nb) add_to_leaf(bias, wb[1]);
    });
    return Tensors{std::move(gx), Tensor(), Tensor()};
  }
  Tensors wb = param_gradients(g, gp, xp, weight, n[1], n[2]);
  return Tensors{std::move(gx), std::move(wb[0]), std::move(wb[1])};
}

namespace {

// A Linear under bf16 autocast (autocast.h): x and W rounded to bf16 for the product, x kept so
// for backward, which rounds g too and W again (a weight is not an activation: rounding it twice
// costs less than keeping a copy per use); bias and outputs f32, dW and db f32 (db summed from the
// rounded g when the same product computes dW), dx rounded to bf16 as the product writes it
// (torch.autocast's: its product's output is bf16, and so its input's gradient; the engine widens
// it for a rule that does not take it). It takes a BF16 gradient as it is (Bf16Grad).
Tensor linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor xb = kernels::to_bf16(x);
  Tensor y = kernels::linear(xb, bf16_parameter(weight), bias);
  return record(
      "LinearBF16", {x, weight, bias}, y,
      [xb, weight, bias](const Tensor& g, const Needs& n) {
        const Tensor gb = bf16_gradient(g);
        return linear_gradients(
            g, gb, xb, n,
            n[0] ? kernels::matmul(gb, bf16_parameter(weight), false, false, DType::BF16)
                 : Tensor(),
            weight, bias);
      },
      Bf16Grad::kTaken);
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (autocast_precision() == Precision::BF16) return linear_bf16(x, weight, bias);
  Tensor y = kernels::linear(x, weight, bias);
  return record("Linear", {x, weight, bias}, y, [x, weight, bias](const Tensor& g, const Needs& n) {
    // g(N,OUT): dx = g W (N,IN), dW = g^T x (OUT,IN), db = sum_rows g (OUT)
    return linear_gradients(g, g, x, n, n[0] ? kernels::matmul(g, weight) : Tensor(), weight, bias);
  });
}

}  // namespace hpm
