// The Trainer on a GPU: fit and evaluate with the model on cuda:0 and batches coming from the
// host, against the same on the CPU; checkpoints hold host bytes, so one saved on the GPU resumes
// on the CPU with identical parameters, and the other way.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/blobs.h"
#include "common/cuda_device.h"
#include "common/models.h"
#include "common/temp_dir.h"
#include "common/training.h"
#include "common/waits_per_step.h"
#include "hpm/nn/layers.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/random.h"
#include "hpm/train/trainer.h"

namespace hpm::train {
namespace {

struct Rig {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<Trainer> trainer;
};

Rig make(std::uint64_t seed, Device* device) {
  manual_seed(seed);
  Rig s;
  s.model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(0.1f), std::make_shared<nn::Linear>(16, 3)});
  auto opt =
      std::make_shared<optim::SGD>(s.model->named_parameters(), optim::SgdOptions{0.05f, 0.9f});
  s.trainer = std::make_unique<Trainer>(s.model, opt);
  if (device != nullptr) s.trainer->set_device(*device);
  return s;
}

std::vector<float> flat_params(const nn::Module& m) {
  std::vector<float> out;
  for (auto& p : m.parameters()) {
    auto v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(CudaTraining, FitAndEvaluateOnTheGpuMatchTheCpu) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  const auto train = hpm::testing::blobs(200, 3), test = hpm::testing::blobs(100, 4);
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 16;
  o.seed = 7;
  Rig on_gpu = make(1, &gpu), on_cpu = make(1, nullptr);
  for (const Tensor& p : on_gpu.model->parameters()) EXPECT_EQ(p.device().id(), gpu.id());
  const FitResult g = on_gpu.trainer->fit(train, &test, o);
  const FitResult c = on_cpu.trainer->fit(train, &test, o);
  ASSERT_EQ(g.history.size(), c.history.size());
  for (std::size_t e = 0; e < c.history.size(); ++e) {
    // The same dropout masks (drawn by the host's generator on both) and the same batches.
    EXPECT_NEAR(g.history[e].train_loss, c.history[e].train_loss, 1e-4) << "epoch " << e;
  }
  const EvalResult eg = on_gpu.trainer->evaluate(test), ec = on_cpu.trainer->evaluate(test);
  EXPECT_NEAR(eg.loss, ec.loss, 1e-4);
  EXPECT_NEAR(eg.accuracy, ec.accuracy, 1e-6);
  for (const Tensor& p : on_gpu.model->parameters()) EXPECT_EQ(p.device().id(), gpu.id());
}

// A GPT step on the GPU, with clipping, never waits for the device's queue: its loss and metrics
// are read by a read begun after its forward and waited for after its update is issued (the index
// checks, the accuracy counts and the clipping norm stay on the device, the update gated there).
TEST(CudaTraining, AGptStepNeverWaitsForTheDevicesQueue) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  manual_seed(5);
  auto model = hpm::testing::tiny_gpt();
  Trainer trainer(model, hpm::testing::adamw(*model));
  trainer.set_objective(std::make_shared<nn::LanguageModelling>());
  trainer.set_device(gpu);
  auto waits = std::make_shared<hpm::testing::WaitsPerStep>();
  trainer.add_callback(waits);
  const nn::Batch data = hpm::testing::token_batch(12, 8, 32, 1);
  FitOptions o;
  o.batch_size = 4;
  o.clip_grad_norm = 1.0f;
  trainer.fit(data::LabelledData{data.inputs, data.targets}, nullptr, o);
  ASSERT_EQ(waits->per_step.size(), 3u);
  for (std::uint64_t w : waits->per_step) EXPECT_EQ(w, 0u);
}

