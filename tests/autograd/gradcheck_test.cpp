// Finite-difference gradient checks, one or more per differentiable op. The last test fails if an
// op in op_names() has no case here.
#include "hpm/autograd/gradcheck.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "hpm/autograd/node.h"
#include "hpm/autograd/ops.h"
#include "hpm/tensor/random.h"

namespace hpm::autograd {
namespace {

Generator& gen() {
  static Generator g(42);
  return g;
}

Tensor param(const Shape& s, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::uniform(s, gen(), lo, hi);
  t.set_requires_grad(true);
  return t;
}

// Values spaced 0.05 apart in random order: no ties or kinks within the finite-difference step.
Tensor distinct(const Shape& s) {
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  std::iota(v.begin(), v.end(), 0.0f);
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[gen().below(i)]);
  for (auto& x : v) x = (x - static_cast<float>(v.size()) / 2.0f + 0.5f) * 0.05f;
  Tensor t = Tensor::from(v, s);
  t.set_requires_grad(true);
  return t;
}

Tensor labels(std::vector<std::int64_t> v) {
  return Tensor::from_i64(v, Shape{static_cast<std::int64_t>(v.size())});
}

#define EXPECT_GRADCHECK(fn, ...)          \
  do {                                     \
    auto r = gradcheck(fn, {__VA_ARGS__}); \
    EXPECT_TRUE(r.ok) << r.message;        \
  } while (0)

using In = std::vector<Tensor>;

void check_Arithmetic() {
  EXPECT_GRADCHECK([](const In& x) { return add(x[0], x[1]); }, param({3, 4}), param({3, 4}));
  EXPECT_GRADCHECK([](const In& x) { return add(x[0], x[1]); }, param({3, 4}), param({4}));
  EXPECT_GRADCHECK([](const In& x) { return sub(x[0], x[1]); }, param({2, 3, 4}), param({3, 1}));
  EXPECT_GRADCHECK([](const In& x) { return mul(x[0], x[1]); }, param({3, 4}), param({1, 4}));
  EXPECT_GRADCHECK([](const In& x) { return div(x[0], x[1]); }, param({3, 4}),
                   param({3, 4}, 0.5f, 2.0f));
  EXPECT_GRADCHECK([](const In& x) { return add(x[0], 2.5f); }, param({5}));
  EXPECT_GRADCHECK([](const In& x) { return mul(x[0], -1.5f); }, param({5}));
  EXPECT_GRADCHECK([](const In& x) { return neg(x[0]); }, param({5}));
  // The same input along two paths: gradients must add up.
  EXPECT_GRADCHECK([](const In& x) { return mul(x[0], x[0]); }, param({4}));
}

void check_ElementwiseFunctions() {
  EXPECT_GRADCHECK([](const In& x) { return exp(x[0]); }, param({6}));
  EXPECT_GRADCHECK([](const In& x) { return log(x[0]); }, param({6}, 0.5f, 2.0f));
  EXPECT_GRADCHECK([](const In& x) { return sqrt(x[0]); }, param({6}, 0.5f, 2.0f));
  EXPECT_GRADCHECK([](const In& x) { return square(x[0]); }, param({6}));
  EXPECT_GRADCHECK([](const In& x) { return relu(x[0]); }, distinct({4, 5}));
  EXPECT_GRADCHECK([](const In& x) { return tanh(x[0]); }, param({6}));
  EXPECT_GRADCHECK([](const In& x) { return sigmoid(x[0]); }, param({6}));
  EXPECT_GRADCHECK([](const In& x) { return gelu(x[0]); }, param({6}, -3.0f, 3.0f));
  EXPECT_GRADCHECK([](const In& x) { return gelu(x[0], true); }, param({6}, -3.0f, 3.0f));
}

void check_ReductionsAndShapes() {
  EXPECT_GRADCHECK([](const In& x) { return sum(x[0]); }, param({3, 4}));
  EXPECT_GRADCHECK([](const In& x) { return sum(x[0], 1); }, param({2, 3, 4}));
  EXPECT_GRADCHECK([](const In& x) { return sum(x[0], 0, true); }, param({2, 3}));
  EXPECT_GRADCHECK([](const In& x) { return mean(x[0], -1); }, param({2, 3}));
  EXPECT_GRADCHECK([](const In& x) { return mean(x[0]); }, param({2, 3}));
  EXPECT_GRADCHECK([](const In& x) { return mul(reshape(x[0], {6, 2}), 2.0f); }, param({3, 4}));
  EXPECT_GRADCHECK([](const In& x) { return flatten(x[0]); }, param({2, 3, 2}));
  EXPECT_GRADCHECK([](const In& x) { return transpose(x[0]); }, param({3, 5}));
  EXPECT_GRADCHECK([](const In& x) { return permute(x[0], {2, 0, 1}); }, param({2, 3, 4}));
  EXPECT_GRADCHECK([](const In& x) { return transpose(x[0], 1, -1); }, param({2, 3, 4}));
  EXPECT_GRADCHECK([](const In& x) { return narrow(x[0], 1, 1, 2); }, param({2, 4, 3}));
  EXPECT_GRADCHECK(
      [](const In& x) {
        return concat({x[0], x[1], x[0]}, -1);
      },
      param({2, 3}), param({2, 1}));
  EXPECT_GRADCHECK(
      [](const In& x) {
        return concat({x[0], x[1]}, 0);
      },
      param({1, 3}), param({2, 3}));
  // qkv-style: split the last dimension into three and recombine them unevenly.
  EXPECT_GRADCHECK(
      [](const In& x) {
        auto p = split(x[0], 2, -1);
        return add(mul(p[0], p[1]), p[2]);
      },
      param({2, 3, 6}));
  EXPECT_GRADCHECK(
      [](const In& x) {
        auto p = chunk(x[0], 2, 0);
        return concat({p[1], p[0]}, 0);
      },
      param({5, 2}));
}

void check_Selection() {
  const std::vector<std::int64_t> bits = {1, 0, 0, 1, 1, 0};
  Tensor cond = Tensor::zeros({2, 3}, DType::I8);
  for (std::size_t i = 0; i < bits.size(); ++i)
    cond.data<std::int8_t>()[i] = static_cast<std::int8_t>(bits[i]);
  EXPECT_GRADCHECK([cond](const In& x) { return where(cond, x[0], x[1]); }, param({2, 3}),
                   param({2, 3}));
  // b broadcast along rows: its gradient sums the rows where cond is false.
  EXPECT_GRADCHECK([cond](const In& x) { return where(cond, x[0], x[1]); }, param({2, 3}),
                   param({3}));
  EXPECT_GRADCHECK([cond](const In& x) { return masked_fill(x[0], cond, -7.0f); },
                   param({4, 2, 3}));
  EXPECT_GRADCHECK([cond](const In& x) { return masked_softmax(x[0], cond, -1); }, param({2, 3}));
}

void check_LinearAlgebra() {
  EXPECT_GRADCHECK([](const In& x) { return matmul(x[0], x[1]); }, param({3, 4}), param({4, 5}));
  // Batched, with broadcast batch dimensions (a weight shared by every batch, heads).
  EXPECT_GRADCHECK([](const In& x) { return matmul(x[0], x[1]); }, param({2, 3, 4}),
                   param({2, 4, 5}));
  EXPECT_GRADCHECK([](const In& x) { return matmul(x[0], x[1]); }, param({2, 3, 4}), param({4, 2}));
  EXPECT_GRADCHECK([](const In& x) { return matmul(x[0], x[1]); }, param({2, 1, 3, 4}),
                   param({3, 4, 2}));
  EXPECT_GRADCHECK([](const In& x) { return linear(x[0], x[1], x[2]); }, param({4, 5}),
                   param({3, 5}), param({3}));
  EXPECT_GRADCHECK([](const In& x) { return linear(x[0], x[1], Tensor()); }, param({4, 5}),
                   param({3, 5}));
}

void check_Convolution() {
  kernels::Conv2dParams same{1, 1, 1, 1}, strided{2, 2, 1, 1}, valid{1, 1, 0, 0};
  for (auto p : {same, strided, valid}) {
    EXPECT_GRADCHECK([p](const In& x) { return conv2d(x[0], x[1], x[2], p); }, param({2, 3, 6, 5}),
                     param({4, 3, 3, 3}), param({4}));
  }
  EXPECT_GRADCHECK([same](const In& x) { return conv2d(x[0], x[1], Tensor(), same); },
                   param({1, 2, 4, 4}), param({3, 2, 1, 1}));
  // With the fused ReLU. A bias shifting half the channels far below zero keeps every output
  // away from the kink, so both sides of the ReLU are exercised without crossing it.
  kernels::Conv2dParams fused = same;
  fused.relu = true;
  Tensor shift = Tensor::from({3.0f, -30.0f, 3.0f}, {3});
  shift.set_requires_grad(true);
  EXPECT_GRADCHECK([fused](const In& x) { return conv2d(x[0], x[1], x[2], fused); },
                   param({1, 2, 5, 5}, 0.0f, 0.5f), param({3, 2, 3, 3}, 0.0f, 0.5f), shift);
}

void check_Pooling() {
  EXPECT_GRADCHECK(
      [](const In& x) {
        return max_pool2d(x[0], {2, 2, 2, 2, 0, 0, true});
      },
      distinct({2, 2, 6, 6}));
  EXPECT_GRADCHECK(
      [](const In& x) {
        return max_pool2d(x[0], {3, 3, 2, 2, 1, 1, true});
      },
      distinct({1, 2, 7, 7}));
  EXPECT_GRADCHECK(
      [](const In& x) {
        return avg_pool2d(x[0], {2, 2, 2, 2, 0, 0, true});
      },
      param({2, 2, 4, 6}));
  EXPECT_GRADCHECK(
      [](const In& x) {
        return avg_pool2d(x[0], {3, 3, 1, 1, 1, 1, false});
      },
      param({1, 2, 5, 5}));
  EXPECT_GRADCHECK([](const In& x) { return global_avg_pool2d(x[0]); }, param({2, 3, 3, 3}));
}

void check_Normalization() {
  Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3});
  EXPECT_GRADCHECK(
      [&](const In& x) { return batch_norm(x[0], x[1], x[2], rm, rv, true, 0.1f, 1e-5f); },
      param({4, 3, 2, 2}), param({3}), param({3}));
  EXPECT_GRADCHECK(
      [&](const In& x) { return batch_norm(x[0], x[1], x[2], rm, rv, true, 0.1f, 1e-5f); },
      param({5, 3}), param({3}), param({3}));
  EXPECT_GRADCHECK(
      [&](const In& x) { return batch_norm(x[0], x[1], x[2], rm, rv, false, 0.1f, 1e-5f); },
      param({4, 3}), param({3}), param({3}));
  EXPECT_GRADCHECK([](const In& x) { return layer_norm(x[0], 6, x[1], x[2], 1e-5f); },
                   param({3, 6}), param({6}), param({6}));
  EXPECT_GRADCHECK([](const In& x) { return layer_norm(x[0], 4, Tensor(), Tensor(), 1e-5f); },
                   param({2, 4}));
}

