#include <gtest/gtest.h>

#include <cmath>

#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/node.h"
#include "hpm/autograd/ops.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

TEST(Engine, AccumulatesAcrossBackwardCalls) {
  Tensor w = Tensor::from({1.0f, 2.0f}, {2});
  w.set_requires_grad(true);
  sum(mul(w, 3.0f)).backward();
  sum(mul(w, 3.0f)).backward();
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{6.0f, 6.0f}));
}

// As torch.relu: a NaN passes forward (it was mapped to 0, hiding a diverged activation from the
// loss while NaN gradients reached the weights), and backward passes its gradient where the output
// is NaN, 0 where it is not positive.
TEST(Engine, ReluPassesNaN) {
  Tensor x = Tensor::from({std::nanf(""), -1.0f, 2.0f, 0.0f}, {4});
  x.set_requires_grad(true);
  Tensor y = relu(x);
  const std::vector<float> v = y.to_vector();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_EQ(v[2], 2.0f);
  EXPECT_EQ(v[3], 0.0f);
  sum(mul(y, Tensor::from({1.0f, 3.0f, 5.0f, 7.0f}, {4}))).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1.0f, 0.0f, 5.0f, 0.0f}));
}

TEST(Engine, NoGradRecordsNothing) {
  Tensor w = Tensor::from({1.0f}, {1});
  w.set_requires_grad(true);
  Tensor y;
  {
    NoGradGuard guard;
    y = mul(w, 2.0f);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(y.backward(), std::logic_error);
}

TEST(Engine, NonScalarNeedsGradient) {
  Tensor w = Tensor::from({1.0f, 2.0f}, {2});
  w.set_requires_grad(true);
  EXPECT_THROW(mul(w, 2.0f).backward(), std::logic_error);
}

TEST(Engine, SecondBackwardThroughFreedGraphIsAnError) {
  Tensor w = Tensor::from({1.0f, 2.0f}, {2});
  w.set_requires_grad(true);
  Tensor loss = sum(square(w));
  loss.backward();
  EXPECT_THROW(loss.backward(), std::logic_error);
}

TEST(Engine, SharedGradientIsNotAliasedBetweenLeaves) {
  // Add passes the same gradient to both inputs; each leaf must own its copy.
  Tensor a = Tensor::from({1.0f}, {1}), b = Tensor::from({2.0f}, {1});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  sum(add(a, b)).backward();
  EXPECT_FALSE(a.grad().same_storage(b.grad()));
  sum(mul(a, 5.0f)).backward();
  EXPECT_FLOAT_EQ(a.grad().item(), 6.0f);
  EXPECT_FLOAT_EQ(b.grad().item(), 1.0f);
}

TEST(Engine, PostAccumulateHookFires) {
  Tensor w = Tensor::from({1.0f}, {1});
  w.set_requires_grad(true);
  int calls = 0;
  w.autograd_meta().post_accumulate_hooks.push_back([&](Tensor& t) {
    ++calls;
    EXPECT_FLOAT_EQ(t.grad().item(), 2.0f);
  });
  sum(mul(w, 2.0f)).backward();
  EXPECT_EQ(calls, 1);
}

TEST(Engine, FusedConvReluMatchesTheComposition) {
  Generator gen(3);
  Tensor x = Tensor::randn({2, 3, 7, 6}, gen), w = Tensor::randn({4, 3, 3, 3}, gen),
         b = Tensor::randn({4}, gen);
  Tensor g = Tensor::randn({2, 4, 7, 6}, gen);
  kernels::Conv2dParams p{1, 1, 1, 1};
  auto run = [&](bool fused, std::vector<Tensor>& grads) {
    Tensor xi = x.clone(), wi = w.clone(), bi = b.clone();
    for (Tensor* t : {&xi, &wi, &bi}) t->set_requires_grad(true);
    kernels::Conv2dParams q = p;
    q.relu = fused;
    Tensor y = fused ? conv2d(xi, wi, bi, q) : relu(conv2d(xi, wi, bi, q));
    y.backward(g);
    grads = {xi.grad(), wi.grad(), bi.grad()};
    return y;
  };
  std::vector<Tensor> ga, gb;
  const Tensor ya = run(true, ga), yb = run(false, gb);
  const auto close = [](const Tensor& a, const Tensor& b) {
    for (std::int64_t i = 0; i < a.numel(); ++i)
      if (std::fabs(a.data<float>()[i] - b.data<float>()[i]) >
          1e-4f * (1.0f + std::fabs(b.data<float>()[i])))
        return false;
    return true;
  };
  EXPECT_TRUE(close(ya, yb));
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(close(ga[static_cast<std::size_t>(i)], gb[static_cast<std::size_t>(i)])) << i;
}

TEST(Engine, DiamondGraph) {
  // y = (x*2) + (x*3), dy/dx = 5
  Tensor x = Tensor::from({1.0f, -1.0f}, {2});
  x.set_requires_grad(true);
  Tensor h = mul(x, 1.0f);
  sum(add(mul(h, 2.0f), mul(h, 3.0f))).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{5.0f, 5.0f}));
}

}  // namespace
}  // namespace hpm

namespace hpm {
namespace {

// A Linear's weight gradient is added by the GEMM itself into a gradient the weight already
// holds alone; with a hook to run, or a gradient someone else holds, AccumulateGrad adds it.
// Both give the sum of the two backward passes.
TEST(Engine, LinearAddsIntoAnExistingGradientInPlace) {
  Generator g(4);
  Tensor x1 = Tensor::randn({6, 5}, g), x2 = Tensor::randn({6, 5}, g);
  Tensor w = Tensor::randn({3, 5}, g), b = Tensor::randn({3}, g);
  auto grads = [&](bool hook, bool hold) {
    Tensor wl = w.clone().set_requires_grad(true), bl = b.clone().set_requires_grad(true);
    int calls = 0;
    if (hook) wl.autograd_meta().post_accumulate_hooks.push_back([&](Tensor&) { ++calls; });
    sum(linear(x1, wl, bl)).backward();
    const void* first = wl.grad().raw_data();
    Tensor held = hold ? wl.grad() : Tensor();  // a second holder: AccumulateGrad adds
    sum(linear(x2, wl, bl)).backward();
    if (!hook && !hold) {
      EXPECT_EQ(wl.grad().raw_data(), first);  // added in place
    }
    if (hook) {
      EXPECT_EQ(calls, 2);
    }
    return wl.grad().to_vector();
  };
  // Reference: dW = sum over rows of x, for every output, summed over both passes.
  std::vector<float> expected(15, 0.0f);
  for (const Tensor& x : {x1, x2}) {
    const auto v = x.to_vector();
    for (int o = 0; o < 3; ++o)
      for (int r = 0; r < 6; ++r)
        for (int i = 0; i < 5; ++i) expected[o * 5 + i] += v[r * 5 + i];
  }
  for (auto [hook, hold] : {std::pair{false, false}, {true, false}, {false, true}}) {
    const std::vector<float> got = grads(hook, hold);
    for (int i = 0; i < 15; ++i) EXPECT_NEAR(got[i], expected[i], 1e-5f) << hook << hold << i;
  }
}

}  // namespace
}  // namespace hpm
