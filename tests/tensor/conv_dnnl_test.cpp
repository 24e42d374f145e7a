// The oneDNN convolution against the im2col + GEMM one (itself checked against a direct loop in
// tensor_test.cpp, and both against PyTorch in the golden tests): forward and all three
// gradients, on shapes that exercise oneDNN's layout and padding handling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

using kernels::Conv2dParams;

struct ConvCase {
  std::int64_t n, c, h, w, oc, kh, kw;
  Conv2dParams p;
  std::string str() const {
    return "x(" + std::to_string(n) + "," + std::to_string(c) + "," + std::to_string(h) + "," +
           std::to_string(w) + ") w(" + std::to_string(oc) + "," + std::to_string(c) + "," +
           std::to_string(kh) + "," + std::to_string(kw) + ") stride " +
           std::to_string(p.stride_h) + "x" + std::to_string(p.stride_w) + " pad " +
           std::to_string(p.pad_h) + "x" + std::to_string(p.pad_w);
  }
};

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> all = {
      {2, 3, 7, 6, 4, 3, 3, {2, 1, 1, 0}},       // mixed stride and padding
      {3, 1, 9, 11, 5, 3, 3, {1, 1, 1, 1}},      // one input channel, odd sizes
      {2, 5, 13, 13, 7, 5, 5, {2, 2, 2, 2}},     // 5x5, stride 2, pad 2
      {4, 17, 8, 8, 33, 1, 1, {1, 1, 0, 0}},     // 1x1, channels not a multiple of 16
      {1, 8, 10, 7, 16, 3, 2, {2, 1, 0, 1}},     // non-square kernel
      {2, 4, 8, 9, 6, 3, 3, {2, 2, 0, 0}},       // stride 2 leaving the last input row unused
      {5, 16, 12, 12, 32, 3, 3, {1, 1, 1, 1}},   // blocked layouts on both sides
      {64, 32, 14, 14, 64, 3, 3, {1, 1, 1, 1}},  // the cnn's second convolution
  };
  return all;
}

// |a - b| <= tol * max(1, max |b|) elementwise: relative to the tensor's scale, so that
// near-zero entries of a long sum are not held to a relative tolerance of their own.
void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  float scale = 1.0f;
  for (float v : vb) scale = std::max(scale, std::fabs(v));
  float worst = 0.0f;
  for (std::size_t i = 0; i < va.size(); ++i) worst = std::max(worst, std::fabs(va[i] - vb[i]));
  EXPECT_LE(worst, 1e-4f * scale) << what << ": max abs diff " << worst << ", scale " << scale;
}

TEST(ConvDnnl, ForwardMatchesIm2col) {
  Generator gen(11);
  for (const ConvCase& c : conv_cases()) {
    Tensor x = Tensor::randn({c.n, c.c, c.h, c.w}, gen);
    Tensor w = Tensor::randn({c.oc, c.c, c.kh, c.kw}, gen);
    Tensor b = Tensor::randn({c.oc}, gen);
    expect_close(cpu::conv2d_forward_dnnl(x, w, b, c.p), cpu::conv2d_forward_im2col(x, w, b, c.p),
                 c.str() + " with bias");
    expect_close(cpu::conv2d_forward_dnnl(x, w, Tensor(), c.p),
                 cpu::conv2d_forward_im2col(x, w, Tensor(), c.p), c.str() + " no bias");
  }
}