void check_Embedding() {
  Tensor idx = Tensor::from_i64(std::vector<std::int64_t>{1, 3, 1, 0}, Shape{2, 2});
  EXPECT_GRADCHECK([idx](const In& x) { return embedding(x[0], idx); }, param({5, 3}));
}

void check_SoftmaxAndLosses() {
  EXPECT_GRADCHECK([](const In& x) { return softmax(x[0], -1); }, param({3, 5}));
  EXPECT_GRADCHECK([](const In& x) { return softmax(x[0], 0); }, param({3, 5}));
  EXPECT_GRADCHECK([](const In& x) { return log_softmax(x[0], -1); }, param({3, 5}));
  EXPECT_GRADCHECK([](const In& x) { return log_softmax(x[0], 1); }, param({2, 3, 4}));
  Tensor y = labels({1, 0, 4, 2});
  EXPECT_GRADCHECK([y](const In& x) { return cross_entropy(x[0], y); }, param({4, 5}, -2.0f, 2.0f));
  EXPECT_GRADCHECK([y](const In& x) { return cross_entropy(x[0], y, 0.2f); }, param({4, 5}));
  EXPECT_GRADCHECK([y](const In& x) { return nll_loss(log_softmax(x[0]), y); }, param({4, 5}));
  EXPECT_GRADCHECK([](const In& x) { return mse_loss(x[0], x[1]); }, param({3, 2}), param({3, 2}));
  EXPECT_GRADCHECK([](const In& x) { return kl_div(log_softmax(x[0]), softmax(x[1])); },
                   param({3, 4}), param({3, 4}));
  // A language model's loss: (B, T, V) logits, (B, T) targets, one position ignored.
  Tensor tokens = Tensor::from_i64(std::vector<std::int64_t>{3, -100, 0, 1, 4, 2}, Shape{2, 3});
  EXPECT_GRADCHECK([tokens](const In& x) { return cross_entropy(x[0], tokens); },
                   param({2, 3, 5}, -2.0f, 2.0f));
  EXPECT_GRADCHECK([tokens](const In& x) { return cross_entropy(x[0], tokens, 0.1f); },
                   param({2, 3, 5}));
}

