// bfloat16 conversions and GEMMs (src/tensor/kernels/bf16.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/same_bits.h"
#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

namespace hpm {
namespace {

using kernels::UnaryOp;

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

using testing::expect_same_bits;

// The CPU's fused roundings (unary_bf16, unary_backward_bf16, layer_norm_forward_bf16, and the
// backward kernels reading bf16 copies) work block by block: equal to their compositions bit for
// bit, across block and thread-span boundaries (sizes off every block, some over the elementwise
// grain of 32768).
TEST(Bf16, TheCpusFusedRoundingsEqualTheirCompositionsBitForBit) {
  Generator gen(11);
  for (const std::int64_t n : {std::int64_t{5}, std::int64_t{2 * 2048 + 37}, std::int64_t{70001}}) {
    const Tensor x = Tensor::randn({n}, gen), gy = Tensor::randn({n}, gen);
    const Tensor xp = cpu::add_scalar(cpu::unary(UnaryOp::Square, x), 0.1f);  // Log's, Sqrt's
    for (const UnaryOp op :
         {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Relu, UnaryOp::Tanh,
          UnaryOp::Sigmoid, UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::Square}) {
      const std::string what =
          "unary op " + std::to_string(static_cast<int>(op)) + ", n " + std::to_string(n);
      const Tensor in = op == UnaryOp::Log || op == UnaryOp::Sqrt ? xp : x;
      Tensor in_b;
      expect_same_bits(cpu::unary_bf16(op, in, &in_b), cpu::to_bf16(cpu::unary(op, in)), what);
      expect_same_bits(in_b, cpu::to_bf16(in), what + " (input copy)");
      const Tensor y = cpu::unary(op, in), yb = cpu::to_bf16(y);
      const Tensor want = cpu::unary_backward(op, gy, cpu::to_f32(in_b), cpu::to_f32(yb));
      expect_same_bits(cpu::unary_backward(op, gy, in_b, yb), want, what + " (backward)");
      expect_same_bits(cpu::unary_backward_bf16(op, gy, in_b, yb), cpu::to_bf16(want),
                       what + " (bf16 backward)");
    }
  }
  // Widths on both sides of the forward's 4096-element row block, rows over a thread span.
  for (const std::int64_t width : {std::int64_t{96}, std::int64_t{1500}, std::int64_t{5000}}) {
    const std::string what = "layer norm of width " + std::to_string(width);
    const std::int64_t rows = 70001 / width + 3;
    const Tensor x = Tensor::randn({rows, width}, gen), gy = Tensor::randn({rows, width}, gen);
    const Tensor w = Tensor::randn({width}, gen), b = Tensor::randn({width}, gen);
    Tensor m1, r1, m2, r2, xb;
    const Tensor y = cpu::layer_norm_forward_bf16(x, width, w, b, 1e-5f, m1, r1, &xb);
    expect_same_bits(y, cpu::to_bf16(cpu::layer_norm_forward(x, width, w, b, 1e-5f, m2, r2)), what);
    expect_same_bits(m1, m2, what + " (mean)");
    expect_same_bits(r1, r2, what + " (rstd)");
    expect_same_bits(xb, cpu::to_bf16(x), what + " (input copy)");
    Tensor gx1, gw1, gb1, gx2, gw2, gb2;
    cpu::layer_norm_backward(gy, xb, width, w, m1, r1, &gx1, &gw1, &gb1);
    cpu::layer_norm_backward(gy, cpu::to_f32(xb), width, w, m1, r1, &gx2, &gw2, &gb2);
    expect_same_bits(gx1, gx2, what + " (backward dx)");
    expect_same_bits(gw1, gw2, what + " (backward dw)");
    expect_same_bits(gb1, gb2, what + " (backward db)");
  }
}

// The CPU's products writing bf16 (linear's a block of rows at a time, no F32 matrix of the whole;
// matmul's of bf16 rows by oneDNN's bf16 destination): equal to the rounded F32 product bit for
// bit, across blocks (1000 rows: 128, then 872); at a GPT's input-gradient shapes (a Linear's
// dx = g W, over 768 and 3072) oneDNN's bf16-destination kernel may sum an element's 3072 terms in
// another order than its F32 one: the rounded values then differ by about a bf16 step, rarely
// (at most one in 10,000 asserted).
TEST(Bf16, TheCpusBf16ProductOutputsEqualTheRoundedF32ProductsBitForBit) {
  Generator gen(12);
  const Tensor x = cpu::to_bf16(Tensor::randn({1000, 96}, gen));
  const Tensor w = cpu::to_bf16(Tensor::randn({300, 96}, gen)), b = Tensor::randn({300}, gen);
  expect_same_bits(kernels::linear(x, w, b, DType::BF16), cpu::to_bf16(kernels::linear(x, w, b)),
                   "linear");
  expect_same_bits(kernels::linear(x, w, Tensor(), DType::BF16),
                   cpu::to_bf16(kernels::linear(x, w, Tensor())), "linear without bias");
  expect_same_bits(kernels::matmul(x, w, false, true, DType::BF16),
                   cpu::to_bf16(kernels::matmul(x, w, false, true)), "matmul");
  const Tensor xt = cpu::to_bf16(Tensor::randn({96, 1000}, gen));
  expect_same_bits(kernels::matmul(xt, w, true, true, DType::BF16),
                   cpu::to_bf16(kernels::matmul(xt, w, true, true)), "matmul of a^T");
  for (const std::int64_t inner : {768, 3072}) {
    SCOPED_TRACE("dx = g W over " + std::to_string(inner));
    const Tensor g = cpu::to_bf16(Tensor::randn({1000, inner}, gen));
    const Tensor weight = cpu::to_bf16(Tensor::randn({inner, 768}, gen));
    const std::vector<float> got =
        cpu::to_f32(kernels::matmul(g, weight, false, false, DType::BF16)).to_vector();
    const std::vector<float> want =
        cpu::to_f32(cpu::to_bf16(kernels::matmul(g, weight))).to_vector();
    ASSERT_EQ(got.size(), want.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i] == want[i]) continue;
      ++differ;
      // A bf16 step, or (an element that cancels to near 0 from terms of about sqrt(inner)) the
      // f32 sums' own difference.
      ASSERT_LE(std::abs(got[i] - want[i]), std::abs(want[i]) / 128.0f + 1e-4f) << "element " << i;
    }
    EXPECT_LE(differ, got.size() / 10000) << differ << " of " << got.size() << " differ";
  }
}

