// Learning-rate schedules in closed form: lr(epoch) from the base rate, so resuming at any step
// needs no replay.
#pragma once
#include <cstdint>
#include <memory>

namespace hpm::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual float lr(float base_lr, std::int64_t t) const = 0;
};

class ConstantLr : public LrSchedule {
 public:
  float lr(float base_lr, std::int64_t) const override { return base_lr; }
};

// base * gamma^(t / step_size)   (StepLR)
class StepLr : public LrSchedule {
 public:
  StepLr(std::int64_t step_size, float gamma);
  float lr(float base_lr, std::int64_t t) const override;

 private:
  std::int64_t step_size_;
  float gamma_;
};

// eta_min + (base - eta_min) (1 + cos(pi t / t_max)) / 2   (CosineAnnealingLR)
class CosineLr : public LrSchedule {
 public:
  CosineLr(std::int64_t t_max, float eta_min);
  float lr(float base_lr, std::int64_t t) const override;

 private:
  std::int64_t t_max_;
  float eta_min_;
};

// Linear warm-up from start_factor * base to base over `warmup` steps, then `after` (shifted so
// that it starts at t = 0 when warm-up ends); after may be null (constant).
class WarmupLr : public LrSchedule {
 public:
  WarmupLr(float start_factor, std::int64_t warmup, std::shared_ptr<LrSchedule> after = nullptr);
  float lr(float base_lr, std::int64_t t) const override;

 private:
  float start_factor_;
  std::int64_t warmup_;
  std::shared_ptr<LrSchedule> after_;
};

}  // namespace hpm::optim
