// elementwise.cu's activations (unary_kernels.cuh: cpu/vec.h's exp and normal CDF as the card
// computes them, each op forward and backward, in f32 and in the bf16 forms the GPT's blocks use),
// compiled for the CPU and run under simt.h's emulation, against the CPU's kernels, over random
// values and the edges: zeros of both signs, the polynomials' branch points, exp's flush and
// overflow bounds, infinities and NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_emulated/host_values.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

// The kernels last: simt.h's macros (threadIdx, __syncthreads, ...) must not reach other headers.
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/unary_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;
using emulated::widened;

using kernels::UnaryOp;

constexpr int kThreads = 256;
constexpr unsigned kBlocks = 3;  // fewer threads than elements: the grid-stride loops go round
// A grid so small that each thread takes both groups of its pair, and again: the pairs' second
// groups (absent from the grid above), an odd group left over, and the scalar tail.
constexpr int kFewThreads = 32;

// Both NaN, or within a few units in the last place of the larger of |want| and scale[i]:
// cpu/vec.h's polynomials contract into FMAs where the CPU has them, the emulation (as the card's
// _rn-free code need not) may not, and a gradient's sum of terms (GELU's cdf + u pdf) can cancel to
// below the terms' last place: scale is then the incoming gradient's magnitude.
void expect_f32_close(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what, const std::vector<float>& scale = {}) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << " [" << i << "]: " << got[i];
      continue;
    }
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " [" << i << "]";
      continue;
    }
    const float size = std::max(std::abs(want[i]), scale.empty() ? 0.0f : std::abs(scale[i]));
    ASSERT_NEAR(got[i], want[i], 4e-7f * size + 1e-30f) << what << " [" << i << "]";
  }
}

// One bf16 rounding apart at most (an f32 a unit apart can round either side of a bf16 tie).
void expect_bf16_close(const std::vector<std::uint16_t>& got,
                       const std::vector<std::uint16_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float g = widened(got[i]), w = widened(want[i]);
    if (std::isnan(w)) {
      ASSERT_TRUE(std::isnan(g)) << what << " [" << i << "]";
      continue;
    }
    if (std::isinf(w)) {
      ASSERT_EQ(g, w) << what << " [" << i << "]";
      continue;
    }
    ASSERT_LE(std::abs(g - w), std::abs(w) / 128.0f + 1e-30f) << what << " [" << i << "]";
  }
}

std::vector<float> inputs() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,    -0.0f,    1.0f,   -1.0f,
                          1.4142f, -1.4143f, 6.36f,  -6.37f,
                          20.0f,   -20.0f,   86.5f,  -86.7f,
                          88.7f,   88.8f,    -88.8f, 1e-30f,
                          -3e-39f, inf,      -inf,   std::numeric_limits<float>::quiet_NaN()};
  Generator gen(11);
  const std::vector<float> r = copy_of<float>(Tensor::randn({1000}, gen, 0.0f, 3.0f));
  v.insert(v.end(), r.begin(), r.end());
  return v;
}