// A language model's bf16 logits: cross-entropy (loss, statistics, both gradients), and argmax,
// give what the logits' f32 widening gives, bit for bit; the bf16 gradient written over the
// logits equals the one written apart. 1000 classes, a smoothed loss and an ignored row.
TEST(Bf16, CrossEntropyAndArgmaxOfBf16LogitsEqualThoseOfTheirWidening) {
  Generator gen(21);
  const Tensor logits = cpu::to_bf16(Tensor::randn({2, 6, 1000}, gen));
  const Tensor wide = cpu::to_f32(logits);
  std::vector<std::int64_t> y;
  for (int i = 0; i < 12; ++i) y.push_back((i * 379) % 1000);
  y[5] = -100;
  const Tensor labels = Tensor::from_i64(y, Shape{2, 6});
  Tensor stats, stats_wide;
  const Tensor loss = kernels::cross_entropy_forward(logits, labels, 0.1f, stats);
  const Tensor loss_wide = kernels::cross_entropy_forward(wide, labels, 0.1f, stats_wide);
  expect_same_bits(loss, loss_wide, "loss");
  expect_same_bits(stats, stats_wide, "stats");
  const Tensor g = Tensor::scalar(0.75f);
  expect_same_bits(kernels::cross_entropy_backward(logits, stats, labels, 0.1f, g),
                   kernels::cross_entropy_backward(wide, stats, labels, 0.1f, g), "f32 gradient");
  const Tensor expected = kernels::cross_entropy_backward_bf16(wide, stats, labels, 0.1f, g);
  expect_same_bits(kernels::cross_entropy_backward_bf16(logits, stats, labels, 0.1f, g), expected,
                   "bf16 gradient");
  expect_same_bits(expected,
                   cpu::to_bf16(kernels::cross_entropy_backward(wide, stats, labels, 0.1f, g)),
                   "bf16 gradient = the f32 one rounded");
  const Tensor overwritten = logits.clone();
  const Tensor in_place = kernels::cross_entropy_backward_bf16(overwritten, stats, labels, 0.1f, g,
                                                               -100, /*overwrite_logits=*/true);
  EXPECT_EQ(in_place.raw_data(), overwritten.raw_data());
  expect_same_bits(in_place, expected, "bf16 gradient over the logits");
  EXPECT_EQ(kernels::argmax_last(logits).to_vector_i64(),
            kernels::argmax_last(wide).to_vector_i64());
  Tensor predicted, again;
  kernels::cross_entropy_forward(logits, labels, 0.1f, again, -100, &predicted);
  EXPECT_EQ(predicted.shape(), labels.shape());
  EXPECT_EQ(predicted.to_vector_i64(), kernels::argmax_last(wide).to_vector_i64());
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
      cpu::gemm(ta, tb, m, n, k, 0.5f, kernels::to_f32(ab).data<float>(), a.size(1),
                kernels::to_f32(bb).data<float>(), b.size(1), 2.0f, expected.data<float>(), n);
      cpu::gemm_bf16(ta, tb, m, n, k, 0.5f, ab.data<std::uint16_t>(), a.size(1),
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
  // y is rounded to bf16 (as torch.autocast gives it): a bf16 value, within half a bf16 unit
  // (at most 2^-8 relative) of the f32 result, plus the accumulation order's difference.
  const Tensor y = cpu::conv2d_forward(x, w, bias, pb);
  EXPECT_EQ(y.to_vector(), rounded(y).to_vector()) << "y is not rounded to bf16";
  const auto got = y.to_vector();
  const auto want = cpu::conv2d_forward(rounded(x), rounded(w), bias, p).to_vector();
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4f + std::ldexp(std::fabs(want[i]), -8)) << "y " << i;
  const Tensor gy = Tensor::randn(y.shape(), gen);
  Tensor gx, gw, gb, ex, ew, eb;
  cpu::conv2d_backward(gy, x, w, pb, &gx, &gw, &gb);
  cpu::conv2d_backward(rounded(gy), rounded(x), rounded(w), p, &ex, &ew, &eb);
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
          cpu::matmul_bf16(f, kernels::to_bf16(f));
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "matmul_bf16: expected a 2-D BF16 tensor, got F32 [2, 3]");
          throw;
        }
      },
      std::invalid_argument);
  EXPECT_THROW(cpu::matmul_bf16(kernels::to_bf16(f), kernels::to_bf16(f)), std::invalid_argument);
}

