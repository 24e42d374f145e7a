#include "hpm/nn/losses.h"

#include <stdexcept>
#include <string>

#include "hpm/autograd/grad_mode.h"
#include "hpm/tensor/kernels.h"

namespace hpm::nn {

Tensor distillation_kl(const Tensor& student_logits, const Tensor& teacher_logits,
                       float temperature) {
  if (!(temperature > 0.0f)) {
    throw std::invalid_argument("distillation temperature must be positive, got " +
                                std::to_string(temperature));
  }
  check_shape(teacher_logits, student_logits.shape(), "distillation: teacher logits");
  const float inv_t = 1.0f / temperature;
  Tensor soft_targets;
  {
    NoGradGuard no_grad;
    soft_targets = softmax(mul(teacher_logits.detach(), inv_t), -1);
  }
  Tensor log_student = log_softmax(mul(student_logits, inv_t), -1);
  return mul(kl_div(log_student, soft_targets), temperature * temperature);
}

Tensor distillation_loss(const Tensor& student_logits, const Tensor& teacher_logits,
                         const Tensor& labels, float alpha, float temperature) {
  if (alpha < 0.0f || alpha > 1.0f) {
    throw std::invalid_argument("distillation alpha must be in [0, 1], got " +
                                std::to_string(alpha));
  }
  Tensor hard = cross_entropy(student_logits, labels);
  Tensor soft = distillation_kl(student_logits, teacher_logits, temperature);
  return add(mul(hard, 1.0f - alpha), mul(soft, alpha));
}

std::int64_t top1_correct(const Tensor& logits, const Tensor& labels) {
  const Tensor pred = kernels::argmax_last(logits);
  const std::vector<std::int64_t> p = pred.to_vector_i64(), y = labels.to_vector_i64();
  std::int64_t c = 0;
  for (std::size_t i = 0; i < y.size(); ++i) c += p[i] == y[i];
  return c;
}

}  // namespace hpm::nn