TEST(ConvDnnl, BackwardMatchesIm2col) {
  Generator gen(12);
  for (const ConvCase& c : conv_cases()) {
    Tensor x = Tensor::randn({c.n, c.c, c.h, c.w}, gen);
    Tensor w = Tensor::randn({c.oc, c.c, c.kh, c.kw}, gen);
    Tensor y = cpu::conv2d_forward_im2col(x, w, Tensor(), c.p);
    Tensor gy = Tensor::randn(y.shape(), gen);
    Tensor rx, rw, rb;
    cpu::conv2d_backward_im2col(gy, x, w, c.p, &rx, &rw, &rb);
    {
      Tensor gx, gw, gb;
      cpu::conv2d_backward_dnnl(gy, x, w, c.p, &gx, &gw, &gb);
      expect_close(gx, rx, c.str() + " grad_x");
      expect_close(gw, rw, c.str() + " grad_w");
      expect_close(gb, rb, c.str() + " grad_bias");
    }
    // Subsets, as autograd asks for them: each is a different plan.
    {
      Tensor gx;
      cpu::conv2d_backward_dnnl(gy, x, w, c.p, &gx, nullptr, nullptr);
      expect_close(gx, rx, c.str() + " grad_x alone");
    }
    {
      Tensor gw, gb;
      cpu::conv2d_backward_dnnl(gy, x, w, c.p, nullptr, &gw, &gb);
      expect_close(gw, rw, c.str() + " grad_w with grad_bias, no grad_x");
      expect_close(gb, rb, c.str() + " grad_bias with grad_w, no grad_x");
    }
    {
      Tensor gw;
      cpu::conv2d_backward_dnnl(gy, x, w, c.p, nullptr, &gw, nullptr);
      expect_close(gw, rw, c.str() + " grad_w alone");
    }
    {
      Tensor gx, gb;
      cpu::conv2d_backward_dnnl(gy, x, w, c.p, &gx, nullptr, &gb);
      expect_close(gx, rx, c.str() + " grad_x with grad_bias");
      expect_close(gb, rb, c.str() + " grad_bias without grad_w");
    }
  }
}

TEST(ConvDnnl, DispatchMatchesIm2col) {
  Generator gen(13);
  const ConvCase& c = conv_cases()[2];
  Tensor x = Tensor::randn({c.n, c.c, c.h, c.w}, gen);
  Tensor w = Tensor::randn({c.oc, c.c, c.kh, c.kw}, gen);
  Tensor b = Tensor::randn({c.oc}, gen);
  Tensor y = cpu::conv2d_forward(x, w, b, c.p);
  expect_close(y, cpu::conv2d_forward_im2col(x, w, b, c.p), c.str());
  Tensor gy = Tensor::randn(y.shape(), gen), gx, gw, gb, rx, rw, rb;
  cpu::conv2d_backward(gy, x, w, c.p, &gx, &gw, &gb);
  cpu::conv2d_backward_im2col(gy, x, w, c.p, &rx, &rw, &rb);
  expect_close(gx, rx, c.str() + " grad_x");
  expect_close(gw, rw, c.str() + " grad_w");
  expect_close(gb, rb, c.str() + " grad_bias");
}