// AdamW's update gated on the GPU, issued before the loss is read: the losses as on the CPU, and a
// bad label at step 3 (judged on the device, read with that step's loss) stops the run with the
// parameters, moments and step count as step 2 left them.
TEST(CudaTraining, AGatedUpdateTrainsAsOnTheCpuAndABadLabelChangesNothing) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  const auto train = hpm::testing::blobs(120, 3);
  const auto run = [&](Device* device, bool bad_label, FitResult* result) {
    Rig r = make(3, device);
    optim::AdamOptions ao;
    ao.lr = 1e-2f;
    auto opt = std::make_shared<optim::AdamW>(r.model->named_parameters(), ao);
    r.trainer = std::make_unique<Trainer>(r.model, opt);
    if (device != nullptr) r.trainer->set_device(*device);
    int calls = 0;
    std::vector<float> params_after_2, state_after_2;
    r.trainer->set_loss([&](const Tensor& logits, const Tensor& y) {
      if (++calls == 3 && bad_label) {
        params_after_2 = flat_params(*r.model);
        state_after_2 = hpm::testing::flat_optimizer_state(*opt);
        Tensor labels = y.to(Device::cpu()).clone();
        labels.data<std::int64_t>()[1] = 7;  // 3 classes
        return cross_entropy(logits, labels.to(y.device()));
      }
      return cross_entropy(logits, y);
    });
    FitOptions o;
    o.epochs = 2;
    o.batch_size = 12;
    o.clip_grad_norm = 1.0f;
    o.shuffle = false;
    if (!bad_label) {
      *result = r.trainer->fit(train, nullptr, o);
      return;
    }
    EXPECT_THROW(r.trainer->fit(train, nullptr, o), std::out_of_range);
    EXPECT_EQ(calls, 3);
    EXPECT_EQ(flat_params(*r.model), params_after_2);
    EXPECT_EQ(hpm::testing::flat_optimizer_state(*opt), state_after_2);
    EXPECT_EQ(opt->steps(), 2);
    EXPECT_FALSE(opt->updates_halted());
  };
  FitResult on_gpu, on_cpu;
  run(&gpu, false, &on_gpu);
  run(nullptr, false, &on_cpu);
  ASSERT_EQ(on_gpu.history.size(), 2u);
  for (std::size_t e = 0; e < 2; ++e)
    EXPECT_NEAR(on_gpu.history[e].train_loss, on_cpu.history[e].train_loss, 1e-4) << e;
  run(&gpu, true, nullptr);
}

TEST(CudaTraining, ACheckpointSavedOnTheGpuResumesOnTheCpuAndBack) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  const auto train = hpm::testing::blobs(200, 3);
  hpm::testing::TempDir dir;
  FitOptions o;
  o.epochs = 2;
  o.batch_size = 16;
  o.checkpoint_dir = dir / "gpu";
  Rig saved = make(1, &gpu);
  saved.trainer->fit(train, nullptr, o);
  // Another initialization on the CPU: what it holds after resuming comes from the files.
  Rig resumed = make(99, nullptr);
  FitOptions r = o;
  r.checkpoint_dir.clear();
  r.resume_from = dir / "gpu";
  resumed.trainer->fit(train, nullptr, r);  // at its end already: trains nothing
  EXPECT_EQ(flat_params(*resumed.model), flat_params(*saved.model));
  // And back: saved on the CPU, continued on the GPU for one more epoch, as the CPU would.
  FitOptions more = o;
  more.checkpoint_dir = dir / "cpu";
  make(2, nullptr).trainer->fit(train, nullptr, more);
  Rig on_gpu = make(98, &gpu), on_cpu = make(97, nullptr);
  FitOptions third = o;
  third.epochs = 3;
  third.checkpoint_dir.clear();
  third.resume_from = dir / "cpu";
  on_gpu.trainer->fit(train, nullptr, third);
  on_cpu.trainer->fit(train, nullptr, third);
  const auto pg = flat_params(*on_gpu.model), pc = flat_params(*on_cpu.model);
  ASSERT_EQ(pg.size(), pc.size());
  for (std::size_t i = 0; i < pg.size(); ++i) EXPECT_NEAR(pg[i], pc[i], 1e-4) << i;
}

}  // namespace
}  // namespace hpm::train
