// The models on the GPU against the CPU: the mlp, the cnn, the ResNet and the GPT trained 50
// steps of AdamW on cuda:0 and on the CPU from the same initial weights and batches. In f32 (no
// TF32) the losses agree to about 1e-4 relative; the GPT under bf16 autocast as the CPU's bf16
// does. And the GPU's run repeats bit for bit (deterministic kernels, no atomics).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/cuda_device.h"
#include "common/models.h"
#include "hpm/autograd/autocast.h"
#include "hpm/autograd/ops.h"
#include "hpm/nn/layers.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/backend/cpu.h"

namespace hpm::testing {
namespace {

struct Model {
  std::function<std::shared_ptr<nn::Module>()> build;
  std::function<nn::Batch(int step)> batch;
  bool language_model = false;
};

std::shared_ptr<nn::Module> mlp() {
  Generator gen(3);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(64, 32, true, gen),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 4, true, gen)});
}

std::shared_ptr<nn::Module> cnn() {
  Generator gen(4);
  nn::Conv2dOptions o;
  o.in_channels = 1;
  o.out_channels = 8;
  o.padding = 1;
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(o, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(8 * 4 * 4, 4, true, gen)});
}

struct TrainingRun {
  std::vector<float> losses;
  std::vector<Tensor> parameters;  // after the last step, on the host
};

// `steps` AdamW steps on `device` (nullptr: the CPU), batches cycling over 4.
TrainingRun train(const Model& m, Device* device, int steps, autograd::Precision precision) {
  std::optional<DeviceGuard> on;
  if (device != nullptr) on.emplace(*device);
  manual_seed(11);
  auto model = m.build();
  auto opt = adamw(*model);
  TrainingRun r;
  for (int s = 0; s < steps; ++s) {
    nn::Batch b;
    {
      DeviceGuard host(Device::cpu());  // the fixtures write their batches on the host
      b = m.batch(s % 4);
    }
    if (device != nullptr) b = {b.inputs.to(*device), b.targets.to(*device)};
    opt->zero_grad();
    Tensor loss;
    {
      autograd::AutocastScope cast(precision);
      Tensor logits = model->forward(b.inputs);
      if (m.language_model) logits = reshape(logits, {-1, logits.size(-1)});
      loss = cross_entropy(logits, b.targets.reshape({-1}), 0.1f);
    }
    loss.backward();
    opt->step();
    r.losses.push_back(loss.item());
  }
  for (const Tensor& p : model->parameters()) r.parameters.push_back(p.detach().to(Device::cpu()));
  return r;
}

void expect_close(const TrainingRun& got, const TrainingRun& want, double tolerance) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], tolerance * std::max(1.0f, std::abs(want.losses[s])))
        << "step " << s;
  }
  ASSERT_EQ(got.parameters.size(), want.parameters.size());
  for (std::size_t i = 0; i < want.parameters.size(); ++i) {
    const auto g = got.parameters[i].to_vector(), w = want.parameters[i].to_vector();
    double worst = 0, scale = 1e-3;
    for (std::size_t j = 0; j < w.size(); ++j) {
      worst = std::max(worst, static_cast<double>(std::abs(g[j] - w[j])));
      scale = std::max(scale, static_cast<double>(std::abs(w[j])));
    }
    // Parameters drift further than losses over 50 AdamW steps (its normalized updates amplify
    // rounding where a gradient is near zero): an order of magnitude more room.
    EXPECT_LE(worst, 10 * tolerance * scale) << "parameter " << i;
  }
}

const Model kMlp{mlp, [](int s) { return image_batch(16, 100 + s); }};
const Model kCnn{cnn, [](int s) { return image_batch(16, 200 + s); }};
const Model kResNet{tiny_resnet, [](int s) { return image_batch(16, 300 + s); }};
const Model kGpt{tiny_gpt, [](int s) { return token_batch(4, 8, 32, 400 + s); }, true};

constexpr int kSteps = 50;
constexpr double kF32Tolerance = 2e-4;

TEST(CudaModels, MlpTrainsOnTheGpuAsOnTheCpu) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  expect_close(train(kMlp, &gpu, kSteps, autograd::Precision::F32),
               train(kMlp, nullptr, kSteps, autograd::Precision::F32), kF32Tolerance);
}

TEST(CudaModels, CnnTrainsOnTheGpuAsOnTheCpu) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  expect_close(train(kCnn, &gpu, kSteps, autograd::Precision::F32),
               train(kCnn, nullptr, kSteps, autograd::Precision::F32), kF32Tolerance);
}

TEST(CudaModels, ResNetTrainsOnTheGpuAsOnTheCpu) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  expect_close(train(kResNet, &gpu, kSteps, autograd::Precision::F32),
               train(kResNet, nullptr, kSteps, autograd::Precision::F32), kF32Tolerance);
}

TEST(CudaModels, GptTrainsOnTheGpuAsOnTheCpu) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  expect_close(train(kGpt, &gpu, kSteps, autograd::Precision::F32),
               train(kGpt, nullptr, kSteps, autograd::Precision::F32), kF32Tolerance);
}

TEST(CudaModels, GptTrainsUnderBf16AutocastAsOnTheCpu) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  const TrainingRun got = train(kGpt, &gpu, kSteps, autograd::Precision::BF16);
  // The CPU's bf16 where this CPU has it natively; else its f32, further away.
  const bool cpu_bf16 = cpu::native_bf16();
  const TrainingRun want =
      train(kGpt, nullptr, kSteps, cpu_bf16 ? autograd::Precision::BF16 : autograd::Precision::F32);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], (cpu_bf16 ? 2e-2 : 5e-2) * want.losses[s])
        << "step " << s;
  }
}

TEST(CudaModels, TheGpusRunRepeatsBitForBit) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  for (autograd::Precision p : {autograd::Precision::F32, autograd::Precision::BF16}) {
    const TrainingRun a = train(kGpt, &gpu, 10, p), b = train(kGpt, &gpu, 10, p);
    EXPECT_EQ(a.losses, b.losses) << autograd::precision_name(p);
    for (std::size_t i = 0; i < a.parameters.size(); ++i) {
      EXPECT_EQ(a.parameters[i].to_vector(), b.parameters[i].to_vector())
          << autograd::precision_name(p) << " parameter " << i;
    }
  }
}

}  // namespace
}  // namespace hpm::testing
