// attention_mma.cu's kernels, compiled for the CPU and run under simt.h's emulation, against the
// CPU's bf16 attention: the fragment arithmetic, the masks, the online softmax and the staging of
// the register-tiled kernels are checked in every build, GPU or not (the card runs the same
// comparison as conformance cases, `attention bf16 tiles`). The shapes cross the 64-row tiles and
// leave partial ones at both ends; T != S checks the top-left causal alignment.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_emulated/host_values.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

// The kernels last: simt.h's macros (threadIdx, __syncthreads, ...) must not reach other headers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/attention_mma_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;
using emulated::widened;

constexpr float kScale = 0.125f;
// Measured in Release here: out 2.4e-3 (the kernel rounds P to bf16 before normalizing it, the
// CPU after), lse 1.2e-7, the gradients 1.5e-5 (both sides round P, dS and dO alike). The CPU's
// own sums differ between builds and CPU models (vector widths), and over a few hundred keys a
// bf16 rounding of P or dS then flips now and again: 5.6e-4 in the ASan build at d 128. Planted
// bugs gave 0.97 to 44. So the card's conformance tolerance for the output, 1e-2 for gradients.
constexpr float kOutTolerance = 2e-2f;
constexpr float kLseTolerance = 1e-5f;
constexpr float kGradTolerance = 1e-2f;

// Largest |got - want| over the larger of 1 and the largest |want|.
float relative_error(const std::vector<float>& got, const Tensor& want_tensor) {
  const std::vector<float> want = copy_of<float>(want_tensor);
  EXPECT_EQ(got.size(), want.size());
  float worst = 0.0f, size = 1.0f;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i]) continue;  // lse of a row that saw nothing
    worst = std::max(worst, std::abs(got[i] - want[i]));
    if (std::isfinite(want[i])) size = std::max(size, std::abs(want[i]));
  }
  return worst / size;
}

struct Problem {
  std::int64_t batch, t, s;
  bool causal;
};

std::string name(const Problem& p, int d) {
  std::string s = "d";  // appended, not added: GCC 12's -Wrestrict misreads "literal" + string
  s += std::to_string(d);
  s += " t";
  s += std::to_string(p.t);
  s += " s";
  s += std::to_string(p.s);
  if (p.causal) s += " causal";
  return s;
}