void check_Attention() {
  // Several heads, T not a multiple of the 64-row tile, causal and not, and S != T.
  for (bool causal : {false, true}) {
    EXPECT_GRADCHECK(
        [causal](const In& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal); },
        param({2, 2, 5, 4}), param({2, 2, 5, 4}), param({2, 2, 5, 4}));
    EXPECT_GRADCHECK(
        [causal](const In& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal); },
        param({1, 2, 70, 3}), param({1, 2, 70, 3}), param({1, 2, 70, 3}));
  }
  EXPECT_GRADCHECK(
      [](const In& x) { return scaled_dot_product_attention(x[0], x[1], x[2], false, 0.7f); },
      param({3, 4, 2}), param({3, 6, 2}), param({3, 6, 2}));
  for (bool causal : {false, true}) {
    EXPECT_GRADCHECK([causal](const In& x) { return packed_self_attention(x[0], 2, causal); },
                     param({2, 5, 3 * 2 * 3}));
  }
}

TEST(Gradcheck, Arithmetic) { check_Arithmetic(); }
TEST(Gradcheck, ElementwiseFunctions) { check_ElementwiseFunctions(); }
TEST(Gradcheck, ReductionsAndShapes) { check_ReductionsAndShapes(); }
TEST(Gradcheck, LinearAlgebra) { check_LinearAlgebra(); }
TEST(Gradcheck, Convolution) { check_Convolution(); }
TEST(Gradcheck, Pooling) { check_Pooling(); }
TEST(Gradcheck, Normalization) { check_Normalization(); }
TEST(Gradcheck, Embedding) { check_Embedding(); }
TEST(Gradcheck, SoftmaxAndLosses) { check_SoftmaxAndLosses(); }
TEST(Gradcheck, Selection) { check_Selection(); }
TEST(Gradcheck, Attention) { check_Attention(); }

TEST(Gradcheck, DetectsAWrongGradient) {
  // The harness itself must be able to fail: a rule that is off by a factor of 2.
  auto wrong = [](const In& x) {
    return record("Wrong", {x[0]}, kernels::mul_scalar(x[0], 3.0f),
                  [](const Tensor& g, const std::vector<bool>&) {
                    return std::vector<Tensor>{kernels::mul_scalar(g, 6.0f)};
                  });
  };
  auto r = gradcheck(wrong, {param({3})});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("analytic"), std::string::npos);
}

// CTest runs each test in its own process, so this one runs every case itself before asking
// which ops were exercised.
TEST(Gradcheck, EveryOpIsChecked) {
  check_Arithmetic();
  check_ElementwiseFunctions();
  check_ReductionsAndShapes();
  check_LinearAlgebra();
  check_Convolution();
  check_Pooling();
  check_Normalization();
  check_Embedding();
  check_SoftmaxAndLosses();
  check_Selection();
  check_Attention();
  for (const auto& name : op_names()) {
    EXPECT_TRUE(gradcheck_covered().count(name)) << "no gradcheck exercises op " << name;
  }
}

}  // namespace
}  // namespace hpm::autograd
