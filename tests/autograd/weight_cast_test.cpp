// The bf16 copies of parameters a step's products take (autograd/weight_cast.h): made once in a
// WeightCastScope and the same tensor at every later use; converted at each use outside one, and
// for whatever is not a parameter; a parameter whose values moved is converted anew.
#include "hpm/autograd/weight_cast.h"

#include <gtest/gtest.h>

#include <optional>

#include "common/same_bits.h"
#include "hpm/autograd/autocast.h"
#include "hpm/autograd/ops.h"
#include "hpm/tensor/backend.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::autograd {
namespace {

using testing::expect_same_bits;

TEST(WeightCast, AParameterIsConvertedOnceAScope) {
  Device other("other");  // where w moves at the end: it must outlive w
  Generator gen(3);
  Tensor w = Tensor::randn({8, 4}, gen);
  w.set_requires_grad(true);
  const Tensor activation = Tensor::randn({8, 4}, gen);
  {
    const WeightCastScope step;
    const Tensor first = bf16_parameter(w);
    expect_same_bits(first, kernels::to_bf16(w), "the copy");
    {
      const WeightCastScope nested;  // shares the step's
      EXPECT_EQ(bf16_parameter(w).raw_data(), first.raw_data());
    }
    EXPECT_EQ(bf16_parameter(w).raw_data(), first.raw_data()) << "converted again";
    EXPECT_NE(bf16_parameter(activation).raw_data(), bf16_parameter(activation).raw_data())
        << "not a parameter: converted at each use";
  }
  // The optimizer updates between scopes: the next one converts the new values.
  w.data<float>()[0] += 1.0f;
  const WeightCastScope next_step;
  const Tensor updated = bf16_parameter(w);
  expect_same_bits(updated, kernels::to_bf16(w), "the updated copy");
  // Values moved to another Device (a pipeline stage's) are converted anew.
  w.impl()->storage->move_to(other);
  EXPECT_NE(bf16_parameter(w).raw_data(), updated.raw_data());
}

// A scope converts at its first request every parameter that the last scope beginning with the
// same parameter asked for, in one to_bf16_many, from their values now (after the optimizer's
// update between the scopes); a scope beginning with another parameter, or a parameter not asked
// for since, is not converted ahead; a freed parameter is skipped.
TEST(WeightCast, TheNextScopeConvertsTheLastOnesParametersInOneGo) {
  Generator gen(5);
  const auto parameter = [&](std::int64_t n) {
    Tensor t = Tensor::randn({n}, gen);
    t.set_requires_grad(true);
    return t;
  };
  Tensor a = parameter(5), b = parameter(7), c = parameter(3);
  std::optional<Tensor> d = parameter(9);
  const auto count = [](Op op) { return dispatch_count(DeviceType::kCpu, op); };
  {
    const WeightCastScope step;
    for (const Tensor* w : {&a, &b, &c, &*d}) bf16_parameter(*w);
  }
  b.data<float>()[2] += 1.0f;  // the update between the steps
  d.reset();                   // a parameter freed (its model's layer dropped)
  {
    const WeightCastScope step;
    const auto many = count(Op::kToBf16Many), one = count(Op::kToBf16);
    const Tensor ab = bf16_parameter(a), bb = bf16_parameter(b);
    bf16_parameter(a);  // c not asked for this time
    EXPECT_EQ(count(Op::kToBf16Many) - many, 1u);
    EXPECT_EQ(count(Op::kToBf16) - one, 0u) << "nothing converted one by one";
    expect_same_bits(ab, kernels::to_bf16(a), "a, converted ahead");
    expect_same_bits(bb, kernels::to_bf16(b), "b's updated values");
  }
  {
    const WeightCastScope other;  // begins with another parameter: nothing ahead
    const auto many = count(Op::kToBf16Many);
    bf16_parameter(c);
    EXPECT_EQ(count(Op::kToBf16Many) - many, 0u);
  }
  {
    const WeightCastScope step;  // a's last scope asked for a and b only
    const auto one = count(Op::kToBf16);
    bf16_parameter(a);
    bf16_parameter(b);
    bf16_parameter(c);
    EXPECT_EQ(count(Op::kToBf16) - one, 1u) << "c, converted at its use";
  }
}

// Under bf16 autocast a GPT-like layer's products convert each weight once per scope, forward
// and backward together: the step's conversions of F32 tensors drop by one per weight, and the
// gradients are the same bits.
TEST(WeightCast, AStepConvertsEachWeightOnceWithTheSameGradients) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "bf16 autocast needs AVX512_BF16";
  Generator gen(4);
  const Tensor x0 = Tensor::randn({16, 32}, gen), w0 = Tensor::randn({48, 32}, gen);
  const Tensor w1_0 = Tensor::randn({8, 48}, gen);
  Tensor grads[2][2];
  std::uint64_t conversions[2];
  for (int cached = 0; cached < 2; ++cached) {
    Tensor x = x0.clone(), w = w0.clone(), w1 = w1_0.clone();
    x.set_requires_grad(true);  // each product's backward then takes its weight again for dx
    w.set_requires_grad(true);
    w1.set_requires_grad(true);
    const auto before = dispatch_count(DeviceType::kCpu, Op::kToBf16);
    {
      const AutocastScope bf16(Precision::BF16);
      std::optional<WeightCastScope> step;
      if (cached) step.emplace();
      sum(linear(relu(linear(x, w, Tensor())), w1, Tensor())).backward();
    }
    conversions[cached] = dispatch_count(DeviceType::kCpu, Op::kToBf16) - before;
    grads[cached][0] = w.grad();
    grads[cached][1] = w1.grad();
  }
  EXPECT_EQ(conversions[0] - conversions[1], 2u) << "one conversion of each weight saved";
  expect_same_bits(grads[1][0], grads[0][0], "dW");
  expect_same_bits(grads[1][1], grads[0][1], "dW1");
}

}  // namespace
}  // namespace hpm::autograd
