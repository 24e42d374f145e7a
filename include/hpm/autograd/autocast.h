// Mixed precision, decided in one place: the precision this thread's ops compute in, set by a
// scope (as torch.autocast), and the rule of which ops follow it.
//
//   {
//     autograd::AutocastScope bf16(autograd::Precision::BF16);  // throws without AVX512_BF16
//     Tensor loss = objective.loss(model.forward(x), y);        // GEMMs in bf16
//     loss.backward();                                           // theirs too
//   }
//
// The rule under BF16:
//   - products (linear, 2-D matmul) take bf16 operands and accumulate in f32, through oneDNN;
//     they keep their inputs for backward in bf16 (half the bytes of the activations they save);
//     a Linear's input gradient is rounded to bf16 as its product writes it, as torch.autocast's
//     is (its product's output is bf16, and so that gradient): the norm, attention or GELU
//     before it reads half the bytes (its weight's and bias's gradients stay f32);
//   - convolutions take bf16 operands and accumulate in f32 (oneDNN), keeping f32 inputs and
//     rounding their output to bf16 (as torch.autocast), where each output sums at least 32
//     products (C_in x KH x KW; a 3x3 over one channel stays f32: bf16 saves it nothing and the
//     conversions of its output and gradient cost); the fused Conv2d + ReLU + MaxPool2d 2x2/2
//     takes bf16 at any size: it has no such conversions, and it halves the bytes its pooling
//     reads and its unpooling writes;
//   - the fused attention's products take bf16 operands (q, k, v rounded once and kept so for
//     backward; the probabilities, dO and dS rounded for their products) and accumulate in f32;
//     its softmax, output and gradients are f32;
//   - everything else computes in f32: softmax, normalizations, losses, reductions, element-wise
//     ops, and (in this version) batched matmuls; of those, layer norm and GELU keep their inputs
//     for backward as bf16 copies, as attention keeps its output, which their backward kernels
//     read as they are: with the products' inputs, a transformer's saved activations are bf16;
//   - parameters, their gradients and the optimizer state stay f32 (the master weights): a
//     product converts its weight when it runs, once a training step (weight_cast.h).
// Outputs are f32 tensors either way, so nothing outside the products sees a bf16 tensor, with
// one exception that its consumer asks for: a language model's logits, which its objective's
// cross-entropy and accuracy read as they are (Bf16OutputsScope below).
// Two savings keep that rule's values (autograd/ops/fused_linear.cpp, node.h's Bf16Grad): GELU,
// layer norm and attention write the next product's bf16 operand in the pass that computes
// them, and a gradient a product's rule would round first thing is handed to it in bf16.
// HPM_BF16_FUSIONS=0 (or set_bf16_fusions(false)) runs the compositions instead: the same values
// on the CPU, for an A/B of the passes saved, or a fallback on a device.
#pragma once
#include <string>

namespace hpm::autograd {

enum class Precision { F32, BF16 };

// "f32" or "bf16"; parse_precision throws std::invalid_argument naming the value otherwise.
Precision parse_precision(const std::string& name);
const char* precision_name(Precision p);

// This thread's precision (F32 outside any scope).
Precision autocast_precision();

// Sets this thread's precision until destroyed (nests; restores the previous one). BF16 on a CPU
// without AVX512_BF16 throws std::runtime_error naming the missing instruction set: oneDNN would
// emulate it several times slower than f32, never a silent choice.
class AutocastScope {
 public:
  explicit AutocastScope(Precision p);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  Precision previous_;
};

// Throws the error above when bf16 is not native here; config checks call it before training.
void require_native_bf16();

// Whether a model may hand its outputs to its objective in bf16 (GPT's logits: the classifier's
// product writes them so, as under torch.autocast; half the bytes of the step's largest tensor,
// written once and read by the loss, its gradient and the accuracy): true under BF16 with the
// fusions on, inside a Bf16OutputsScope that allows it. A training step opens one for its forward
// and backward where its objective reads bf16 outputs (nn::Objective::reads_bf16_outputs);
// nowhere else (evaluation, sampling, distillation's losses) does a model output bf16.
bool bf16_outputs();
class Bf16OutputsScope {
 public:
  explicit Bf16OutputsScope(bool allowed);
  ~Bf16OutputsScope();
  Bf16OutputsScope(const Bf16OutputsScope&) = delete;
  Bf16OutputsScope& operator=(const Bf16OutputsScope&) = delete;

 private:
  bool previous_;
};

// Whether the fused products and bf16 gradients above are on (every thread; HPM_BF16_FUSIONS=0
// at start turns them off).
bool bf16_fusions();
void set_bf16_fusions(bool on);
// Whether a layer norm's backward writes the bf16 copy of the residual stream's gradient that the
// bf16 product receiving it takes (node.h's offer_bf16_copy; every thread; on with the fusions,
// HPM_BF16_GRADIENT_COPIES=0 at start turns it off: the A/B of the rounding pass it saves).
bool bf16_gradient_copies();
void set_bf16_gradient_copies(bool on);
// An A/B switch of the environment (HPM_BF16_FUSIONS and the like): on unless `name` is "0".
bool env_switch_on(const char* name);

}  // namespace hpm::autograd
