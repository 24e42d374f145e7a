// bfloat16 conversions and GEMMs (src/tensor/kernels/bf16.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

namespace hpm {
namespace {

float from_bits(std::uint16_t b) { return std::bit_cast<float>(std::uint32_t{b} << 16); }

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  const float one_ulp = std::ldexp(1.0f, -7);  // bf16's spacing at 1
  const std::vector<float> x = {1.0f,
                                1.0f + one_ulp / 2,          // tie: to the even 1.0
                                1.0f + 3 * one_ulp / 2,      // tie: to the even 1 + 2 ulp
                                1.0f + one_ulp / 2 + 1e-6f,  // above the tie: up
                                -2.5f,
                                inf,
                                -inf,
                                std::nanf(""),
                                std::numeric_limits<float>::max()};
  const Tensor b = kernels::to_bf16(Tensor::from(x, {static_cast<std::int64_t>(x.size())}));
  ASSERT_EQ(b.dtype(), DType::BF16);
  const auto* p = b.data<std::uint16_t>();
  EXPECT_EQ(from_bits(p[0]), 1.0f);
  EXPECT_EQ(from_bits(p[1]), 1.0f);
  EXPECT_EQ(from_bits(p[2]), 1.0f + 2 * one_ulp);
  EXPECT_EQ(from_bits(p[3]), 1.0f + one_ulp);
  EXPECT_EQ(from_bits(p[4]), -2.5f);
  EXPECT_EQ(from_bits(p[5]), inf);
  EXPECT_EQ(from_bits(p[6]), -inf);
  EXPECT_TRUE(std::isnan(from_bits(p[7])));
  EXPECT_EQ(from_bits(p[8]), inf);  // rounds past the largest bf16, as vcvtneps2bf16 does
  const std::vector<float> back = kernels::to_f32(b).to_vector();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isnan(x[i])) {
      EXPECT_EQ(back[i], from_bits(p[i])) << i;
    }
  }
}

// Products of bf16 values are exact in f32, so gemm_bf16 equals an f32 GEMM of the rounded
// operands up to the order of the f32 sums.
TEST(Bf16, GemmEqualsF32GemmOfRoundedOperands) {
  Generator gen(3);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(std::string(ta ? "A^T" : "A") + (tb ? " B^T" : " B"));
      const std::int64_t m = 37, n = 29, k = 70;
      const Tensor a = Tensor::randn(ta ? Shape{k, m} : Shape{m, k}, gen);
      const Tensor b = Tensor::randn(tb ? Shape{n, k} : Shape{k, n}, gen);
      const Tensor ab = kernels::to_bf16(a), bb = kernels::to_bf16(b);
      Tensor c = Tensor::randn({m, n}, gen);
      Tensor expected = c.clone();
      kernels::gemm(ta, tb, m, n, k, 0.5f, kernels::to_f32(ab).data<float>(), a.size(1),
                    kernels::to_f32(bb).data<float>(), b.size(1), 2.0f, expected.data<float>(), n);
      kernels::gemm_bf16(ta, tb, m, n, k, 0.5f, ab.data<std::uint16_t>(), a.size(1),
                         bb.data<std::uint16_t>(), b.size(1), 2.0f, c.data<float>(), n);
      const auto got = c.to_vector(), want = expected.to_vector();
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << i;
    }
}

// A bf16 convolution (oneDNN's bf16 primitives, f32 accumulation) equals the f32 convolution of
// the rounded operands up to the order of its sums; backward likewise, with grad_y rounded.
TEST(Bf16, ConvolutionEqualsF32ConvolutionOfRoundedOperands) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  Generator gen(4);
  const auto rounded = [](const Tensor& t) { return kernels::to_f32(kernels::to_bf16(t)); };
  const Tensor x = Tensor::randn({4, 3, 9, 9}, gen), w = Tensor::randn({8, 3, 3, 3}, gen);
  const Tensor bias = Tensor::randn({8}, gen);
  kernels::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  kernels::Conv2dParams pb = p;
  pb.bf16 = true;
  const auto expect_near = [](const Tensor& got, const Tensor& want, const char* what) {
    const auto g = got.to_vector(), e = want.to_vector();
    ASSERT_EQ(g.size(), e.size()) << what;
    for (std::size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], e[i], 1e-4f * (1.0f + std::fabs(e[i]))) << what << " " << i;
  };
  const Tensor y = kernels::conv2d_forward(x, w, bias, pb);
  expect_near(y, kernels::conv2d_forward(rounded(x), rounded(w), bias, p), "y");
  const Tensor gy = Tensor::randn(y.shape(), gen);
  Tensor gx, gw, gb, ex, ew, eb;
  kernels::conv2d_backward(gy, x, w, pb, &gx, &gw, &gb);
  kernels::conv2d_backward(rounded(gy), rounded(x), rounded(w), p, &ex, &ew, &eb);
  expect_near(gx, ex, "grad_x");
  expect_near(gw, ew, "grad_w");
  // The bias gradient sums grad_y itself; oneDNN may sum the rounded or the f32 values.
  const auto g = gb.to_vector(), e = eb.to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], e[i], 2e-2f * (1 + std::fabs(e[i])));
}

TEST(Bf16, MatmulChecksItsOperands) {
  const Tensor f = Tensor::zeros({2, 3});
  EXPECT_THROW(
      {
        try {
          kernels::matmul_bf16(f, kernels::to_bf16(f));
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "matmul_bf16: expected a 2-D BF16 tensor, got F32 [2, 3]");
          throw;
        }
      },
      std::invalid_argument);
  EXPECT_THROW(kernels::matmul_bf16(kernels::to_bf16(f), kernels::to_bf16(f)),
               std::invalid_argument);
}

// The point of bf16 is the native instructions: oneDNN must pick its AVX512_BF16 kernels (or, on
// CPUs with AMX, its AMX-BF16 tile kernels: "avx512_core_amx", "avx512_core_amx_bf16"), not an
// emulation on plain AVX-512 ("avx512_core", "jit:gemm").
TEST(Bf16, RunsOneDnnsNativeKernels) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const std::string impl = kernels::gemm_bf16_implementation(768, 384, 128);
  const bool native = impl.find("avx512_core_bf16") != std::string::npos ||
                      impl.find("avx512_core_amx") != std::string::npos;
  EXPECT_TRUE(native) << impl;
}

}  // namespace
}  // namespace hpm
