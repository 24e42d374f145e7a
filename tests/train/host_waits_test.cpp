// How often a training step reads values on the host after issuing work: on a GPU each such read
// waits for the device, so the step is built to read once, at its end (the loss and the metrics
// together), with the clipping norm and the accuracy counts left on the device. Counted on the
// CPU by host_waits_on_this_thread, which a GPU's step would match.
#include <gtest/gtest.h>

#include <vector>

#include "common/models.h"
#include "common/waits_per_step.h"
#include "hpm/train/trainer.h"

namespace hpm::train {
namespace {

std::vector<std::uint64_t> waits_of_a_fit(std::shared_ptr<nn::Module> model,
                                          std::shared_ptr<nn::Objective> objective,
                                          const nn::Batch& data, std::int64_t batch, float clip) {
  Trainer trainer(model, testing::adamw(*model));
  if (objective) trainer.set_objective(std::move(objective));
  auto waits = std::make_shared<testing::WaitsPerStep>();
  trainer.add_callback(waits);
  FitOptions o;
  o.batch_size = batch;
  o.clip_grad_norm = clip;
  o.shuffle = false;
  trainer.fit(data::LabelledData{data.inputs, data.targets}, nullptr, o);
  return waits->per_step;
}

TEST(HostWaits, AGptStepWithClippingWaitsForTheDeviceOnce) {
  manual_seed(5);
  const auto waits = waits_of_a_fit(testing::tiny_gpt(), std::make_shared<nn::LanguageModelling>(),
                                    testing::token_batch(12, 8, 32, 1), 4, 1.0f);
  ASSERT_EQ(waits.size(), 3u);
  for (std::uint64_t w : waits) EXPECT_EQ(w, 1u);
}

TEST(HostWaits, AClassifierStepWaitsOnce) {
  const auto waits =
      waits_of_a_fit(testing::tiny_mlp(), nullptr, testing::image_batch(32, 2), 16, 0.0f);
  ASSERT_EQ(waits.size(), 2u);
  for (std::uint64_t w : waits) EXPECT_EQ(w, 1u);
}

}  // namespace
}  // namespace hpm::train