// The point of bf16 is the native instructions: oneDNN must pick its AVX512_BF16 kernels (or, on
// CPUs with AMX, its AMX-BF16 tile kernels: "avx512_core_amx", "avx512_core_amx_bf16"), not an
// emulation on plain AVX-512 ("avx512_core", "jit:gemm").
TEST(Bf16, RunsOneDnnsNativeKernels) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const std::string impl = cpu::gemm_bf16_implementation(768, 384, 128);
  const bool native = impl.find("avx512_core_bf16") != std::string::npos ||
                      impl.find("avx512_core_amx") != std::string::npos;
  EXPECT_TRUE(native) << impl;
}

// IEEE half, for weight files: every one of the 65536 bit patterns widens exactly and narrows
// back to itself (NaN to a NaN), and narrowing rounds to nearest even, overflowing to infinity.
TEST(Float16, EveryHalfWidensExactlyAndNarrowsBack) {
  Tensor h = Tensor::empty({65536}, DType::F16);
  for (int i = 0; i < 65536; ++i) h.data<Float16Bits>()[i].bits = static_cast<std::uint16_t>(i);
  const Tensor f = kernels::to_f32(h);
  const Tensor back = kernels::to_f16(f);
  for (int i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(f.data<float>()[i])) << i;
      ASSERT_EQ(back.data<Float16Bits>()[i].bits & 0x7c00, 0x7c00) << i;
      ASSERT_NE(back.data<Float16Bits>()[i].bits & 0x3ff, 0) << i;
    } else {
      ASSERT_EQ(back.data<Float16Bits>()[i].bits, i) << i;
    }
  }
  // Known values (IEEE 754 binary16).
  const auto half_of = [&](std::uint16_t bits) { return f.data<float>()[bits]; };
  EXPECT_EQ(half_of(0x3c00), 1.0f);
  EXPECT_EQ(half_of(0xc000), -2.0f);
  EXPECT_EQ(half_of(0x7bff), 65504.0f);
  EXPECT_EQ(half_of(0x0001), 0x1p-24f);  // the smallest subnormal
  EXPECT_EQ(half_of(0x0400), 0x1p-14f);  // the smallest normal
  EXPECT_TRUE(std::isinf(half_of(0x7c00)) && half_of(0x7c00) > 0);
  EXPECT_TRUE(std::signbit(half_of(0x8000)) && half_of(0x8000) == 0.0f);
}

