// Softmax and the losses and their gradient rules.
// Rules save inputs as they are and outputs detached (an output saving itself would be a
// reference cycle).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "autograd/ops/common.h"
#include "hpm/autograd/deferred.h"
#include "hpm/autograd/grad_mode.h"

namespace hpm {

// ---- softmax and losses ----------------------------------------------------------------------

Tensor softmax(const Tensor& x, int dim) {
  Tensor y = kernels::softmax(x, dim);
  Tensor yd = y.detach();
  return record("Softmax", {x}, y, [yd, dim](const Tensor& g, const Needs&) {
    return Tensors{kernels::softmax_backward(g, yd, dim)};
  });
}

Tensor log_softmax(const Tensor& x, int dim) {
  Tensor y = kernels::log_softmax(x, dim);
  Tensor yd = y.detach();
  return record("LogSoftmax", {x}, y, [yd, dim](const Tensor& g, const Needs&) {
    return Tensors{kernels::log_softmax_backward(g, yd, dim)};
  });
}

Tensor masked_softmax(const Tensor& x, const Tensor& mask, int dim) {
  return softmax(masked_fill(x, mask, -std::numeric_limits<float>::infinity()), dim);
}

namespace {

thread_local bool spent_outputs = false;

// Whether cross_entropy may write the logits' gradient in its forward (HPM_FUSED_CROSS_ENTROPY=0
// at start: never, the A/B of the pass it saves).
bool fused_cross_entropy() {
  static const bool on = autograd::env_switch_on("HPM_FUSED_CROSS_ENTROPY");
  return on;
}

// Whether the gradient of spent logits can be written over them in the forward: wanted, of their
// dtype (a bf16 product's rule takes it in bf16), and their memory held by this tensor alone (a
// view of it, or another handle, may still be read).
bool gradient_over_logits(const Tensor& logits, bool bf16_grad) {
  return fused_cross_entropy() && autograd::grad_enabled() && logits.requires_grad() &&
         (logits.dtype() == DType::BF16) == bf16_grad && logits.impl_ptr().use_count() == 1 &&
         logits.impl()->storage.use_count() == 1;
}

}  // namespace

bool outputs_spent() { return spent_outputs; }
OutputsSpentScope::OutputsSpentScope(bool spent) : previous_(spent_outputs) {
  spent_outputs = spent;
}
OutputsSpentScope::~OutputsSpentScope() { spent_outputs = previous_; }

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, float label_smoothing,
                     std::int64_t ignore_index, Tensor* predicted, bool logits_spent) {
  if (label_smoothing < 0.0f || label_smoothing > 1.0f) {
    throw std::invalid_argument("label_smoothing must be in [0, 1]");
  }
  // The logits' gradient in bf16 when it goes to a bf16 product's rule (a classifier under bf16
  // autocast), which would round it first thing: half the bytes written, no rounding pass there.
  const bool bf16_grad = bf16_gradient_taken(logits);
  if (logits_spent && gradient_over_logits(logits, bf16_grad)) {
    Tensor gradient = logits.detach();  // their memory, which nothing reads after this
    const Tensor loss = kernels::cross_entropy_with_gradient_(gradient, labels, label_smoothing,
                                                              ignore_index, predicted);
    // Scaled in place, once: the engine runs a rule once (a second backward is its error).
    return record("CrossEntropy", {logits}, loss, [gradient](const Tensor& g, const Needs&) {
      Tensor gx = gradient;
      kernels::scale_by_(gx, g);
      return Tensors{gx};
    });
  }
  // The backward keeps the logits and two numbers a row, not a (rows, C) tensor of probabilities.
  Tensor stats;
  Tensor loss = kernels::cross_entropy_forward(logits, labels, label_smoothing, stats, ignore_index,
                                               predicted);
  const Tensor kept = logits.detach();
  return record("CrossEntropy", {logits}, loss,
                [kept, stats, labels, label_smoothing, ignore_index, bf16_grad](const Tensor& g,
                                                                                const Needs&) {
                  // When nothing but this backward holds the logits' memory (the training step
                  // dropped its outputs), the gradient is written over them where it has their
                  // dtype: no second (rows, C) tensor. Else someone may still read them, and they
                  // stay as they are.
                  const bool sole = kept.impl()->storage.use_count() == 1;
                  if (bf16_grad) {
                    return Tensors{kernels::cross_entropy_backward_bf16(
                        kept, stats, labels, label_smoothing, g, ignore_index, sole)};
                  }
                  return Tensors{kernels::cross_entropy_backward(
                      kept, stats, labels, label_smoothing, g, ignore_index, sole)};
                });
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& labels) {
  const Shape s = log_probs.shape();
  return record("NllLoss", {log_probs}, kernels::nll_loss_forward(log_probs, labels),
                [labels, s](const Tensor& g, const Needs&) {
                  return Tensors{kernels::nll_loss_backward(g, labels, s)};
                });
}

Tensor mse_loss(const Tensor& input, const Tensor& target) {
  check_shape(target, input.shape(), "mse_loss: target");
  return mean(square(sub(input, target)));
}

Tensor kl_div(const Tensor& input_log_probs, const Tensor& target_probs) {
  return record("KlDiv", {input_log_probs, target_probs},
                kernels::kl_div_forward(input_log_probs, target_probs),
                [input_log_probs, target_probs](const Tensor& g, const Needs& n) {
                  Tensor gx, gt;
                  kernels::kl_div_backward(g, input_log_probs, target_probs, n[0] ? &gx : nullptr,
                                           n[1] ? &gt : nullptr);
                  return Tensors{gx, gt};
                });
}

}  // namespace hpm