// kM: the forward's 16-row query tiles a warp (the launcher's 2, or 1 at head size 128 and under
// HPM_CUDA_ATTENTION=mma16).
template <int kD, int kM>
void check_forward_and_backward(const Problem& p, float scale = kScale) {
  SCOPED_TRACE(name(p, kD) + " tiles " + std::to_string(kM) + " scale " + std::to_string(scale));
  Generator gen(7 + static_cast<std::uint64_t>(p.t + p.s + kD) + (p.causal ? 1 : 0));
  const Tensor q = kernels::to_bf16(Tensor::randn({p.batch, p.t, kD}, gen));
  const Tensor k = kernels::to_bf16(Tensor::randn({p.batch, p.s, kD}, gen));
  const Tensor v = kernels::to_bf16(Tensor::randn({p.batch, p.s, kD}, gen));
  const Tensor gy = Tensor::randn({p.batch, p.t, kD}, gen);
  Tensor lse_want;
  const Tensor y_want = kernels::attention_forward(q, k, v, p.causal, scale, lse_want);
  Tensor gq_want, gk_want, gv_want;
  kernels::attention_backward(gy, q, k, v, y_want, lse_want, p.causal, scale, &gq_want, &gk_want,
                              &gv_want);

  // Exactly sized buffers: under ASan a read or write past any of them is an error.
  const std::vector<std::uint16_t> qb = copy_of<std::uint16_t>(q), kb = copy_of<std::uint16_t>(k),
                                   vb = copy_of<std::uint16_t>(v);
  const std::vector<float> g = copy_of<float>(gy);
  std::vector<float> out(static_cast<std::size_t>(p.batch * p.t * kD), -1.0f);
  std::vector<float> lse(static_cast<std::size_t>(p.batch * p.t), -1.0f);
  const cuda::AttentionLayout layout = cuda::contiguous_attention(kD);
  // The grids of attention_mma.cu's launchers: the forward's blocks of kForwardRows queries, the
  // backward's of 64 queries (dq) or keys (dk, dv).
  const auto blocks = [](std::int64_t problems, std::int64_t rows, std::int64_t per_block) {
    return static_cast<unsigned>(problems * ((rows + per_block - 1) / per_block));
  };
  const unsigned forward_grid = blocks(p.batch, p.t, cuda::kForwardRows<kM>);
  const unsigned row_grid = blocks(p.batch, p.t, 64), key_grid = blocks(p.batch, p.s, 64);
  simt::launch(forward_grid, 128, (cuda::kForwardSmem<kD, kM>), [&] {
    cuda::mma_forward_kernel<kD, kM, float>(qb.data(), kb.data(), vb.data(), out.data(), lse.data(),
                                            p.t, p.s, p.causal, scale, layout);
  });
  EXPECT_LE(relative_error(out, y_want), kOutTolerance) << "out";
  EXPECT_LE(relative_error(lse, lse_want), kLseTolerance) << "lse";

  // Delta = rowsum(dO * O) from the CPU's O, and dO rounded to bf16, by the kernel the CUDA
  // backward runs before the others.
  const std::vector<float> o = copy_of<float>(y_want);
  std::vector<float> delta(static_cast<std::size_t>(p.batch * p.t), -1.0f);
  std::vector<std::uint16_t> g16(g.size(), 0xffffu);
  simt::launch(cuda::blocks_for(p.batch * p.t, 4), 128, 0, [&] {
    cuda::attention_delta_kernel<kD, float>(g.data(), o.data(), delta.data(), g16.data(), p.batch,
                                            p.t, layout);
  });
  for (std::size_t r = 0; r < delta.size(); ++r) {
    double sum = 0.0;
    for (int c = 0; c < kD; ++c) sum += static_cast<double>(g[r * kD + c]) * o[r * kD + c];
    ASSERT_NEAR(delta[r], sum, 1e-4 * (1.0 + std::abs(sum))) << "delta " << r;
  }
  EXPECT_EQ(g16, copy_of<std::uint16_t>(kernels::to_bf16(gy))) << "dO rounded";
  // The same by the 16-byte rows kernel (every row aligned here).
  std::vector<float> delta16(delta.size(), -1.0f);
  std::vector<std::uint16_t> g16_rows(g.size(), 0xffffu);
  simt::launch(cuda::blocks_for(p.batch * p.t, cuda::kDeltaRowsPerBlock<kD>), 128, 0, [&] {
    cuda::attention_delta_rows_kernel<kD, float>(g.data(), o.data(), delta16.data(),
                                                 g16_rows.data(), p.batch, p.t, layout);
  });
  for (std::size_t r = 0; r < delta.size(); ++r)
    ASSERT_NEAR(delta16[r], delta[r], 1e-5 * (1.0 + std::abs(delta[r]))) << "delta (rows) " << r;
  EXPECT_EQ(g16_rows, g16) << "dO rounded (rows)";
  const std::vector<float> lse_in = copy_of<float>(lse_want);
  std::vector<float> gq(out.size(), -1.0f), gk(static_cast<std::size_t>(p.batch * p.s * kD), -1.0f),
      gv(gk.size(), -1.0f);
  simt::launch(row_grid, 128, cuda::kGradQSmem<kD>, [&] {
    cuda::mma_grad_q_kernel<kD, float>(qb.data(), kb.data(), vb.data(), g16.data(), lse_in.data(),
                                       delta.data(), gq.data(), p.t, p.s, p.causal, scale, layout);
  });
  simt::launch(key_grid, 128, cuda::kGradKvSmem<kD>, [&] {
    cuda::mma_grad_kv_kernel<kD, float, false>(qb.data(), kb.data(), vb.data(), g16.data(),
                                               lse_in.data(), delta.data(), gk.data(), gv.data(),
                                               p.t, p.s, p.causal, scale, layout, nullptr, {});
  });
  EXPECT_LE(relative_error(gq, gq_want), kGradTolerance) << "gq";
  EXPECT_LE(relative_error(gk, gk_want), kGradTolerance) << "gk";
  EXPECT_LE(relative_error(gv, gv_want), kGradTolerance) << "gv";

  // The one pass: the same dk and dv bit for bit (the same code, the key blocks in another
  // order), and dq from the key blocks' shares added in their turns. The sums start as garbage
  // (the first share is stored, not added); the emulation stops the test if a block waits for a
  // turn that a block launched after it holds.
  std::vector<float> sums(static_cast<std::size_t>(p.batch * p.t * kD), 1e30f);
  std::vector<int> turns(static_cast<std::size_t>(p.batch * cuda::dq_tiles<kD>(p.t)), 0);
  std::vector<float> gq1(gq.size(), -1.0f), gk1(gk.size(), -1.0f), gv1(gv.size(), -1.0f);
  simt::launch(key_grid, 128, (cuda::kGradKvSmem<kD, true>), [&] {
    cuda::mma_grad_kv_kernel<kD, float, true>(
        qb.data(), kb.data(), vb.data(), g16.data(), lse_in.data(), delta.data(), gk1.data(),
        gv1.data(), p.t, p.s, p.causal, scale, layout, gq1.data(), {sums.data(), turns.data()});
  });
  EXPECT_EQ(gk1, gk) << "gk (one pass)";
  EXPECT_EQ(gv1, gv) << "gv (one pass)";
  EXPECT_LE(relative_error(gq1, gq_want), kGradTolerance) << "gq (one pass)";
  // Every query tile's counter ends at the count of key blocks that see it, less block 0 (the
  // last, which passes no turn on).
  const std::int64_t key_blocks = (p.s + 63) / 64, tiles = cuda::dq_tiles<kD>(p.t);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t i = 0; i < tiles; ++i) {
      const std::int64_t last_row = (i + 1) * cuda::kBackwardCols<kD> - 1;
      const std::int64_t seeing = p.causal ? std::min(key_blocks, last_row / 64 + 1) : key_blocks;
      ASSERT_EQ(turns[static_cast<std::size_t>(b * tiles + i)], seeing - 1)
          << "turns " << b << " " << i;
    }
  }
}

