// Offload against the plain model: bit-identical gradients (data only moves), a lower device peak,
// a step that fits a budget the plain step exceeds, and a backward that runs out of device memory
// (copies back included) failing with OutOfMemoryError, after which the model trains again. Runs
// under ThreadSanitizer (the prefetch thread).
#include "hpm/nn/offload.h"

#include <gtest/gtest.h>

#include "hpm/autograd/grad_mode.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {
namespace {

std::shared_ptr<Sequential> mlp(std::int64_t width = 128) {
  manual_seed(5);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(32, width), std::make_shared<ReLU>(),
      std::make_shared<Dropout>(0.3f), std::make_shared<Linear>(width, width),
      std::make_shared<BatchNorm1d>(BatchNormOptions{width}), std::make_shared<ReLU>(),
      std::make_shared<Linear>(width, width), std::make_shared<ReLU>(),
      std::make_shared<Linear>(width, 4)});
}

std::shared_ptr<Sequential> cnn() {
  manual_seed(6);
  Conv2dOptions c1{1, 4, 3, 1, 1, true}, c2{4, 8, 3, 1, 1, true};
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(c1), std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
      std::make_shared<Conv2d>(c2), std::make_shared<ReLU>(), std::make_shared<Flatten>(),
      std::make_shared<Linear>(8 * 8 * 8, 4)});
}

struct Outcome {
  std::vector<std::vector<float>> grads;
  float loss = 0;
};

Outcome step(Module& model, const Tensor& x) {
  Tensor y = Tensor::zeros({x.size(0)}, DType::I64);
  for (std::int64_t i = 0; i < x.size(0); ++i) y.data<std::int64_t>()[i] = i % 4;
  manual_seed(11);
  model.zero_grad();
  Tensor loss = cross_entropy(model.forward(x), y);
  loss.backward();
  Outcome o;
  o.loss = loss.item();
  for (const Tensor& p : model.parameters()) o.grads.push_back(p.grad().to_vector());
  return o;
}

TEST(Offload, GradientsAreBitIdenticalAndEverythingComesBack) {
  Generator gen(2);
  const Tensor x = Tensor::randn({24, 32}, gen);
  const Outcome ref = step(*mlp(), x);
  auto model = with_offload(mlp(), {.threshold_bytes = 0});
  for (int k = 0; k < 2; ++k) {  // the second step reuses the prefetch thread
    const Outcome o = step(*model, x);
    EXPECT_EQ(ref.loss, o.loss);
    EXPECT_EQ(ref.grads, o.grads);
  }
  const OffloadStats st = model->stats();
  EXPECT_GT(st.storages_offloaded, 0u);
  EXPECT_GT(st.bytes_offloaded, 0u);
  EXPECT_EQ(st.bytes_prefetched, st.bytes_offloaded);
  EXPECT_EQ(Device::host().stats().current_bytes, 0u) << "activations left behind on the host";

  const Tensor images = Tensor::randn({6, 1, 16, 16}, gen);
  EXPECT_EQ(step(*cnn(), images).grads,
            step(*with_offload(cnn(), {.threshold_bytes = 0}), images).grads);
}

TEST(Offload, ThresholdKeepsSmallStoragesOnTheDevice) {
  Generator gen(2);
  const Tensor x = Tensor::randn({24, 32}, gen);
  auto model = with_offload(mlp(), {.threshold_bytes = 1 << 30});
  EXPECT_EQ(step(*mlp(), x).grads, step(*model, x).grads);
  EXPECT_EQ(model->stats().storages_offloaded, 0u);
}

// Peak bytes one forward + backward adds on `device`.
std::size_t step_peak(Device& device, Module& model, const Tensor& x) {
  const std::size_t before = device.stats().current_bytes;
  device.reset_peak();
  step(model, x);
  return device.stats().peak_bytes - before;
}

TEST(Offload, LowersTheDevicePeakAndFitsABudgetThePlainStepExceeds) {
  Device device("offload-test");
  DeviceGuard guard(device);
  Generator gen(3);
  const Tensor x = Tensor::randn({512, 32}, gen);
  auto plain = mlp(256);
  auto offloaded = with_offload(mlp(256), {.threshold_bytes = 16 << 10});
  const std::size_t plain_peak = step_peak(device, *plain, x);
  const std::size_t offload_peak = step_peak(device, *offloaded, x);
  EXPECT_LT(offload_peak, plain_peak * 3 / 4) << plain_peak << " vs " << offload_peak;

  // A budget between the two: the plain step runs out of memory, the offloaded one fits.
  device.set_budget(device.stats().current_bytes + (plain_peak + offload_peak) / 2);
  EXPECT_THROW(step(*plain, x), OutOfMemoryError);
  const Outcome ref = [&] {
    device.set_budget(Device::kUnlimited);
    return step(*plain, x);
  }();
  device.set_budget(device.stats().current_bytes + (plain_peak + offload_peak) / 2);
  EXPECT_EQ(step(*offloaded, x).grads, ref.grads);
  device.set_budget(Device::kUnlimited);
}

TEST(Offload, ABackwardThatDoesNotFitFailsWithOutOfMemoryAndTrainingGoesOn) {
  Device device("offload-oom");
  DeviceGuard guard(device);
  Generator gen(3);
  const Tensor x = Tensor::randn({256, 32}, gen);
  auto model = with_offload(mlp(256), {.threshold_bytes = 0});
  Tensor y = Tensor::zeros({256}, DType::I64);
  Tensor loss = cross_entropy(model->forward(x), y);
  // Nothing more fits: neither backward's gradients nor the copies back (whichever comes first).
  device.set_budget(device.stats().current_bytes);
  EXPECT_THROW(loss.backward(), OutOfMemoryError);
  device.set_budget(Device::kUnlimited);
  loss = Tensor();  // the graph and its half-done step go away cleanly (ASan, TSan)
  EXPECT_EQ(step(*mlp(256), x).grads, step(*model, x).grads) << "the model still trains";
}

TEST(Offload, EvaluatesPlainlyWithoutGradients) {
  Generator gen(2);
  const Tensor x = Tensor::randn({4, 32}, gen);
  auto plain = mlp();
  auto model = with_offload(plain);
  model->eval();
  NoGradGuard no_grad;
  EXPECT_EQ(model->forward(x).to_vector(), plain->forward(x).to_vector());
  EXPECT_EQ(model->stats().storages_offloaded, 0u);
}

}  // namespace
}  // namespace hpm::nn
