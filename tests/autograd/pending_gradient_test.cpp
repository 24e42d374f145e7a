// A gradient rule adding its input gradient into the one already summed for that input
// (autograd::take_pending_gradient; layer norm's rules, which a residual stream's skip path meets):
// the same bits as the engine's separate sum, no sum dispatched, and nothing taken where another
// gradient shares the pending one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/same_bits.h"
#include "hpm/autograd/autocast.h"
#include "hpm/autograd/node.h"
#include "hpm/autograd/ops.h"
#include "hpm/tensor/backend.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

// dx is an F32 gradient with the separate sum's bits.
void expect_same_bits(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.dtype(), DType::F32) << what;
  testing::expect_same_bits(actual, expected, what);
}

// The kernel's contract: dx added into a defined *grad_x equals the sum of the pending gradient
// and a fresh dx, bit for bit (x f32 and bf16; rows narrower and wider than one row block).
TEST(PendingGradient, LayerNormBackwardAddsIntoItAsTheEnginesSumWould) {
  Generator gen(5);
  for (const std::int64_t width : {std::int64_t{24}, std::int64_t{1500}}) {
    for (const bool bf16_x : {false, true}) {
      SCOPED_TRACE("width " + std::to_string(width) + (bf16_x ? ", bf16 x" : ""));
      const Tensor xf = Tensor::randn({37, width}, gen), w = Tensor::randn({width}, gen);
      const Tensor x = bf16_x ? kernels::to_bf16(xf) : xf;
      const Tensor gy = Tensor::randn({37, width}, gen), pending = Tensor::randn({37, width}, gen);
      Tensor mean, rstd;
      kernels::layer_norm_forward(xf, width, w, Tensor(), 1e-5f, mean, rstd);
      Tensor fresh, into = pending.clone(), gw_fresh, gw_into;
      kernels::layer_norm_backward(gy, x, width, w, mean, rstd, &fresh, &gw_fresh, nullptr);
      kernels::layer_norm_backward(gy, x, width, w, mean, rstd, &into, &gw_into, nullptr);
      expect_same_bits(into, kernels::binary(kernels::BinaryOp::Add, pending, fresh), "dx");
      expect_same_bits(gw_into, gw_fresh, "dw");
    }
  }
}

// A tied embedding (a GPT's token table, its classifier's weight too): the embedding's rule adds
// its rows into the classifier's gradient waiting for the table, no sum of the two dispatched;
// the values those of the two gradients summed (to the order of the additions).
TEST(PendingGradient, ATiedEmbeddingAddsItsRowsIntoTheClassifiersGradient) {
  Generator gen(9);
  const Tensor w0 = Tensor::randn({12, 6}, gen);
  const std::vector<std::int64_t> picks{3, 0, 3, 7, 11, 3, 5, 0}, targets{1, 2, 3, 4, 5, 6, 7, 8};
  const Tensor idx = Tensor::from_i64(picks, Shape{8}),
               labels = Tensor::from_i64(targets, Shape{8});
  // The loss with the table's two uses, each of them optionally cut off from the gradient.
  const auto grad = [&](bool embedding_grad, bool classifier_grad) {
    Tensor w = w0.clone();
    w.set_requires_grad(true);
    const Tensor h = embedding(embedding_grad ? w : w.detach(), idx);
    const Tensor loss =
        cross_entropy(linear(h, classifier_grad ? w : w.detach(), Tensor()), labels);
    const auto sums = dispatch_count(DeviceType::kCpu, Op::kBinary);
    loss.backward();
    EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kBinary) - sums, 0u);
    return w.grad();
  };
  const std::vector<float> both = grad(true, true).to_vector();
  const std::vector<float> rows = grad(true, false).to_vector(),
                           cls = grad(false, true).to_vector();
  ASSERT_EQ(both.size(), rows.size());
  for (std::size_t i = 0; i < both.size(); ++i)
    EXPECT_NEAR(both[i], rows[i] + cls[i], 1e-6f * (1.0f + std::abs(cls[i]))) << i;
}

