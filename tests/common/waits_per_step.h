// A callback that records, for each training step, how many times the Trainer's thread read
// values on the host after issuing work (host_waits_on_this_thread: on a GPU, waits for it).
#pragma once
#include <cstdint>
#include <vector>

#include "hpm/train/trainer.h"

namespace hpm::testing {

class WaitsPerStep : public train::Callback {
 public:
  void on_batch_begin(train::Trainer&, std::int64_t) override {
    at_begin_ = host_waits_on_this_thread();
  }
  void on_batch_end(train::Trainer&, const train::BatchLogs&) override {
    per_step.push_back(host_waits_on_this_thread() - at_begin_);
  }
  std::vector<std::uint64_t> per_step;

 private:
  std::uint64_t at_begin_ = 0;
};

}  // namespace hpm::testing
