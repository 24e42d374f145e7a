// A GPT's training step in the steady state takes every block it needs from its device's cache:
// after the first steps, no request reaches the device's memory (on a GPU: no cudaMalloc, no
// cudaFree, no synchronization they would bring), whatever the step allocates and frees.
#include <gtest/gtest.h>

#include <vector>

#include "common/models.h"
#include "hpm/train/trainer.h"

namespace hpm::train {
namespace {

// Requests per step that the device's cache did not serve.
class FreshAllocationsPerStep : public Callback {
 public:
  explicit FreshAllocationsPerStep(Device& device) : device_(device) {}
  void on_batch_begin(Trainer&, std::int64_t) override { at_begin_ = fresh(); }
  void on_batch_end(Trainer&, const BatchLogs&) override {
    per_step.push_back(fresh() - at_begin_);
  }
  std::vector<std::uint64_t> per_step;

 private:
  std::uint64_t fresh() const { return device_.stats().allocations - device_.stats().cache_hits; }
  Device& device_;
  std::uint64_t at_begin_ = 0;
};

TEST(SteadyStateMemory, AGptStepAllocatesNothingNewAfterItsFirstSteps) {
  Device device("gpt steps");
  manual_seed(5);
  auto model = testing::tiny_gpt();
  Trainer trainer(model, testing::adamw(*model));
  trainer.set_objective(std::make_shared<nn::LanguageModelling>());
  trainer.set_device(device);
  auto fresh = std::make_shared<FreshAllocationsPerStep>(device);
  trainer.add_callback(fresh);
  const nn::Batch data = testing::token_batch(24, 8, 32, 1);
  FitOptions o;
  o.batch_size = 4;
  o.clip_grad_norm = 1.0f;
  trainer.fit(data::LabelledData{data.inputs, data.targets}, nullptr, o);
  ASSERT_EQ(fresh->per_step.size(), 6u);
  EXPECT_GT(fresh->per_step[0], 0u) << "the first step fills the cache";
  for (std::size_t s = 2; s < fresh->per_step.size(); ++s)
    EXPECT_EQ(fresh->per_step[s], 0u) << "step " << s + 1;
}

}  // namespace
}  // namespace hpm::train
