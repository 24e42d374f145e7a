// The fusion pass: a Conv2d followed by a ReLU is planned as one unit and runs as one fused op
// with the unfused result; other neighbours stay units of their own.
#include "hpm/nn/fusion.h"

#include <gtest/gtest.h>

#include "hpm/nn/layers.h"
#include "hpm/nn/recompute.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {
namespace {

TEST(Fusion, ConvThenReluIsOneUnitWithTheUnfusedResult) {
  Generator g(4);
  auto conv = std::make_shared<Conv2d>(Conv2dOptions{2, 3, 3, 1, 1, true}, g);
  auto relu = std::make_shared<ReLU>();
  const std::vector<std::shared_ptr<Module>> layers = {conv, relu, std::make_shared<Flatten>(),
                                                       std::make_shared<ReLU>()};
  const auto units = plan_units(layers);
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[0].begin, 0u);
  EXPECT_EQ(units[0].end, 2u);
  ASSERT_TRUE(units[0].fused);
  EXPECT_FALSE(units[1].fused) << "Flatten then ReLU do not fuse";
  const Tensor x = Tensor::randn({2, 2, 5, 5}, g);
  EXPECT_EQ(units[0].fused(x).to_vector(), relu->forward(conv->forward(x)).to_vector());
  // The same plan gives recompute its segments: a fused pair is never split.
  Sequential seq(layers);
  EXPECT_EQ(sequential_units(seq),
            (std::vector<std::pair<std::size_t, std::size_t>>{{0, 2}, {2, 3}, {3, 4}}));
}

}  // namespace
}  // namespace hpm::nn
