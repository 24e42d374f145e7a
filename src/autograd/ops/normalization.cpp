// Normalization, embedding and dropout and their gradient rules.
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

// ---- normalization, embedding, dropout -------------------------------------------------------

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, float momentum, float eps) {
  Tensor mean, invstd;
  Tensor y = kernels::batch_norm_forward(x, weight, bias, running_mean, running_var, training,
                                         momentum, eps, mean, invstd);
  return record("BatchNorm", {x, weight, bias}, y,
                [x, weight, mean, invstd, training](const Tensor& g, const Needs& n) {
                  Tensor gx, gw, gb;
                  kernels::batch_norm_backward(g, x, weight, mean, invstd, training,
                                               n[0] ? &gx : nullptr, n[1] ? &gw : nullptr,
                                               n[2] ? &gb : nullptr);
                  return Tensors{gx, gw, gb};
                });
}

Tensor layer_norm(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                  const Tensor& bias, float eps) {
  Tensor mean, rstd;
  Tensor y = kernels::layer_norm_forward(x, normalized, weight, bias, eps, mean, rstd);
  // x's gradient rounded by the same pass where a bf16 product takes it next (node.h).
  const bool copy_wanted = bf16_copy_wanted(x);
  return record("LayerNorm", {x, weight, bias}, y,
                [xs = SavedActivation(x), normalized, weight, mean, rstd, copy_wanted](
                    const Tensor& g, const Needs& n) {
                  // x's gradient added into what its other consumers summed (a residual stream's
                  // skip path): no pass of the engine's to add the two.
                  Tensor gx = n[0] ? take_pending_gradient(0, xs.kept().shape()) : Tensor();
                  Tensor gw, gb, gx_bf16;
                  const bool copy = copy_wanted && n[0] && completes_gradient(0);
                  kernels::layer_norm_backward(g, xs.kept(), normalized, weight, mean, rstd,
                                               n[0] ? &gx : nullptr, n[1] ? &gw : nullptr,
                                               n[2] ? &gb : nullptr, copy ? &gx_bf16 : nullptr);
                  if (copy) offer_bf16_copy(gx, gx_bf16);
                  return Tensors{gx, gw.defined() ? gw.reshape(weight.shape()) : gw,
                                 gb.defined() ? gb.reshape(weight.shape()) : gb};
                });
}

Tensor embedding(const Tensor& table, const Tensor& indices) {
  return record("Embedding", {table}, kernels::embedding_forward(table, indices),
                [table, indices](const Tensor& g, const Needs&) {
                  // Added into the gradient already summed for the table where there is one (a
                  // tied classifier's, whose rule runs first): no zeros of the table's size, and
                  // no pass adding the two (GPT-2's: 38.6M elements each).
                  Tensor gt = take_pending_gradient(0, table.shape());
                  if (!gt.defined()) gt = Tensor::zeros(table.shape(), DType::F32, table.device());
                  kernels::embedding_backward(g, indices, gt);
                  return Tensors{gt};
                });
}

Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  if (p < 0.0f || p >= 1.0f) {
    throw std::invalid_argument("dropout probability must be in [0, 1), got " + std::to_string(p));
  }
  if (!training || p == 0.0f) return x;
  return mul(x, kernels::dropout_mask(x.shape(), p, gen));
}

}  // namespace hpm