// Partial tiles at both ends, more queries than keys and the other way, with and without the
// mask; the last two long enough (4 and 5 key tiles) that the double buffers are refilled.
const Problem kEveryShape[] = {{2, 150, 70, false},
                               {2, 150, 70, true},
                               {1, 40, 100, true},
                               {1, 200, 200, true},
                               {1, 150, 260, false}};
// Under a sanitizer (simt.h's kUnderSanitizer): partial tiles under the mask, and five key tiles
// without it.
const Problem kSanitizerShapes[] = {{2, 150, 70, true}, {1, 150, 260, false}};

std::span<const Problem> shapes() {
  if (simt::kUnderSanitizer) return kSanitizerShapes;
  return kEveryShape;
}

TEST(MmaAttentionEmulated, HeadSize64MatchesTheCpu) {
  for (const Problem& p : shapes()) {
    check_forward_and_backward<64, 2>(p);
    check_forward_and_backward<64, 1>(p);
  }
}

TEST(MmaAttentionEmulated, HeadSize32MatchesTheCpu) {
  for (const Problem& p : shapes()) check_forward_and_backward<32, 2>(p);
}

// Head size 128 tiles its backward 32 columns at a time.
TEST(MmaAttentionEmulated, HeadSize128MatchesTheCpu) {
  for (const Problem& p : shapes()) check_forward_and_backward<128, 1>(p);
}

