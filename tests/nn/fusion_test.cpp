// The fusion pass: a Conv2d followed by a ReLU (and a MaxPool2d) is planned as one unit and runs
// as one fused op with the unfused result and gradients; other neighbours stay units of their own.
#include "hpm/nn/fusion.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "hpm/autograd/autocast.h"
#include "hpm/autograd/ops.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/recompute.h"
#include "hpm/tensor/kernels.h"
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

// Linear::forward_after_gelu with a residual: residual + forward(gelu(x)); a residual of the
// output's size in another shape is refused, not read as the output's rows.
TEST(Fusion, LinearAfterGeluTakesAResidualOfItsOutputsShape) {
  Generator g(6);
  Linear lin(8, 4, true, g);
  const Tensor x = Tensor::randn({2, 3, 8}, g), h = Tensor::randn({2, 3, 4}, g);
  EXPECT_EQ(lin.forward_after_gelu(x, h).to_vector(),
            add(h, lin.forward_after_gelu(x)).to_vector());
  EXPECT_THROW(lin.forward_after_gelu(x, Tensor::randn({3, 2, 4}, g)), std::invalid_argument);
}

struct ValuesAndGradients {
  std::vector<float> y, gx, gw, gb;
};

ValuesAndGradients run(const std::function<Tensor(const Tensor&)>& f, Conv2d& conv,
                       const Tensor& input, const Tensor& probe) {
  conv.weight.set_grad(Tensor());
  conv.bias.set_grad(Tensor());
  Tensor x = input.clone();
  x.set_requires_grad(true);
  const Tensor y = f(x);
  sum(mul(y, probe)).backward();
  return {y.to_vector(), x.grad().to_vector(), conv.weight.grad().to_vector(),
          conv.bias.grad().to_vector()};
}

// Fused, the ReLU's mask is taken from the pooled output: the same gradients as the three ops,
// bit for bit, in f32 and under bf16 autocast, including windows whose values are all cut to 0
// (the bias pushes many below) and the odd trailing row and column no window covers.
TEST(Fusion, ConvReluMaxPoolIsOneUnitWithTheUnfusedValuesAndGradients) {
  Generator g(5);
  // 4 input channels x 3 x 3 = 36 products per output: bf16 autocast takes the convolution.
  auto conv = std::make_shared<Conv2d>(Conv2dOptions{4, 6, 3, 1, 1, true}, g);
  conv->bias.fill_(-0.3f);
  auto relu = std::make_shared<ReLU>();
  auto pool = std::make_shared<MaxPool2d>(2);
  const std::vector<std::shared_ptr<Module>> layers = {conv, relu, pool, std::make_shared<ReLU>()};
  const auto units = plan_units(layers);
  ASSERT_EQ(units.size(), 2u);
  EXPECT_EQ(units[0].end, 3u);
  ASSERT_TRUE(units[0].fused);
  const Tensor x = Tensor::randn({3, 4, 9, 7}, g);
  const Tensor probe = Tensor::randn({3, 6, 4, 3}, g);
  std::vector<autograd::Precision> precisions = {autograd::Precision::F32};
  if (kernels::native_bf16()) precisions.push_back(autograd::Precision::BF16);
  for (const autograd::Precision precision : precisions) {
    SCOPED_TRACE(autograd::precision_name(precision));
    autograd::AutocastScope scope(precision);
    const ValuesAndGradients fused = run(units[0].fused, *conv, x, probe);
    const ValuesAndGradients apart =
        run([&](const Tensor& in) { return pool->forward(relu->forward(conv->forward(in))); },
            *conv, x, probe);
    EXPECT_EQ(fused.y, apart.y);
    EXPECT_EQ(fused.gx, apart.gx);
    EXPECT_EQ(fused.gw, apart.gw);
    EXPECT_EQ(fused.gb, apart.gb);
    const auto zeros = std::count(fused.y.begin(), fused.y.end(), 0.0f);
    EXPECT_GT(zeros, 0) << "no window was cut to 0 by the ReLU";
    EXPECT_LT(zeros, static_cast<std::ptrdiff_t>(fused.y.size()));
  }
}

}  // namespace
}  // namespace hpm::nn
