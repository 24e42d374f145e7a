// The vectorized exp and GELU (src/tensor/kernels/vec.h) against libm in double, through the
// public kernels, at whatever width this CPU's clone runs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "hpm/tensor/kernels.h"
#include "hpm/tensor/tensor.h"

namespace hpm {
namespace {

Tensor sweep(float lo, float hi, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] =
        lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n - 1);
  return Tensor::from(v, {n});
}

TEST(VectorMath, ExpWithinTwoUlpAcrossTheFloatRange) {
  const Tensor x = sweep(-86.6f, 88.7f, 200001);
  const Tensor y = kernels::unary(kernels::UnaryOp::Exp, x);
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  double worst = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double ref = std::exp(static_cast<double>(px[i]));
    worst = std::max(worst, std::fabs(py[i] - ref) / ref);
  }
  // Two ulp: 2 * 2^-24 relative.
  EXPECT_LE(worst, std::numeric_limits<float>::epsilon()) << "worst relative error";
}

TEST(VectorMath, ExpEdgesFollowLibm) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::from({-inf, -1000.0f, -90.0f, 0.0f, 89.0f, inf, std::nanf("")}, {7});
  const std::vector<float> y = kernels::unary(kernels::UnaryOp::Exp, x).to_vector();
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_LT(y[2], 1e-38f);
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[4], inf);
  EXPECT_EQ(y[5], inf);
  EXPECT_TRUE(std::isnan(y[6]));
}

// Error in units of the float spacing at `scale`, at least 0.01's (values that small are
// rounding-sized in a sum of activations).
double ulps(double got, double exact, double scale) {
  const double unit = std::max(std::fabs(scale), 0.01) * std::numeric_limits<float>::epsilon();
  return std::fabs(got - exact) / unit;
}

// GELU and its derivative against the erf form in double, in units of the larger term's float
// spacing: the derivative Phi(x) + x phi(x) crosses zero at x = -0.75 by cancellation, where no
// float evaluation keeps relative precision. Simulated in float32: the one-piece Abramowitz &
// Stegun erf is 72 such units off; libm's erff and expf, 14; this code, 8.
TEST(VectorMath, GeluAndItsDerivativeMatchTheErfForm) {
  const Tensor x = sweep(-12.0f, 12.0f, 200001);
  const Tensor g = Tensor::full({x.numel()}, 1.0f);
  const Tensor y = kernels::unary(kernels::UnaryOp::Gelu, x);
  const Tensor dx = kernels::unary_backward(kernels::UnaryOp::Gelu, g, x, y);
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  const float* pd = dx.data<float>();
  double worst_y = 0.0, worst_d = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double u = px[i];
    const double cdf = 0.5 * (1.0 + std::erf(u / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * u * u) / std::sqrt(2.0 * M_PI);
    worst_y = std::max(worst_y, ulps(py[i], u * cdf, u * cdf));
    worst_d = std::max(worst_d, ulps(pd[i], cdf + u * pdf, std::max(cdf, std::fabs(u * pdf))));
  }
  EXPECT_LE(worst_y, 16.0) << "GELU";
  EXPECT_LE(worst_d, 16.0) << "GELU'";
  const float nan = std::nanf("");
  EXPECT_TRUE(
      std::isnan(kernels::unary(kernels::UnaryOp::Gelu, Tensor::from({nan}, {1})).to_vector()[0]));
}

// A row whose max is -inf is all masked (zeros; log: -inf) unless it holds a NaN, which the max
// passes over: then NaN throughout, as torch's softmax gives (it was zeros, and the NaN vanished).
TEST(VectorMath, SoftmaxOfAMaskedRowWithANaNIsNaN) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::from({nan, -inf, -inf, -inf, 2.0f, nan}, {3, 2});
  const std::vector<float> y = kernels::softmax(x, -1).to_vector();
  const std::vector<float> ly = kernels::log_softmax(x, -1).to_vector();
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]) && std::isnan(ly[0]) && std::isnan(ly[1]));
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(ly[2], -inf);
  EXPECT_TRUE(std::isnan(y[4]) && std::isnan(y[5]));
}

// kl_div's target term is torch's xlogy: a 0 target adds 0, a NaN one makes the loss NaN (it was
// skipped as if 0: a diverged teacher's row taught nothing, without a word).
TEST(VectorMath, KlDivOfANaNTargetIsNaN) {
  const Tensor x = kernels::log_softmax(Tensor::from({1.0f, 2.0f, 3.0f, 1.0f}, {2, 2}), -1);
  const Tensor zero = Tensor::from({0.0f, 1.0f, 0.5f, 0.5f}, {2, 2});
  EXPECT_TRUE(std::isfinite(kernels::kl_div_forward(x, zero).item()));
  const Tensor nan = Tensor::from({std::nanf(""), 1.0f, 0.5f, 0.5f}, {2, 2});
  EXPECT_TRUE(std::isnan(kernels::kl_div_forward(x, nan).item()));
}

// An empty row has no argmax (the CPU divided by zero: SIGFPE; the GPU refused it), and an index
// outside the table is refused in backward as in forward (the CPU wrote past the table).
TEST(VectorMath, ArgmaxOfNothingAndAnEmbeddingIndexOutsideAreRefused) {
  EXPECT_THROW(kernels::argmax_last(Tensor::zeros({2, 0})), std::invalid_argument);
  Tensor table = Tensor::zeros({3, 2});
  const Tensor grad = Tensor::from({1.0f, 1.0f}, {1, 2});
  EXPECT_THROW(kernels::embedding_backward(
                   grad, Tensor::from_i64(std::vector<std::int64_t>{-1}, {1}), table),
               std::out_of_range);
  EXPECT_THROW(
      kernels::embedding_backward(grad, Tensor::from_i64(std::vector<std::int64_t>{3}, {1}), table),
      std::out_of_range);
}

}  // namespace
}  // namespace hpm
