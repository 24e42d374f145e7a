// The op profile (tensor/op_profile.h) of a training run's steps: every step after the first
// (which makes the kernels' plans and fills the allocator's pool: warm-up, which the benchmarks
// exclude too), and nothing between steps (input, logging, evaluation, checkpoints). The device is
// synchronized at both ends of each step so that the table's step time is the step's own; that
// also stops the host from running ahead into the next step, so a profiled run is a little slower
// than an unprofiled one.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include "hpm/train/trainer.h"

namespace hpm::train {

class OpProfileWindow : public Callback {
 public:
  // Writes the table to `path` when training ends (nothing when no step after the first ran).
  explicit OpProfileWindow(std::string path);
  ~OpProfileWindow() override;  // a step that threw leaves recording off
  void on_batch_begin(Trainer& trainer, std::int64_t global_step) override;
  void on_batch_end(Trainer& trainer, const BatchLogs& logs) override;
  void on_train_end(Trainer& trainer, const FitResult& result) override;

  std::int64_t steps() const { return steps_; }
  double seconds() const { return seconds_; }

 private:
  std::string path_;
  bool first_seen_ = false, in_step_ = false;
  std::int64_t steps_ = 0;
  double seconds_ = 0;
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace hpm::train