TEST(Float16, NarrowingRoundsToNearestEven) {
  const std::vector<std::pair<float, std::uint16_t>> cases = {
      {0.1f, 0x2e66},                 // 0.0999755859375
      {1.0f / 3.0f, 0x3555},          // 0.333251953125
      {1.0f + 0x1p-11f, 0x3c00},      // halfway between 1 and the next half: to even (1)
      {1.0f + 3 * 0x1p-11f, 0x3c02},  // halfway, odd below: up to even
      {65519.0f, 0x7bff},             // below the halfway point to 65536: stays finite
      {65520.0f, 0x7c00},             // halfway, ties to even: infinity
      {1e6f, 0x7c00},                 // overflow
      {-1e6f, 0xfc00},                //
      {0x1p-25f, 0x0000},             // halfway between 0 and the smallest subnormal: to 0
      {0x1p-25f + 0x1p-30f, 0x0001},  // just above: up
      {3 * 0x1p-25f, 0x0002},         // 1.5 subnormal units: to even (2)
      {0x1p-14f - 0x1p-25f, 0x0400},  // rounds up into the smallest normal
      {-0.0f, 0x8000},
  };
  Tensor f = Tensor::empty({static_cast<std::int64_t>(cases.size())});
  for (std::size_t i = 0; i < cases.size(); ++i) f.data<float>()[i] = cases[i].first;
  const Tensor h = kernels::to_f16(f);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(h.data<Float16Bits>()[i].bits, cases[i].second) << cases[i].first;
  }
  Tensor d = Tensor::empty({2}, DType::F64);
  d.data<double>()[0] = 1.0 / 3.0;
  d.data<double>()[1] = -1e300;
  const Tensor df = kernels::to_f32(d);
  EXPECT_EQ(df.data<float>()[0], 1.0f / 3.0f);
  EXPECT_TRUE(std::isinf(df.data<float>()[1]));
  EXPECT_THROW(kernels::to_f32(Tensor::zeros({2}, DType::I64)), std::invalid_argument);
}

// Autocast asks for bf16; the CPU backend takes it for a convolution only where it pays: at least
// 32 products per output (cpu_backend.cpp), or the fused convolution with a 2x2/2 pool.
TEST(Bf16, TheCpuBackendTakesBf16ForConvolutionsWhereItPays) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  Generator gen(5);
  const auto rounded = [](const Tensor& t) { return kernels::to_f32(kernels::to_bf16(t)); };
  kernels::Conv2dParams f32, bf16;
  f32.pad_h = f32.pad_w = bf16.pad_h = bf16.pad_w = 1;
  bf16.bf16 = true;
  // One input channel: 9 products per output, f32.
  const Tensor x1 = Tensor::randn({2, 1, 8, 8}, gen), w1 = Tensor::randn({4, 1, 3, 3}, gen);
  EXPECT_EQ(kernels::conv2d_forward(x1, w1, Tensor(), bf16).to_vector(),
            kernels::conv2d_forward(x1, w1, Tensor(), f32).to_vector());
  // Four: 36, bf16 (the output rounded to it).
  const Tensor x4 = Tensor::randn({2, 4, 8, 8}, gen), w4 = Tensor::randn({4, 4, 3, 3}, gen);
  const Tensor y = kernels::conv2d_forward(x4, w4, Tensor(), bf16);
  EXPECT_EQ(y.to_vector(), rounded(y).to_vector());
  EXPECT_NE(y.to_vector(), kernels::conv2d_forward(x4, w4, Tensor(), f32).to_vector());
}

}  // namespace
}  // namespace hpm
