#include "hpm/optim/lr_schedule.h"

#include <cmath>
#include <stdexcept>

namespace hpm::optim {

StepLr::StepLr(std::int64_t step_size, float gamma) : step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) throw std::invalid_argument("StepLr: step_size must be positive");
}

float StepLr::lr(float base_lr, std::int64_t t) const {
  return base_lr * static_cast<float>(
                       std::pow(static_cast<double>(gamma_), static_cast<double>(t / step_size_)));
}

CosineLr::CosineLr(std::int64_t t_max, float eta_min) : t_max_(t_max), eta_min_(eta_min) {
  if (t_max <= 0) throw std::invalid_argument("CosineLr: t_max must be positive");
}

float CosineLr::lr(float base_lr, std::int64_t t) const {
  const double frac = static_cast<double>(std::min(t, t_max_)) / static_cast<double>(t_max_);
  return static_cast<float>(eta_min_ + (base_lr - eta_min_) * (1.0 + std::cos(M_PI * frac)) / 2.0);
}

WarmupLr::WarmupLr(float start_factor, std::int64_t warmup, std::shared_ptr<LrSchedule> after)
    : start_factor_(start_factor), warmup_(warmup), after_(std::move(after)) {
  // start_factor 0: from nothing, as nanoGPT-style loops (torch_gpt.py's lr * it / warmup).
  if (warmup < 0 || start_factor < 0.0f || start_factor > 1.0f) {
    throw std::invalid_argument("WarmupLr: need warmup >= 0 and 0 <= start_factor <= 1");
  }
}

float WarmupLr::lr(float base_lr, std::int64_t t) const {
  if (t < warmup_) {
    const double f = start_factor_ +
                     (1.0 - start_factor_) * static_cast<double>(t) / static_cast<double>(warmup_);
    return static_cast<float>(base_lr * f);
  }
  return after_ ? after_->lr(base_lr, t - warmup_) : base_lr;
}

}  // namespace hpm::optim