TEST(PendingGradient, TheGradientAddedIntoMustBeAnF32TensorOfXsShape) {
  Generator gen(6);
  const Tensor x = Tensor::randn({4, 8}, gen), gy = Tensor::randn({4, 8}, gen);
  Tensor mean, rstd;
  kernels::layer_norm_forward(x, 8, Tensor(), Tensor(), 1e-5f, mean, rstd);
  Tensor wrong_shape = Tensor::zeros({8, 4});
  EXPECT_THROW(
      kernels::layer_norm_backward(gy, x, 8, Tensor(), mean, rstd, &wrong_shape, nullptr, nullptr),
      std::invalid_argument);
  Tensor wrong_dtype = kernels::to_bf16(Tensor::zeros({4, 8}));
  EXPECT_THROW(
      kernels::layer_norm_backward(gy, x, 8, Tensor(), mean, rstd, &wrong_dtype, nullptr, nullptr),
      std::invalid_argument);
}

// Binary ops dispatched by the backward of sum(h * r) for a leaf h: what the tests below add to.
std::uint64_t binaries_of_the_loss(const Tensor& r) {
  Tensor h = Tensor::zeros(r.shape());
  h.set_requires_grad(true);
  const Tensor loss = sum(mul(h, r));
  const auto before = dispatch_count(DeviceType::kCpu, Op::kBinary);
  loss.backward();
  return dispatch_count(DeviceType::kCpu, Op::kBinary) - before;
}

// h = x + linear(layer_norm(x)): x's gradient is the skip path's plus the norm's. The norm's rule
// runs after the skip path's Add and adds into its gradient: the engine dispatches no sum (no
// binary op beyond the loss's own), and dx has the bits of the separate sum.
TEST(PendingGradient, AResidualLayerNormAddsIntoTheSkipPathsGradient) {
  Generator gen(7);
  const std::int64_t rows = 9, width = 24;
  Tensor x = Tensor::randn({rows, width}, gen);
  const Tensor w = Tensor::randn({width, width}, gen), r = Tensor::randn({rows, width}, gen);
  x.set_requires_grad(true);
  const Tensor h = add(x, linear(layer_norm(x, width, Tensor(), Tensor(), 1e-5f), w, Tensor()));
  const std::uint64_t loss_binaries = binaries_of_the_loss(r);
  const Tensor loss = sum(mul(h, r));
  const auto binaries = dispatch_count(DeviceType::kCpu, Op::kBinary);
  loss.backward();
  EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kBinary) - binaries, loss_binaries);

  // By hand: the skip path's gradient is r, the norm's input gradient LN'(x)^T (r W).
  Tensor mean, rstd, from_norm;
  kernels::layer_norm_forward(x.detach(), width, Tensor(), Tensor(), 1e-5f, mean, rstd);
  kernels::layer_norm_backward(kernels::matmul(r, w), x.detach(), width, Tensor(), mean, rstd,
                               &from_norm, nullptr, nullptr);
  expect_same_bits(x.grad(), kernels::binary(kernels::BinaryOp::Add, r, from_norm), "dx");
}

// h = x + linear(layer_norm(x's rows), w) on a (B, T, E) stream x, through reshapes as nn::Linear
// takes rows; sum(h * r)'s backward, and how many sums beyond the loss's own it dispatched.
std::uint64_t sums_in_a_blocks_backward(const Tensor& x, const Tensor& w, const Tensor& r) {
  const std::int64_t width = x.size(-1), rows = x.numel() / width;
  const Tensor h =
      add(x, reshape(linear(layer_norm(reshape(x, {rows, width}), width, Tensor(), Tensor(), 1e-5f),
                            w, Tensor()),
                     x.shape()));
  const std::uint64_t loss_binaries = binaries_of_the_loss(r);
  const Tensor loss = sum(mul(h, r));
  const auto binaries = dispatch_count(DeviceType::kCpu, Op::kBinary);
  loss.backward();
  return dispatch_count(DeviceType::kCpu, Op::kBinary) - binaries - loss_binaries;
}