// No keys: out is zeros, lse -inf, and the key and value gradients have no rows.
// The forward folds the scale into its exponent, over the raw scores' max: a tiny scale (nearly
// uniform attention over the keys each query sees) and a large one (a softmax near its max) still
// match.
TEST(MmaAttentionEmulated, TinyAndLargeScalesMatchTheCpu) {
  if (simt::kUnderSanitizer) GTEST_SKIP() << "numerics only: the paths are HeadSize64's";
  for (const float scale : {1e-4f, 1.0f}) {
    check_forward_and_backward<64, 2>({2, 150, 70, true}, scale);
    check_forward_and_backward<64, 1>({1, 150, 260, false}, scale);
  }
}

TEST(MmaAttentionEmulated, NoKeysGiveZerosAndMinusInfinity) {
  Generator gen(3);
  const Tensor q = kernels::to_bf16(Tensor::randn({1, 20, 64}, gen));
  const std::vector<std::uint16_t> qb = copy_of<std::uint16_t>(q);
  const std::vector<std::uint16_t> none(8, 0);  // a valid pointer no kernel reads
  std::vector<float> out(20 * 64, -1.0f), lse(20, 0.0f);
  simt::launch(1, 128, (cuda::kForwardSmem<64, 1>), [&] {
    cuda::mma_forward_kernel<64, 1, float>(qb.data(), none.data(), none.data(), out.data(),
                                           lse.data(), 20, 0, true, kScale,
                                           cuda::contiguous_attention(64));
  });
  for (const float x : out) ASSERT_EQ(x, 0.0f);
  for (const float x : lse) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
}

