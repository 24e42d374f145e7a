// What every file of autograd's gradient rules (this folder) shares: SavedActivation (autocast.h's
// rule for what backward keeps), a Linear's parameter gradients and the names of the recording
// helpers.
#pragma once
#include <vector>

#include "hpm/autograd/autocast.h"
#include "hpm/autograd/node.h"
#include "hpm/autograd/ops.h"
#include "hpm/autograd/weight_cast.h"
#include "hpm/tensor/kernels.h"

namespace hpm::autograd::rules {

using Needs = std::vector<bool>;

// An activation kept for backward, as autocast.h's rule says: under bf16 a bf16 copy (half the
// bytes), widened back to f32 when backward needs it; otherwise the tensor itself.
class SavedActivation {
 public:
  explicit SavedActivation(const Tensor& x)
      : rounded_(autocast_precision() == Precision::BF16 && x.dtype() == DType::F32),
        t_(rounded_ ? kernels::to_bf16(x) : x) {}
  Tensor get() const { return rounded_ ? kernels::to_f32(t_) : t_; }
  // As kept (BF16 when rounded), for a kernel that reads either dtype: no widening pass.
  const Tensor& kept() const { return t_; }

 private:
  bool rounded_;
  Tensor t_;
};

// What a Linear's backward does after dx (gx, returned first): dW = gp^T xp and db = g's rows
// summed, now or, in a zero-bubble pipeline's B pass, queued for its W pass; gp and xp are g and
// x as the product took them (f32, or both rounded to bf16). n: needs of (x, weight, bias).
Tensors linear_gradients(const Tensor& g, const Tensor& gp, const Tensor& xp, const Needs& n,
                         Tensor gx, const Tensor& weight, const Tensor& bias);

}  // namespace hpm::autograd::rules

// The names every rule file uses, for the files of this folder alone.
namespace hpm {
using autograd::accumulate_into;
using autograd::autocast_precision;
using autograd::bf16_copy_wanted;
using autograd::bf16_gradient;
using autograd::bf16_gradient_taken;
using autograd::bf16_parameter;
using autograd::Bf16Grad;
using autograd::completes_gradient;
using autograd::offer_bf16_copy;
using autograd::Precision;
using autograd::record;
using autograd::take_pending_gradient;
using autograd::Tensors;
using autograd::rules::linear_gradients;
using autograd::rules::Needs;
using autograd::rules::SavedActivation;
using kernels::BinaryOp;
using kernels::UnaryOp;
}  // namespace hpm
