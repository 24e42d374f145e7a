// The models on a second device type (the CPU backend registered as "private:0"): the mlp, the
// cnn (its fused convolution, ReLU and pooling), the ResNet and the GPT, forward, backward and an
// optimizer step with every tensor on that device, against the same on the CPU. Nothing in
// autograd, nn or optim may reach for the CPU behind the dispatch: a tensor made there would
// meet the device's in an op and fail naming both.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>

#include "common/models.h"
#include "common/twin_device.h"
#include "hpm/autograd/ops.h"
#include "hpm/nn/layers.h"
#include "hpm/optim/optimizer.h"

namespace hpm::testing {
namespace {

struct Model {
  std::function<std::shared_ptr<nn::Module>()> build;
  std::function<nn::Batch()> batch;
  bool language_model = false;
};

// Loss, gradients and the parameters after one AdamW step, on `device` (nullptr: the CPU).
std::vector<Tensor> one_step(const Model& m, Device* device) {
  std::optional<DeviceGuard> on;
  if (device != nullptr) on.emplace(*device);
  manual_seed(11);  // the models that draw from the default generator draw alike
  auto model = m.build();
  nn::Batch b = m.batch();
  if (device != nullptr) b = {b.inputs.to(*device), b.targets.to(*device)};
  Tensor logits = model->forward(b.inputs);
  if (m.language_model) logits = reshape(logits, {-1, logits.size(-1)});
  const Tensor loss = cross_entropy(logits, b.targets.reshape({-1}), 0.1f);
  loss.backward();
  std::vector<Tensor> out{loss.detach()};
  for (const Tensor& p : model->parameters()) out.push_back(p.grad());
  adamw(*model)->step();
  for (const Tensor& p : model->parameters()) out.push_back(p.detach());
  return out;
}

void expect_same_on_twin(const Model& m) {
  const std::vector<Tensor> want = one_step(m, nullptr);
  const std::vector<Tensor> got = one_step(m, &twin_device());
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    EXPECT_EQ(got[i].device().id(), twin_device().id());
    // The same kernels behind another device type: the same numbers, bit for bit.
    EXPECT_EQ(got[i].to_vector(), want[i].to_vector());
  }
}

TEST(DeviceModels, MlpTrainsOnASecondDeviceTypeAsOnTheCpu) {
  expect_same_on_twin({tiny_mlp, [] { return image_batch(6, 1); }});
}

TEST(DeviceModels, CnnTrainsOnASecondDeviceTypeAsOnTheCpu) {
  expect_same_on_twin({tiny_cnn, [] { return image_batch(6, 2); }});
}

TEST(DeviceModels, ResNetTrainsOnASecondDeviceTypeAsOnTheCpu) {
  expect_same_on_twin({tiny_resnet, [] { return image_batch(6, 3); }});
}

TEST(DeviceModels, GptTrainsOnASecondDeviceTypeAsOnTheCpu) {
  expect_same_on_twin({tiny_gpt, [] { return token_batch(3, 8, 32, 4); }, true});
}

}  // namespace
}  // namespace hpm::testing