// A packed (B, T, 3E) qkv, its output merged (B, T, E) in bf16 and its gradient packed (bf16 and
// f32): the GPT's layout, with no split or merge pass around the kernels. Against the CPU's
// split_qkv_heads, attention, merge_heads_bf16 and, backward, split_heads and merge_qkv_heads.
template <int kD, int kM>
void check_packed(std::int64_t batch, std::int64_t heads, std::int64_t t, bool causal) {
  SCOPED_TRACE("packed d" + std::to_string(kD) + (causal ? " causal" : ""));
  const std::int64_t e = heads * kD, problems = batch * heads;
  Generator gen(11 + static_cast<std::uint64_t>(kD + t));
  const Tensor qkv = kernels::to_bf16(Tensor::randn({batch, t, 3 * e}, gen));
  const Tensor gy = Tensor::randn({batch, t, e}, gen);
  Tensor q, k, v, lse_want;
  kernels::split_qkv_heads(qkv, heads, DType::BF16, q, k, v);
  const Tensor merged_want =
      kernels::merge_heads_bf16(kernels::attention_forward(q, k, v, causal, kScale, lse_want));
  Tensor gq, gk, gv;
  kernels::attention_backward(kernels::split_heads(gy, heads), q, k, v,
                              kernels::split_heads(kernels::to_f32(merged_want), heads), lse_want,
                              causal, kScale, &gq, &gk, &gv);
  const Tensor gqkv_want = kernels::merge_qkv_heads(gq, gk, gv);

  const std::vector<std::uint16_t> x = copy_of<std::uint16_t>(qkv);
  const std::vector<float> g = copy_of<float>(gy);
  const cuda::AttentionLayout layout = cuda::packed_attention(heads, kD);
  const unsigned grid = static_cast<unsigned>(problems * ((t + 63) / 64));
  const auto forward_grid =
      static_cast<unsigned>(problems * ((t + cuda::kForwardRows<kM> - 1) / cuda::kForwardRows<kM>));
  std::vector<std::uint16_t> merged(static_cast<std::size_t>(batch * t * e), 0xffffu);
  std::vector<float> lse(static_cast<std::size_t>(problems * t), -1.0f);
  simt::launch(forward_grid, 128, (cuda::kForwardSmem<kD, kM>), [&] {
    cuda::mma_forward_kernel<kD, kM, std::uint16_t>(x.data(), x.data() + e, x.data() + 2 * e,
                                                    merged.data(), lse.data(), t, t, causal, kScale,
                                                    layout);
  });
  {
    const std::vector<std::uint16_t> want = copy_of<std::uint16_t>(merged_want);
    float size = 1.0f, worst = 0.0f;
    for (std::size_t i = 0; i < want.size(); ++i) {
      size = std::max(size, std::abs(widened(want[i])));
      worst = std::max(worst, std::abs(widened(merged[i]) - widened(want[i])));
    }
    EXPECT_LE(worst / size, kOutTolerance) << "merged out";
  }
  EXPECT_LE(relative_error(lse, lse_want), kLseTolerance) << "lse";

  // Delta from a merged bf16 output and gradient, as the backward computes it: the CPU's output,
  // the one its gradients were computed with (the kernel's differs from it by bf16 roundings).
  const std::vector<std::uint16_t> o = copy_of<std::uint16_t>(merged_want);
  std::vector<float> delta(lse.size(), -1.0f);
  std::vector<std::uint16_t> g16(g.size(), 0xffffu);
  simt::launch(cuda::blocks_for(problems * t, 4), 128, 0, [&] {
    cuda::attention_delta_kernel<kD, std::uint16_t>(g.data(), o.data(), delta.data(), g16.data(),
                                                    problems, t, layout);
  });
  for (std::int64_t p = 0; p < problems; ++p) {
    for (std::int64_t i = 0; i < t; ++i) {
      const std::int64_t at = ((p / heads) * t + i) * e + (p % heads) * kD;
      double want = 0.0;
      for (int c = 0; c < kD; ++c) want += static_cast<double>(g[at + c]) * widened(o[at + c]);
      ASSERT_NEAR(delta[p * t + i], want, 1e-4 * (1.0 + std::abs(want)))
          << "delta " << p << " " << i;
    }
  }
  // The same by the 16-byte rows kernel, from bf16 O and the packed layout.
  std::vector<float> delta16(delta.size(), -1.0f);
  std::vector<std::uint16_t> g16_rows(g.size(), 0xffffu);
  simt::launch(cuda::blocks_for(problems * t, cuda::kDeltaRowsPerBlock<kD>), 128, 0, [&] {
    cuda::attention_delta_rows_kernel<kD, std::uint16_t>(g.data(), o.data(), delta16.data(),
                                                         g16_rows.data(), problems, t, layout);
  });
  for (std::size_t r = 0; r < delta.size(); ++r)
    ASSERT_NEAR(delta16[r], delta[r], 1e-5 * (1.0 + std::abs(delta[r]))) << "delta (rows) " << r;
  EXPECT_EQ(g16_rows, g16) << "dO rounded (rows)";
  // From a BF16 grad_out (a bf16 product's input gradient: g16 here), by both kernels: Delta of
  // its values, and no copy written (a null g_bf16 would fault if it were).
  for (const bool rows16 : {false, true}) {
    std::vector<float> delta_b(delta.size(), -1.0f);
    const auto body = [&] {
      if (rows16) {
        cuda::attention_delta_rows_kernel<kD, std::uint16_t, std::uint16_t>(
            g16.data(), o.data(), delta_b.data(), nullptr, problems, t, layout);
      } else {
        cuda::attention_delta_kernel<kD, std::uint16_t, std::uint16_t>(
            g16.data(), o.data(), delta_b.data(), nullptr, problems, t, layout);
      }
    };
    simt::launch(cuda::blocks_for(problems * t, rows16 ? cuda::kDeltaRowsPerBlock<kD> : 4), 128, 0,
                 body);
    for (std::int64_t p = 0; p < problems; ++p) {
      for (std::int64_t i = 0; i < t; ++i) {
        const std::int64_t at = ((p / heads) * t + i) * e + (p % heads) * kD;
        double want = 0.0;
        for (int c = 0; c < kD; ++c)
          want += static_cast<double>(widened(g16[at + c])) * widened(o[at + c]);
        ASSERT_NEAR(delta_b[p * t + i], want, 1e-4 * (1.0 + std::abs(want)))
            << "delta from bf16 dO " << (rows16 ? "(rows) " : "") << p << " " << i;
      }
    }
  }

  // The gradients from the CPU's lse (delta as above), packed, in bf16 and in f32.
  const std::vector<float> lse_in = copy_of<float>(lse_want);
  std::vector<std::uint16_t> gqkv16(x.size(), 0xffffu);
  std::vector<float> gqkv(x.size(), -1.0f);
  const auto backward = [&](auto* out) {
    simt::launch(grid, 128, cuda::kGradQSmem<kD>, [&] {
      cuda::mma_grad_q_kernel<kD>(x.data(), x.data() + e, x.data() + 2 * e, g16.data(),
                                  lse_in.data(), delta.data(), out, t, t, causal, kScale, layout);
    });
    simt::launch(grid, 128, cuda::kGradKvSmem<kD>, [&] {
      cuda::mma_grad_kv_kernel<kD, std::remove_pointer_t<decltype(out)>, false>(
          x.data(), x.data() + e, x.data() + 2 * e, g16.data(), lse_in.data(), delta.data(),
          out + e, out + 2 * e, t, t, causal, kScale, layout, nullptr, {});
    });
  };
  // The one pass, its sums garbage and its counters zero at the launch as the launcher leaves them.
  const auto one_pass = [&](auto* out) {
    std::vector<float> sums(static_cast<std::size_t>(problems * t * kD), -1e30f);
    std::vector<int> turns(static_cast<std::size_t>(problems * cuda::dq_tiles<kD>(t)), 0);
    simt::launch(grid, 128, (cuda::kGradKvSmem<kD, true>), [&] {
      cuda::mma_grad_kv_kernel<kD, std::remove_pointer_t<decltype(out)>, true>(
          x.data(), x.data() + e, x.data() + 2 * e, g16.data(), lse_in.data(), delta.data(),
          out + e, out + 2 * e, t, t, causal, kScale, layout, out, {sums.data(), turns.data()});
    });
  };
  const auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    EXPECT_LE(relative_error(gqkv, gqkv_want), kGradTolerance) << "f32 gradient";
    // The bf16 gradient is the f32 one rounded once as it is stored, bit for bit (a comparison
    // with the CPU's rounded gradient would flip with the CPU's own last bits, which vary by CPU
    // model).
    ASSERT_EQ(gqkv16.size(), gqkv.size());
    for (std::size_t i = 0; i < gqkv.size(); ++i) {
      ASSERT_EQ(gqkv16[i], cuda::f32_to_bf16_bits(gqkv[i])) << "bf16 gradient [" << i << "]";
    }
  };
  backward(gqkv16.data());
  backward(gqkv.data());
  check("two kernels");
  const std::vector<float> two_kernels = gqkv;
  std::fill(gqkv.begin(), gqkv.end(), -1.0f);
  std::fill(gqkv16.begin(), gqkv16.end(), 0xffffu);
  one_pass(gqkv16.data());
  one_pass(gqkv.data());
  check("one pass");
  // k's and v's columns as the two kernels wrote them, bit for bit.
  for (std::size_t i = 0; i < gqkv.size(); ++i) {
    if ((i % (3 * e)) >= static_cast<std::size_t>(e)) {
      ASSERT_EQ(gqkv[i], two_kernels[i]) << "k or v gradient [" << i << "]";
    }
  }
}

TEST(MmaAttentionEmulated, PackedQkvMatchesTheSplitHeadsOnTheCpu) {
  check_packed<64, 2>(2, 3, 100, true);
  if (simt::kUnderSanitizer) return;  // the other head sizes' paths are HeadSize32's and 128's
  check_packed<32, 1>(1, 2, 70, false);
  check_packed<128, 1>(1, 2, 40, true);
}

}  // namespace
}  // namespace hpm
