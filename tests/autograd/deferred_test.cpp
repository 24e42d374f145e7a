// Deferred weight gradients (zero-bubble pipelines): B under the guard, then W, equals one
// backward, bit for bit; the input gradient is ready after B alone; hooks see W's accumulation.
#include "hpm/autograd/deferred.h"

#include <gtest/gtest.h>

#include "hpm/autograd/ops.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

struct Net {
  Tensor w1, b1, w2, b2;
};

Net make_net() {
  Generator g(8);
  Net n{Tensor::randn({6, 5}, g), Tensor::randn({6}, g), Tensor::randn({3, 6}, g),
        Tensor::randn({3}, g)};
  for (Tensor* t : {&n.w1, &n.b1, &n.w2, &n.b2}) t->set_requires_grad(true);
  return n;
}

Tensor loss_of(const Net& n, const Tensor& x) {
  return sum(linear(relu(linear(x, n.w1, n.b1)), n.w2, n.b2));
}

TEST(DeferredWeightGradients, BThenWEqualsOneBackward) {
  Generator g(9);
  const Tensor x0 = Tensor::randn({4, 5}, g);
  Net whole = make_net(), split = make_net();
  Tensor xa = x0.clone(), xb = x0.clone();
  xa.set_requires_grad(true);
  xb.set_requires_grad(true);
  for (int micro = 0; micro < 2; ++micro) {  // twice: W also adds into existing gradients
    loss_of(whole, xa).backward();
    autograd::DeferredWeightGradients later;
    {
      autograd::DeferWeightGradients guard(later);
      loss_of(split, xb).backward();
    }
    EXPECT_EQ(later.size(), 2u);  // one per Linear
    if (micro == 0) {
      EXPECT_FALSE(split.w1.grad().defined()) << "W has not run";
      EXPECT_FALSE(split.b2.grad().defined());
    }
    EXPECT_EQ(xb.grad().to_vector(), xa.grad().to_vector()) << "B gives the input gradient";
    later.run();
    EXPECT_TRUE(later.empty());
    EXPECT_EQ(autograd::deferred_weight_gradients(), nullptr);
  }
  EXPECT_EQ(split.w1.grad().to_vector(), whole.w1.grad().to_vector());
  EXPECT_EQ(split.b1.grad().to_vector(), whole.b1.grad().to_vector());
  EXPECT_EQ(split.w2.grad().to_vector(), whole.w2.grad().to_vector());
  EXPECT_EQ(split.b2.grad().to_vector(), whole.b2.grad().to_vector());
}

TEST(DeferredWeightGradients, HooksRunWhenWAccumulates) {
  Net n = make_net();
  int calls = 0;
  n.w2.autograd_meta().post_accumulate_hooks.push_back([&](Tensor&) { ++calls; });
  Generator g(10);
  autograd::DeferredWeightGradients later;
  {
    autograd::DeferWeightGradients guard(later);
    loss_of(n, Tensor::randn({4, 5}, g)).backward();
  }
  EXPECT_EQ(calls, 0);
  later.run();
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace hpm
