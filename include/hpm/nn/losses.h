// Losses beyond the primitive ones in hpm/autograd/ops.h (cross_entropy, nll_loss, mse_loss,
// kl_div): knowledge-distillation objectives on temperature-softened distributions.
#pragma once
#include "hpm/autograd/ops.h"

namespace hpm::nn {

// T^2 * KL(softmax(teacher/T) || softmax(student/T)), batch mean (Hinton et al.: the T^2 keeps
// the soft-target gradients on the scale of the hard-label ones). The teacher gets no gradient.
Tensor distillation_kl(const Tensor& student_logits, const Tensor& teacher_logits,
                       float temperature);

// (1 - alpha) * CE(student, labels) + alpha * distillation_kl(student, teacher, T).
Tensor distillation_loss(const Tensor& student_logits, const Tensor& teacher_logits,
                         const Tensor& labels, float alpha, float temperature);

// How many rows of (N, C) logits have their largest value at the label (I64, N): top-1 hits.
std::int64_t top1_correct(const Tensor& logits, const Tensor& labels);

}  // namespace hpm::nn
