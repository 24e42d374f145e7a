// Recomputation against the plain model: the same seed gives bit-identical gradients, running
// statistics and generator state (dropout and BatchNorm included), hooks fire once per parameter,
// and the device's peak during forward + backward is lower.
#include "hpm/nn/recompute.h"

#include <gtest/gtest.h>

#include "hpm/autograd/grad_mode.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {
namespace {

std::shared_ptr<Sequential> mlp_with_dropout_and_bn() {
  manual_seed(5);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(16, 32), std::make_shared<BatchNorm1d>(BatchNormOptions{32}),
      std::make_shared<ReLU>(), std::make_shared<Dropout>(0.3f), std::make_shared<Linear>(32, 32),
      std::make_shared<ReLU>(), std::make_shared<Dropout>(0.2f), std::make_shared<Linear>(32, 4)});
}

std::shared_ptr<Sequential> small_cnn() {
  manual_seed(6);
  Conv2dOptions c1{1, 4, 3, 1, 1, true}, c2{4, 4, 3, 1, 1, true};
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(c1), std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
      std::make_shared<Conv2d>(c2), std::make_shared<ReLU>(), std::make_shared<Dropout>(0.25f),
      std::make_shared<Flatten>(), std::make_shared<Linear>(4 * 4 * 4, 3)});
}

struct RecomputeOutcome {
  std::vector<std::vector<float>> grads;  // per parameter
  std::vector<std::vector<float>> state;  // parameters and buffers after the step (BN stats)
  float loss = 0;
  Generator::State rng;
};

// One forward + backward of `model` on a fixed batch, the default generator seeded alike.
RecomputeOutcome step(Module& model, const Tensor& x, std::int64_t classes) {
  Generator data(9);
  Tensor y = Tensor::zeros({x.size(0)}, DType::I64);
  for (std::int64_t i = 0; i < x.size(0); ++i)
    y.data<std::int64_t>()[i] = static_cast<std::int64_t>(data.below(classes));
  manual_seed(11);
  model.zero_grad();
  Tensor loss = cross_entropy(model.forward(x), y);
  loss.backward();
  RecomputeOutcome o;
  o.loss = loss.item();
  for (const Tensor& p : model.parameters()) o.grads.push_back(p.grad().to_vector());
  for (const auto& [name, t] : model.state_dict()) {
    if (t.dtype() == DType::F32) {
      o.state.push_back(t.to_vector());
    } else {
      std::vector<float> v;
      for (auto i : t.to_vector_i64()) v.push_back(static_cast<float>(i));
      o.state.push_back(v);
    }
  }
  o.rng = default_generator().state();
  return o;
}

void expect_identical(const RecomputeOutcome& a, const RecomputeOutcome& b,
                      const std::string& what) {
  EXPECT_EQ(a.loss, b.loss) << what;
  EXPECT_EQ(a.grads, b.grads) << what << ": gradients differ";
  EXPECT_EQ(a.state, b.state) << what << ": parameters or buffers (BatchNorm statistics) differ";
  EXPECT_EQ(a.rng.s, b.rng.s) << what << ": the generator was not left where it would be";
}

TEST(Recompute, ParsesModesAndRejectsOthersNamingTheChoices) {
  EXPECT_EQ(parse_recompute_mode("never"), RecomputeMode::Never);
  EXPECT_EQ(parse_recompute_mode("always"), RecomputeMode::Always);
  EXPECT_EQ(parse_recompute_mode("except_last"), RecomputeMode::ExceptLast);
  try {
    parse_recompute_mode("sometimes");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"sometimes\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("never, always, except_last"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(with_recomputation(mlp_with_dropout_and_bn(), 0, RecomputeMode::Always),
               std::invalid_argument);
}

TEST(Recompute, GradientsAreBitIdenticalWithDropoutAndBatchNorm) {
  Generator gen(2);
  const Tensor x = Tensor::randn({12, 16}, gen);
  const RecomputeOutcome ref = step(*mlp_with_dropout_and_bn(), x, 4);
  for (RecomputeMode mode : {RecomputeMode::Always, RecomputeMode::ExceptLast}) {
    for (int every : {1, 2, 3, 8}) {
      auto model = with_recomputation(mlp_with_dropout_and_bn(), every, mode);
      expect_identical(ref, step(*model, x, 4),
                       to_string(mode) + " every " + std::to_string(every));
    }
  }
}

