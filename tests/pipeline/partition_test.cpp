#include "hpm/pipeline/partition.h"

#include <gtest/gtest.h>

#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::pipeline {
namespace {

std::vector<LayerCost> costs(const std::vector<double>& times,
                             const std::vector<std::size_t>& params = {}) {
  std::vector<LayerCost> out;
  for (std::size_t i = 0; i < times.size(); ++i) {
    LayerCost c;
    c.name = std::to_string(i);
    c.forward_s = times[i] / 3;
    c.backward_s = 2 * times[i] / 3;
    c.parameter_bytes = params.empty() ? 0 : params[i];
    c.activation_bytes = 10;
    out.push_back(c);
  }
  return out;
}

TEST(Partition, BalancedMinimizesTheSlowestStage) {
  // Best split of {1,1,1,6,1,1,1} in 3: {1,1,1} {6} {1,1,1}: slowest 6.
  const Partition p = partition(costs({1, 1, 1, 6, 1, 1, 1}), 3, PartitionMethod::kBalanced);
  EXPECT_EQ(p.boundaries, (std::vector<int>{0, 3, 4, 7}));
  EXPECT_NEAR(p.time_s[1], 6, 1e-12);
  EXPECT_NEAR(p.imbalance, 6 / (12.0 / 3), 1e-12);
  // Uniform cuts by count and is worse here.
  const Partition u = partition(costs({1, 1, 1, 6, 1, 1, 1}), 3, PartitionMethod::kUniform);
  EXPECT_EQ(u.boundaries, (std::vector<int>{0, 2, 4, 7}));
  EXPECT_GT(u.imbalance, p.imbalance);
}

TEST(Partition, ParametersBalancesBytes) {
  const Partition p =
      partition(costs({1, 1, 1, 1}, {100, 10, 10, 80}), 2, PartitionMethod::kParameters);
  EXPECT_EQ(p.boundaries, (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(p.parameter_bytes, (std::vector<std::size_t>{100, 100}));
}

TEST(Partition, MemoryLimitShiftsTheCutOrSaysWhatWouldFit) {
  // Time alone would cut {1,1,1,1} {4}; layer 0's 200 bytes of parameters (x2 with gradients)
  // fit a 420-byte stage only alone, so the cut moves to {1} {1,1,1,4}.
  auto layers = costs({1, 1, 1, 1, 4}, {200, 10, 10, 10, 10});
  EXPECT_EQ(partition(layers, 2, PartitionMethod::kBalanced).boundaries,
            (std::vector<int>{0, 4, 5}));
  const Partition p = partition(layers, 2, PartitionMethod::kBalanced, 420, 1);
  EXPECT_EQ(p.boundaries, (std::vector<int>{0, 1, 5}));
  try {
    partition(layers, 2, PartitionMethod::kBalanced, 300, 1);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the best needs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(partition(layers, 6, PartitionMethod::kUniform), std::invalid_argument);
  EXPECT_THROW(partition_from_name("greedy"), std::invalid_argument);
}

TEST(Partition, ProfilingMeasuresEveryLayerAndLeavesNoGradients) {
  Generator g(3);
  nn::Sequential model({std::make_shared<nn::Linear>(16, 64, true, g), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Linear>(64, 4, true, g)});
  const std::vector<LayerCost> layers = profile_layers(model, Tensor::randn({8, 16}, g), 2);
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[0].parameter_bytes, (16 * 64 + 64) * 4u);
  EXPECT_EQ(layers[1].parameter_bytes, 0u);
  EXPECT_GE(layers[0].activation_bytes, 8 * 64 * 4u);  // at least its output
  for (const auto& l : layers) EXPECT_GT(l.forward_s, 0);
  for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_NE(describe(partition(layers, 2, PartitionMethod::kBalanced), layers).find("imbalance"),
            std::string::npos);
}

// Repeated identical layers (a transformer's blocks) are measured once: the second 64 -> 64 Linear
// and the later ReLUs take the first one's cost, while layers that differ in their parameters
// (no bias) or in their output (a pool of another size over the same input) are measured.
TEST(Partition, ProfilingMeasuresRepeatedLayersOnce) {
  Generator g(4);
  const auto linear = [&](bool bias) { return std::make_shared<nn::Linear>(64, 64, bias, g); };
  nn::Sequential model({std::make_shared<nn::Linear>(16, 64, true, g), std::make_shared<nn::ReLU>(),
                        linear(true), std::make_shared<nn::ReLU>(), linear(true),
                        std::make_shared<nn::ReLU>(), linear(false)});
  const std::vector<LayerCost> layers = profile_layers(model, Tensor::randn({8, 16}, g), 3);
  ASSERT_EQ(layers.size(), 7u);
  const auto same = [](const LayerCost& a, const LayerCost& b) {
    return a.forward_s == b.forward_s && a.backward_s == b.backward_s && a.weight_s == b.weight_s &&
           a.parameter_bytes == b.parameter_bytes && a.activation_bytes == b.activation_bytes;
  };
  EXPECT_TRUE(same(layers[4], layers[2]));
  EXPECT_EQ(layers[4].name, "4: Linear");
  EXPECT_TRUE(same(layers[5], layers[3]));
  EXPECT_FALSE(same(layers[2], layers[0]));
  EXPECT_EQ(layers[6].parameter_bytes, 64 * 64 * 4u);
  for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());

  nn::Sequential pools({std::make_shared<nn::MaxPool2d>(1), std::make_shared<nn::MaxPool2d>(2)});
  Tensor image = Tensor::randn({2, 3, 8, 8}, g);
  const std::vector<LayerCost> pooled = profile_layers(pools, image, 2);
  ASSERT_EQ(pooled.size(), 2u);
  EXPECT_LT(pooled[1].activation_bytes, pooled[0].activation_bytes) << "measured, not reused";
}

}  // namespace
}  // namespace hpm::pipeline