// Conv2d + ReLU + MaxPool2d fused (the convolution's output kept in oneDNN's channel-blocked
// layout, pooled from it, the gradient unpooled into it) against the three ops apart: the same
// pooled values, winners and gradients, bit for bit, in f32 and bf16. The shapes take the blocked
// path on AVX-512 (16 and more output channels), with channels that pad the last block (20) and
// odd heights and widths that leave a row and a column to no window; the negative bias cuts
// whole windows to 0, where the first element wins.
TEST(ConvDnnl, FusedReluMaxPoolMatchesTheOpsApart) {
  Generator gen(16);
  struct Case {
    std::int64_t n, c, h, w, oc;
  };
  const Case shapes[] = {{2, 3, 9, 7, 20}, {3, 16, 8, 8, 32}, {64, 32, 14, 14, 64}};
  std::vector<bool> precisions = {false};
  if (kernels::native_bf16()) precisions.push_back(true);
  for (const Case& c : shapes) {
    for (const bool bf16 : precisions) {
      const std::string what = "x(" + std::to_string(c.n) + "," + std::to_string(c.c) + "," +
                               std::to_string(c.h) + "," + std::to_string(c.w) + ") oc " +
                               std::to_string(c.oc) + (bf16 ? " bf16" : " f32");
      Conv2dParams p{1, 1, 1, 1, true, bf16};
      const kernels::Pool2dParams pool;
      Tensor x = Tensor::randn({c.n, c.c, c.h, c.w}, gen);
      Tensor w = Tensor::randn({c.oc, c.c, 3, 3}, gen);
      Tensor b = Tensor::full({c.oc}, -1.0f);
      Tensor argmax, ref_argmax;
      const Tensor pooled = cpu::conv2d_relu_max_pool2d_forward(x, w, b, p, pool, argmax);
      const Tensor y = cpu::conv2d_forward(x, w, b, p);
      const Tensor ref = kernels::max_pool2d_forward(y, pool, ref_argmax);
      EXPECT_EQ(pooled.to_vector(), ref.to_vector()) << what;
      const auto winners = [](const Tensor& t) {
        const auto* p = t.data<std::int32_t>();
        return std::vector<std::int32_t>(p, p + t.numel());
      };
      EXPECT_EQ(winners(argmax), winners(ref_argmax)) << what;
      const std::vector<float> v = pooled.to_vector();
      EXPECT_GT(std::count(v.begin(), v.end(), 0.0f), 0) << what << ": no window cut to 0";

      const Tensor gp = Tensor::randn(pooled.shape(), gen);
      Tensor gx, gw, gb, rx, rw, rb;
      cpu::conv2d_relu_max_pool2d_backward(gp, argmax, x, w, p, pool, &gx, &gw, &gb);
      cpu::conv2d_backward(kernels::max_pool2d_backward(gp, argmax, y.shape()), x, w, p, &rx, &rw,
                           &rb);
      EXPECT_EQ(gx.to_vector(), rx.to_vector()) << what << " grad_x";
      EXPECT_EQ(gw.to_vector(), rw.to_vector()) << what << " grad_w";
      EXPECT_EQ(gb.to_vector(), rb.to_vector()) << what << " grad_bias";
      Tensor gw_alone, rw_alone;  // a first layer: no grad_x
      cpu::conv2d_relu_max_pool2d_backward(gp, argmax, x, w, p, pool, nullptr, &gw_alone, nullptr);
      cpu::conv2d_backward(kernels::max_pool2d_backward(gp, argmax, y.shape()), x, w, p, nullptr,
                           &rw_alone, nullptr);
      EXPECT_EQ(gw_alone.to_vector(), rw_alone.to_vector()) << what << " grad_w alone";
    }
  }
}

TEST(ConvDnnl, RejectsMismatchedShapes) {
  Tensor x = Tensor::zeros({1, 3, 5, 5}), w = Tensor::zeros({4, 2, 3, 3});
  EXPECT_THROW(cpu::conv2d_forward_dnnl(x, w, Tensor(), {}), std::invalid_argument);
  Tensor big = Tensor::zeros({4, 3, 7, 7});
  EXPECT_THROW(cpu::conv2d_forward_dnnl(x, big, Tensor(), {}), std::invalid_argument);
}

// Two threads running the same (cached) plans at once: each call has its own workspace and
// scratchpad, so the results must equal the single-threaded ones.
TEST(ConvDnnl, ConcurrentCallsShareCachedPlans) {
  Generator gen(14);
  const ConvCase& c = conv_cases()[6];
  Tensor x = Tensor::randn({c.n, c.c, c.h, c.w}, gen);
  Tensor w = Tensor::randn({c.oc, c.c, c.kh, c.kw}, gen);
  Tensor b = Tensor::randn({c.oc}, gen);
  const Tensor ref = cpu::conv2d_forward_im2col(x, w, b, c.p);
  Tensor gy = Tensor::randn(ref.shape(), gen), rx, rw, rb;
  cpu::conv2d_backward_im2col(gy, x, w, c.p, &rx, &rw, &rb);
  std::vector<std::vector<Tensor>> out(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        Tensor y = cpu::conv2d_forward_dnnl(x, w, b, c.p), gx, gw, gb;
        cpu::conv2d_backward_dnnl(gy, x, w, c.p, &gx, &gw, &gb);
        out[t] = {y, gx, gw, gb};
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 2; ++t) {
    expect_close(out[t][0], ref, "thread " + std::to_string(t) + " y");
    expect_close(out[t][1], rx, "thread " + std::to_string(t) + " grad_x");
    expect_close(out[t][2], rw, "thread " + std::to_string(t) + " grad_w");
    expect_close(out[t][3], rb, "thread " + std::to_string(t) + " grad_bias");
  }
}

}  // namespace
}  // namespace hpm
