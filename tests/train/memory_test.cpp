// The Trainer's memory options on one device: accumulation over micro-batches matches whole
// batches (float reassociation tolerance, as the strategy tests), and a first step that exceeds the
// device budget fails with the step's measured need and the budget.
#include <gtest/gtest.h>

#include <cmath>

#include "common/blobs.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"
#include "hpm/train/trainer.h"

namespace hpm::train {
namespace {

using hpm::testing::blobs;

std::shared_ptr<nn::Sequential> model(std::int64_t width = 16) {
  manual_seed(1);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, width), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(width, 3)});
}

std::vector<float> fit(int accumulation_steps, std::int64_t batch_size) {
  auto m = model();
  Trainer t(m, std::make_shared<optim::SGD>(m->named_parameters(), optim::SgdOptions{0.05f, 0.9f}));
  FitOptions o;
  o.epochs = 2;
  o.batch_size = batch_size;
  o.seed = 3;
  o.accumulation_steps = accumulation_steps;
  t.fit(blobs(200, 1), nullptr, o);
  std::vector<float> out;
  for (auto& p : m->parameters()) {
    auto v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(TrainerMemory, AccumulationMatchesWholeBatches) {
  const std::vector<float> ref = fit(1, 50);
  for (int k : {3, 4}) {  // 50 rows: 17+17+16, 13+13+13+11
    const std::vector<float> acc = fit(k, 50);
    ASSERT_EQ(acc.size(), ref.size());
    float worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i)
      worst = std::max(worst, std::abs(ref[i] - acc[i]) / (1e-3f + std::abs(ref[i])));
    EXPECT_LT(worst, 1e-4f) << "k=" << k;
    EXPECT_NE(acc, ref) << "k=" << k << ": no micro-batches ran";
  }
  EXPECT_THROW(fit(0, 50), std::invalid_argument);
}

TEST(TrainerMemory, AStepOverTheBudgetNamesItsNeedAndTheBudget) {
  auto m = model(512);
  auto sgd = std::make_shared<optim::SGD>(m->named_parameters(), optim::SgdOptions{0.05f, 0.9f});
  Trainer t(m, sgd);
  const auto data = blobs(256, 1);
  FitOptions o;
  o.batch_size = 256;
  std::vector<std::vector<float>> before;
  for (auto& p : m->parameters()) before.push_back(p.to_vector());
  Device& cpu = Device::cpu();
  const std::size_t budget = cpu.stats().current_bytes + (64u << 10);
  cpu.set_budget(budget);
  try {
    t.fit(data, nullptr, o);
    cpu.set_budget(Device::kUnlimited);
    FAIL() << "no error";
  } catch (const TrainingError& e) {
    cpu.set_budget(Device::kUnlimited);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the training step needs "), std::string::npos) << msg;
    EXPECT_NE(msg.find("device 'cpu' has a budget of"), std::string::npos) << msg;
    EXPECT_NE(msg.find("recompute, offload"), std::string::npos) << msg;
    // The need is measured: more than the budget.
    const double need = std::stod(msg.substr(msg.find("needs ") + 6));
    EXPECT_GT(need * 1024 * 1024, static_cast<double>(budget)) << msg;
  }
  EXPECT_EQ(cpu.stats().budget_bytes, Device::kUnlimited);
  // Measuring ran the step; its update was put back: the caller holds the model it had (it was
  // one SGD step on, with momentum, for a step fit reported as failed).
  std::vector<std::vector<float>> after;
  for (auto& p : m->parameters()) after.push_back(p.to_vector());
  EXPECT_EQ(after, before);
  EXPECT_EQ(sgd->steps(), 0);
  for (const auto& [name, buffer] : sgd->state()) EXPECT_EQ(name, "step");
}

TEST(TrainerMemory, ReplicasInSyncOverTheBudgetNameTheBudget) {
  // Central storage: replicas without collectives, so one running out cannot strand the others.
  distribute::StrategyOptions so;
  so.replicas = 2;
  auto strategy = distribute::make_central_storage(so);
  strategy->scope(
      [] { return std::shared_ptr<nn::Module>(model(512)); },
      [](nn::Module& m) {
        return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.05f, 0.9f});
      });
  Trainer t(strategy);
  FitOptions o;
  o.batch_size = 256;
  const auto data = blobs(256, 1);
  Device& cpu = Device::cpu();
  cpu.set_budget(cpu.stats().current_bytes + (64u << 10));
  try {
    t.fit(data, nullptr, o);
    cpu.set_budget(Device::kUnlimited);
    FAIL() << "no error";
  } catch (const TrainingError& e) {
    cpu.set_budget(Device::kUnlimited);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the training step does not fit: device 'cpu' has a budget of"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("out of memory on device 'cpu'"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace hpm::train