TEST(Recompute, ConvolutionsWithFusedReluAndPoolAreBitIdentical) {
  Generator gen(4);
  const Tensor x = Tensor::randn({6, 1, 8, 8}, gen);
  const RecomputeOutcome ref = step(*small_cnn(), x, 3);
  for (int every : {1, 2}) {
    auto model = with_recomputation(small_cnn(), every, RecomputeMode::Always);
    expect_identical(ref, step(*model, x, 3), "cnn every " + std::to_string(every));
  }
  // Conv2d + ReLU (+ MaxPool2d) is one unit: segments never split it.
  const auto units = sequential_units(*small_cnn());
  ASSERT_EQ(units.size(), 5u);
  EXPECT_EQ(units[0], (std::pair<std::size_t, std::size_t>{0, 3}));
  EXPECT_EQ(units[1], (std::pair<std::size_t, std::size_t>{3, 5}));
}

TEST(Recompute, KeepsTheModelsNamesAndEvaluatesPlainly) {
  auto plain = mlp_with_dropout_and_bn();
  auto model = with_recomputation(plain, 2, RecomputeMode::Always);
  std::vector<std::string> a, b;
  for (const auto& [n, t] : plain->state_dict()) a.push_back(n);
  for (const auto& [n, t] : model->state_dict()) b.push_back(n);
  EXPECT_EQ(a, b);
  model->eval();
  Generator gen(3);
  const Tensor x = Tensor::randn({5, 16}, gen);
  NoGradGuard no_grad;
  EXPECT_EQ(model->forward(x).to_vector(), plain->forward(x).to_vector());
}

TEST(Recompute, HooksFireOncePerParameter) {
  auto model = with_recomputation(mlp_with_dropout_and_bn(), 1, RecomputeMode::Always);
  std::vector<int> fired(model->parameters().size(), 0);
  std::size_t i = 0;
  for (Tensor p : model->parameters()) {
    p.autograd_meta().post_accumulate_hooks.push_back([&fired, i](Tensor&) { ++fired[i]; });
    ++i;
  }
  Generator gen(2);
  step(*model, Tensor::randn({8, 16}, gen), 4);
  EXPECT_EQ(fired, std::vector<int>(fired.size(), 1));
}

// Peak bytes a forward + backward adds on a device of its own.
std::size_t step_peak(const std::function<std::shared_ptr<Module>()>& make) {
  Device device("recompute-test");
  DeviceGuard guard(device);
  auto model = make();
  Generator gen(1);
  const Tensor x = Tensor::randn({512, 256}, gen);
  Tensor y = Tensor::zeros({512}, DType::I64);
  const std::size_t before = device.stats().current_bytes;
  device.reset_peak();
  cross_entropy(model->forward(x), y).backward();
  return device.stats().peak_bytes - before;
}

std::shared_ptr<Sequential> deep_mlp() {
  manual_seed(1);
  auto m = std::make_shared<Sequential>();
  for (int i = 0; i < 8; ++i) {
    m->push_back(std::make_shared<Linear>(256, 256));
    m->push_back(std::make_shared<ReLU>());
  }
  return m;
}

TEST(Recompute, LowersThePeakOfActivationMemory) {
  const std::size_t plain = step_peak([] { return deep_mlp(); });
  const std::size_t every2 =
      step_peak([] { return with_recomputation(deep_mlp(), 2, RecomputeMode::Always); });
  const std::size_t every4 =
      step_peak([] { return with_recomputation(deep_mlp(), 4, RecomputeMode::Always); });
  // Each layer keeps 512 KiB for backward without recomputation (next to 2 MiB of gradients); with
  // segments, only the segment inputs stay, plus one segment's activations at a time.
  EXPECT_LT(every2, plain * 3 / 4) << "plain " << plain << ", every 2: " << every2;
  EXPECT_LT(every4, plain * 3 / 4) << "plain " << plain << ", every 4: " << every4;
}

}  // namespace
}  // namespace hpm::nn