// That block's input gradient by hand, as rows: the skip path's r plus the norm's LN'(x)^T (r W).
Tensor blocks_input_gradient(const Tensor& x, const Tensor& w, const Tensor& r) {
  const std::int64_t width = x.size(-1), rows = x.numel() / width;
  const Tensor x_rows = x.detach().reshape({rows, width}), r_rows = r.reshape({rows, width});
  Tensor mean, rstd, from_norm;
  kernels::layer_norm_forward(x_rows, width, Tensor(), Tensor(), 1e-5f, mean, rstd);
  kernels::layer_norm_backward(kernels::matmul(r_rows, w), x_rows, width, Tensor(), mean, rstd,
                               &from_norm, nullptr, nullptr);
  return kernels::binary(kernels::BinaryOp::Add, r_rows, from_norm);
}

// The same block on a (B, T, E) stream whose rows the norm takes through a reshape (as
// nn::Linear does): the pending sum is found behind the view, and no sum is dispatched.
TEST(PendingGradient, IsFoundBehindAReshapeOfTheStream) {
  Generator gen(9);
  Tensor x = Tensor::randn({2, 5, 16}, gen);
  const Tensor w = Tensor::randn({16, 16}, gen), r = Tensor::randn({2, 5, 16}, gen);
  x.set_requires_grad(true);
  EXPECT_EQ(sums_in_a_blocks_backward(x, w, r), 0u);
  expect_same_bits(x.grad().reshape({10, 16}), blocks_input_gradient(x, w, r), "dx");
}

// A stream that is itself a reshape of a product's rows (a transformer block's output, made by
// its last product with the residual added): the next block's skip path and norm meet at that
// reshape, where the skip path's gradient waits; the norm adds into it there, and no sum is
// dispatched.
TEST(PendingGradient, IsFoundWhereItWaitsAtAView) {
  Generator gen(10);
  Tensor y = Tensor::randn({10, 16}, gen);
  const Tensor w = Tensor::randn({16, 16}, gen), r = Tensor::randn({2, 5, 16}, gen);
  y.set_requires_grad(true);
  const Tensor x = reshape(mul(y, 1.5f), {2, 5, 16});  // a node that is not a view, then one
  EXPECT_EQ(sums_in_a_blocks_backward(x, w, r), 0u);
  expect_same_bits(y.grad(), kernels::mul_scalar(blocks_input_gradient(x, w, r), 1.5f), "dy");
}

// h = x + layer_norm(x): the Add hands one tensor to both of its inputs, so the gradient pending
// for x is the norm's own output gradient; adding into it would change what the norm reads. It is
// not taken (the engine sums), and dx is still the sum.
TEST(PendingGradient, IsNotTakenWhereAnotherGradientSharesIt) {
  Generator gen(8);
  const std::int64_t rows = 6, width = 16;
  Tensor x = Tensor::randn({rows, width}, gen);
  const Tensor r = Tensor::randn({rows, width}, gen);
  x.set_requires_grad(true);
  const Tensor h = add(x, layer_norm(x, width, Tensor(), Tensor(), 1e-5f));
  const std::uint64_t loss_binaries = binaries_of_the_loss(r);
  const Tensor loss = sum(mul(h, r));
  const auto binaries = dispatch_count(DeviceType::kCpu, Op::kBinary);
  loss.backward();
  EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kBinary) - binaries,
            loss_binaries + 1);  // the engine's sum

  Tensor mean, rstd, from_norm;
  kernels::layer_norm_forward(x.detach(), width, Tensor(), Tensor(), 1e-5f, mean, rstd);
  kernels::layer_norm_backward(r, x.detach(), width, Tensor(), mean, rstd, &from_norm, nullptr,
                               nullptr);
  expect_same_bits(x.grad(), kernels::binary(kernels::BinaryOp::Add, r, from_norm), "dx");
}

// Outside a rule the engine runs, nothing is pending.
TEST(PendingGradient, NothingIsPendingOutsideABackward) {
  EXPECT_FALSE(autograd::take_pending_gradient(0, Shape{2, 3}).defined());
}

}  // namespace
}  // namespace hpm
