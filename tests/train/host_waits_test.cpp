// How often a training step reads values on the host after issuing work: on a GPU each such read
// waits for the device. A step whose optimizer gates its update on the device (AdamW's fused
// update) reads nothing that waits for the device's queue: its loss and metrics are read by a read
// begun after the forward and waited for after the update is issued (the wait covers the forward
// only), with the clipping norm and the accuracy counts left on the device. One whose optimizer
// reads its verdict on the host (SGD) reads once, at its end. Counted on the CPU by
// host_waits_on_this_thread, which a GPU's step would match.
#include <gtest/gtest.h>

#include <vector>

#include "common/models.h"
#include "common/waits_per_step.h"
#include "hpm/optim/optimizer.h"
#include "hpm/train/trainer.h"

namespace hpm::train {
namespace {

std::vector<std::uint64_t> waits_of_a_fit(std::shared_ptr<nn::Module> model,
                                          std::shared_ptr<nn::Objective> objective,
                                          const nn::Batch& data, std::int64_t batch, float clip,
                                          bool sgd = false) {
  std::shared_ptr<optim::Optimizer> opt = testing::adamw(*model);
  if (sgd) {
    opt = std::make_shared<optim::SGD>(model->named_parameters(), optim::SgdOptions{0.05f, 0.9f});
  }
  Trainer trainer(model, opt);
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

TEST(HostWaits, AGptStepWithClippingNeverWaitsForTheDevicesQueue) {
  manual_seed(5);
  const auto waits = waits_of_a_fit(testing::tiny_gpt(), std::make_shared<nn::LanguageModelling>(),
                                    testing::token_batch(12, 8, 32, 1), 4, 1.0f);
  ASSERT_EQ(waits.size(), 3u);
  for (std::uint64_t w : waits) EXPECT_EQ(w, 0u);
}

TEST(HostWaits, AClassifierStepNeverWaitsForTheDevicesQueue) {
  const auto waits =
      waits_of_a_fit(testing::tiny_mlp(), nullptr, testing::image_batch(32, 2), 16, 0.0f);
  ASSERT_EQ(waits.size(), 2u);
  for (std::uint64_t w : waits) EXPECT_EQ(w, 0u);
}

TEST(HostWaits, AStepWhoseOptimizerReadsOnTheHostWaitsOnce) {
  const auto waits = waits_of_a_fit(testing::tiny_mlp(), nullptr, testing::image_batch(32, 2), 16,
                                    0.0f, /*sgd=*/true);
  ASSERT_EQ(waits.size(), 2u);
  for (std::uint64_t w : waits) EXPECT_EQ(w, 1u);
}

}  // namespace
}  // namespace hpm::train