template <UnaryOp Op>
void check_op() {
  const std::string name = "op " + std::to_string(static_cast<int>(Op));
  SCOPED_TRACE(name);
  const std::vector<float> xv = inputs();
  const auto n = static_cast<std::int64_t>(xv.size());
  const Tensor x = Tensor::from(xv, Shape{n});
  Generator gen(12);
  const Tensor g = Tensor::randn({n}, gen);
  const std::vector<float> gv = copy_of<float>(g);
  const Tensor y = kernels::unary(Op, x);
  const std::vector<float> yv = copy_of<float>(y);
  const auto size = static_cast<std::size_t>(n);

  // Forward, f32.
  std::vector<float> out(size);
  simt::launch(kBlocks, kThreads, 0, [&] { cuda::unary_kernel<Op>(xv.data(), out.data(), n); });
  expect_f32_close(out, yv, name + " forward");

  // Forward to bf16 from f32, x's own rounding beside it; and from bf16.
  Tensor xb_want;
  const Tensor yb_want = kernels::unary_bf16(Op, x, &xb_want);
  std::vector<std::uint16_t> yb(size), xb(size);
  simt::launch(kBlocks, kThreads, 0,
               [&] { cuda::unary_bf16_kernel<Op, float>(xv.data(), yb.data(), xb.data(), n); });
  expect_bf16_close(yb, copy_of<std::uint16_t>(yb_want), name + " forward to bf16");
  EXPECT_EQ(xb, copy_of<std::uint16_t>(xb_want)) << name << " x rounded";
  // Operands one element off 16-byte alignment take the one-by-one loop throughout: the same
  // values as the eight-at-a-time body gave.
  std::vector<std::uint16_t> yb_off(size);
  simt::launch(kBlocks, kThreads, 0, [&] {
    cuda::unary_bf16_kernel<Op, float>(xv.data() + 1, yb_off.data() + 1, nullptr, n - 1);
  });
  for (std::size_t i = 1; i < size; ++i) ASSERT_EQ(yb_off[i], yb[i]) << name << " misaligned " << i;
  const Tensor x_bf16 = kernels::to_bf16(x);
  const std::vector<std::uint16_t> xbv = copy_of<std::uint16_t>(x_bf16);
  simt::launch(kBlocks, kThreads, 0, [&] {
    cuda::unary_bf16_kernel<Op, std::uint16_t>(xbv.data(), yb.data(), nullptr, n);
  });
  expect_bf16_close(yb, copy_of<std::uint16_t>(kernels::unary_bf16(Op, x_bf16)),
                    name + " forward from bf16");
  std::vector<std::uint16_t> yb_few(size);
  simt::launch(1, kFewThreads, 0, [&] {
    cuda::unary_bf16_kernel<Op, std::uint16_t>(xbv.data(), yb_few.data(), nullptr, n);
  });
  EXPECT_EQ(yb_few, yb) << name << " forward from bf16, few threads";

  // Backward, f32, with the operands elementwise.cu passes: Relu reads y, Gelu x, the rest both.
  const bool reads_x = Op != UnaryOp::Relu, reads_y = Op != UnaryOp::Gelu;
  const Tensor want =
      kernels::unary_backward(Op, g, reads_x ? x : Tensor(), reads_y ? y : Tensor());
  simt::launch(kBlocks, kThreads, 0, [&] {
    cuda::unary_backward_kernel<Op, float, float, float>(
        gv.data(), reads_x ? xv.data() : nullptr, reads_y ? yv.data() : nullptr, out.data(), n);
  });
  expect_f32_close(out, copy_of<float>(want), name + " backward", gv);
  std::vector<float> out_few(size);
  simt::launch(1, kFewThreads, 0, [&] {
    cuda::unary_backward_kernel<Op, float, float, float>(
        gv.data(), reads_x ? xv.data() : nullptr, reads_y ? yv.data() : nullptr, out_few.data(), n);
  });
  for (std::size_t i = 0; i < size; ++i) {
    ASSERT_TRUE(out_few[i] == out[i] || (std::isnan(out_few[i]) && std::isnan(out[i])))
        << name << " backward, few threads [" << i << "]";
  }
  if (!reads_x) return;

  // Backward from a bf16 x, to f32 and to bf16; and from a bf16 gradient too (no y).
  const Tensor want_bx = kernels::unary_backward(Op, g, x_bf16, reads_y ? y : Tensor());
  simt::launch(kBlocks, kThreads, 0, [&] {
    cuda::unary_backward_kernel<Op, float, std::uint16_t, float>(
        gv.data(), xbv.data(), reads_y ? yv.data() : nullptr, out.data(), n);
  });
  expect_f32_close(out, copy_of<float>(want_bx), name + " backward from bf16 x", gv);
  std::vector<std::uint16_t> outb(size);
  simt::launch(kBlocks, kThreads, 0, [&] {
    cuda::unary_backward_kernel<Op, float, std::uint16_t, std::uint16_t>(
        gv.data(), xbv.data(), reads_y ? yv.data() : nullptr, outb.data(), n);
  });
  expect_bf16_close(
      outb,
      copy_of<std::uint16_t>(kernels::unary_backward_bf16(Op, g, x_bf16, reads_y ? y : Tensor())),
      name + " backward from bf16 x to bf16");
  if (reads_y) return;
  const Tensor g_bf16 = kernels::to_bf16(g);
  const std::vector<std::uint16_t> gbv = copy_of<std::uint16_t>(g_bf16);
  simt::launch(kBlocks, kThreads, 0, [&] {
    cuda::unary_backward_kernel<Op, std::uint16_t, std::uint16_t, std::uint16_t>(
        gbv.data(), xbv.data(), nullptr, outb.data(), n);
  });
  expect_bf16_close(
      outb, copy_of<std::uint16_t>(kernels::unary_backward_bf16(Op, g_bf16, x_bf16, Tensor())),
      name + " backward from bf16 gradient and x");
  std::vector<std::uint16_t> outb_few(size);
  simt::launch(1, kFewThreads, 0, [&] {
    cuda::unary_backward_kernel<Op, std::uint16_t, std::uint16_t, std::uint16_t>(
        gbv.data(), xbv.data(), nullptr, outb_few.data(), n);
  });
  EXPECT_EQ(outb_few, outb) << name << " backward from bf16 gradient and x, few threads";
}

TEST(UnaryEmulated, EveryActivationMatchesTheCpu) {
  check_op<UnaryOp::Neg>();
  check_op<UnaryOp::Exp>();
  check_op<UnaryOp::Log>();
  check_op<UnaryOp::Sqrt>();
  check_op<UnaryOp::Relu>();
  check_op<UnaryOp::Tanh>();
  check_op<UnaryOp::Sigmoid>();
  check_op<UnaryOp::Gelu>();
  check_op<UnaryOp::GeluTanh>();
  check_op<UnaryOp::Square>();
}

}  // namespace
}  // namespace hpm
