// Behaviour of the ops that the gradient checks cannot see: the fused attention against the
// unfused composition at sizes spanning several tiles, what a fully masked row gives, and the
// documented errors.
#include "hpm/autograd/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/attention.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

Tensor causal_mask(std::int64_t t, std::int64_t s) {
  Tensor m = Tensor::zeros({t, s}, DType::I8);
  for (std::int64_t i = 0; i < t; ++i)
    for (std::int64_t j = i + 1; j < s; ++j) m.data<std::int8_t>()[i * s + j] = 1;
  return m;
}

// softmax(q k^T * scale, mask) v through matmul, transpose and masked_softmax: T x S materialized.
Tensor unfused_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(q.size(-1)));
  Tensor s = mul(matmul(q, transpose(k, -2, -1)), scale);
  Tensor p = causal ? masked_softmax(s, causal_mask(q.size(-2), k.size(-2))) : softmax(s);
  return matmul(p, v);
}

void expect_near_all(const Tensor& a, const Tensor& b, float tol, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  for (std::int64_t i = 0; i < a.numel(); ++i)
    ASSERT_NEAR(pa[i], pb[i], tol * (1.0f + std::fabs(pb[i]))) << what << " element " << i;
}

// Both of the fused op's paths against the composed ops: 100 positions take the batched GEMMs over
// materialized scores (a head's scores up to 64 KiB), 150 the tiles (two full 64-row tiles and a
// partial one); 2 x 3 heads of 24.
TEST(Attention, FusedEqualsUnfusedOnBothPaths) {
  Generator gen(3);
  for (const std::int64_t t : {100, 150})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::to_string(t) + (causal ? " causal" : " full"));
      Tensor q = Tensor::randn({2, 3, t, 24}, gen), k = Tensor::randn({2, 3, t, 24}, gen),
             v = Tensor::randn({2, 3, t, 24}, gen);
      Tensor g = Tensor::randn({2, 3, t, 24}, gen);
      std::vector<Tensor> grads[2];
      Tensor outs[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor qq = q.clone().set_requires_grad(true), kk = k.clone().set_requires_grad(true),
               vv = v.clone().set_requires_grad(true);
        outs[fused] = fused ? scaled_dot_product_attention(qq, kk, vv, causal)
                            : unfused_attention(qq, kk, vv, causal);
        outs[fused].backward(g);
        grads[fused] = {qq.grad(), kk.grad(), vv.grad()};
      }
      expect_near_all(outs[1], outs[0], 1e-5f, "output");
      expect_near_all(grads[1][0], grads[0][0], 1e-4f, "grad q");
      expect_near_all(grads[1][1], grads[0][1], 1e-4f, "grad k");
      expect_near_all(grads[1][2], grads[0][2], 1e-4f, "grad v");
    }
}

// The packed op runs the same kernels on the same heads as the permute/split/merge it replaces:
// values and gradients equal bit for bit. 70 positions: a full 64-row tile and a partial one.
TEST(Attention, PackedEqualsTheSplitAttendedAndMergedHeads) {
  Generator gen(4);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const Tensor qkv = Tensor::randn({2, 70, 3 * 3 * 8}, gen);
    const Tensor g = Tensor::randn({2, 70, 3 * 8}, gen);
    Tensor outs[2], grads[2];
    for (int packed = 0; packed < 2; ++packed) {
      Tensor x = qkv.clone().set_requires_grad(true);
      outs[packed] = packed ? packed_self_attention(x, 3, causal)
                            : test::composed_packed_attention(x, 3, causal);
      outs[packed].backward(g);
      grads[packed] = x.grad();
    }
    EXPECT_EQ(outs[1].shape(), outs[0].shape());
    EXPECT_EQ(outs[1].to_vector(), outs[0].to_vector());
    EXPECT_EQ(grads[1].to_vector(), grads[0].to_vector());
  }
}

TEST(Attention, HeadLayoutsRoundTrip) {
  Generator gen(6);
  const Tensor qkv = Tensor::randn({2, 5, 3 * 4 * 3}, gen);
  Tensor q, k, v;
  kernels::split_qkv_heads(qkv, 4, DType::F32, q, k, v);
  EXPECT_EQ(q.shape(), Shape({2, 4, 5, 3}));
  // Token 1 of batch 1, head 2, element 0: q, k and v are E = 12 apart in its packed row.
  const float* row = qkv.data<float>() + (1 * 5 + 1) * 36 + 2 * 3;
  EXPECT_EQ(q.data<float>()[((1 * 4 + 2) * 5 + 1) * 3], row[0]);
  EXPECT_EQ(k.data<float>()[((1 * 4 + 2) * 5 + 1) * 3], row[12]);
  EXPECT_EQ(v.data<float>()[((1 * 4 + 2) * 5 + 1) * 3], row[24]);
  EXPECT_EQ(kernels::merge_qkv_heads(q, k, v).to_vector(), qkv.to_vector());
  const Tensor x = Tensor::randn({2, 5, 12}, gen);
  EXPECT_EQ(kernels::merge_heads(kernels::split_heads(x, 4)).to_vector(), x.to_vector());
  Tensor qb, kb, vb;  // bf16 heads: the f32 heads rounded
  kernels::split_qkv_heads(qkv, 4, DType::BF16, qb, kb, vb);
  EXPECT_EQ(kernels::to_f32(vb).to_vector(), kernels::to_f32(kernels::to_bf16(v)).to_vector());
}

TEST(Attention, PackedRejectsAWidthNotThreeTimesTheHeads) {
  try {
    packed_self_attention(Tensor::zeros({2, 5, 20}), 3);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("split_qkv_heads: expected F32 (B, T, 3 x 3 heads x D), "
                                         "got F32 [2, 5, 20]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Attention, CausalFirstRowCopiesTheFirstValue) {
  // Query 0 sees key 0 alone: its output is v[0] whatever the scores.
  Generator gen(5);
  Tensor q = Tensor::randn({1, 1, 9, 4}, gen), k = Tensor::randn({1, 1, 9, 4}, gen),
         v = Tensor::randn({1, 1, 9, 4}, gen);
  Tensor y = scaled_dot_product_attention(q, k, v, true);
  for (int e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(y.data<float>()[e], v.data<float>()[e]);
}

TEST(Attention, RejectsMismatchedShapes) {
  Tensor q = Tensor::zeros({2, 5, 4}), k = Tensor::zeros({2, 5, 3});
  try {
    scaled_dot_product_attention(q, k, k);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 5, 4], [2, 5, 3]"), std::string::npos) << e.what();
  }
}

TEST(MaskedSoftmax, FullyMaskedRowIsZeroNotNan) {
  Tensor x = Tensor::from({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor mask = Tensor::zeros({2, 3}, DType::I8);
  for (int j = 0; j < 3; ++j) mask.data<std::int8_t>()[3 + j] = 1;  // row 1 masked everywhere
  mask.data<std::int8_t>()[0] = 1;
  const auto y = masked_softmax(x, mask).to_vector();
  EXPECT_FLOAT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 1.0f / (1.0f + std::exp(1.0f)), 1e-6);
  for (int j = 3; j < 6; ++j) EXPECT_EQ(y[static_cast<std::size_t>(j)], 0.0f);
}

TEST(MaskedFill, RejectsAFloatMaskAndAMaskThatDoesNotBroadcast) {
  Tensor x = Tensor::zeros({2, 3});
  EXPECT_THROW(masked_fill(x, Tensor::zeros({2, 3}), 1.0f), std::invalid_argument);
  EXPECT_THROW(masked_fill(x, Tensor::zeros({4}, DType::I8), 1.0f), std::invalid_argument);
}

TEST(CrossEntropy, LanguageModelMeanSkipsIgnoredPositions) {
  // Two positions of three ignored: the loss is the remaining position's alone.
  Tensor logits = Tensor::from({0, 0, 0, 1, 2, 3, 5, 5, 5}, {1, 3, 3});
  Tensor targets = Tensor::from_i64(std::vector<std::int64_t>{-100, 2, -100}, Shape{1, 3});
  const double expected = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-6);
  Tensor all_ignored = Tensor::from_i64(std::vector<std::int64_t>{-100, -100, -100}, Shape{1, 3});
  EXPECT_TRUE(std::isnan(cross_entropy(logits, all_ignored).item()));
  Tensor wrong = Tensor::from_i64(std::vector<std::int64_t>{0, 3, 1}, Shape{1, 3});
  EXPECT_THROW(cross_entropy(logits, wrong), std::out_of_range);
  EXPECT_THROW(cross_entropy(logits, Tensor::from_i64(std::vector<std::int64_t>{0, 1}, Shape{2})),
               std::invalid_argument);
  EXPECT_THROW(cross_entropy(Tensor::zeros({1, 3, 3}, DType::I64), targets), std::invalid_argument);
  // No classes at all (every row ignored): NaN, and a prediction of 0 for each row.
  Tensor predicted;
  EXPECT_TRUE(std::isnan(
      cross_entropy(Tensor::zeros({1, 3, 0}), all_ignored, 0.0f, -100, &predicted).item()));
  EXPECT_EQ(predicted.to_vector_i64(), std::vector<std::int64_t>(3, 0));
}

// A masked class (a -inf logit) costs a row nothing without smoothing (its mean term is left out,
// not multiplied by zero: 0 * inf is NaN); with smoothing it makes the loss infinite, as PyTorch.
// Its gradient is 0 there.
TEST(CrossEntropy, AMaskedClassIsFiniteWithoutSmoothing) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor logits = Tensor::from({1, -inf, 3, 0, 2, 2}, {2, 3});
  logits.set_requires_grad(true);
  const Tensor labels = Tensor::from_i64(std::vector<std::int64_t>{2, 0}, Shape{2});
  Tensor loss = cross_entropy(logits, labels);
  const double row0 = std::log(std::exp(1.0) + std::exp(3.0)) - 3.0;
  const double row1 = std::log(1.0 + 2.0 * std::exp(2.0));
  EXPECT_NEAR(loss.item(), (row0 + row1) / 2.0, 1e-6);
  loss.backward();
  EXPECT_EQ(logits.grad().to_vector()[1], 0.0f);
  EXPECT_TRUE(std::isinf(cross_entropy(logits.detach(), labels, 0.1f).item()));
}

// What the loss keeps for its backward is two numbers a row, not a probability per logit: a
// 16 x 1024-token batch over GPT-2's 50304 classes would hold 3.3 GB more.
TEST(CrossEntropy, KeepsRowStatisticsNotProbabilitiesForTheBackward) {
  Device device("cross entropy");
  const DeviceGuard on(device);
  const std::int64_t rows = 64, classes = 1000;
  Generator gen(4);
  Tensor logits = Tensor::randn({rows, classes}, gen, 0.0f, 1.0f, device);
  logits.set_requires_grad(true);
  std::vector<std::int64_t> y(rows);
  for (std::int64_t i = 0; i < rows; ++i) y[static_cast<std::size_t>(i)] = (i * 37) % classes;
  const Tensor labels = Tensor::from_i64(y, Shape{rows}, device);
  const std::size_t before = device.stats().current_bytes;
  Tensor loss = cross_entropy(logits, labels);
  const std::size_t kept = device.stats().current_bytes - before;
  EXPECT_LT(kept, static_cast<std::size_t>(rows * classes) * sizeof(float) / 10)
      << kept << " bytes kept for the backward";
  // The gradient is softmax - one-hot over the rows, from those statistics.
  loss.backward();
  const std::vector<float> g = logits.grad().to_vector(), x = logits.to_vector();
  for (std::int64_t i : {std::int64_t{0}, std::int64_t{63}}) {
    double sum = 0;
    for (std::int64_t j = 0; j < classes; ++j)
      sum += std::exp(x[static_cast<std::size_t>(i * classes + j)]);
    for (std::int64_t j : {std::int64_t{0}, y[static_cast<std::size_t>(i)]}) {
      const double p = std::exp(x[static_cast<std::size_t>(i * classes + j)]) / sum;
      const double expected = (p - (j == y[static_cast<std::size_t>(i)] ? 1.0 : 0.0)) / rows;
      EXPECT_NEAR(g[static_cast<std::size_t>(i * classes + j)], expected, 1e-7) << i << ", " << j;
    }
  }
}

// With nothing else holding the logits, their backward writes the gradient over them: the peak
// of the backward holds one (rows, C) tensor less. A caller that keeps them sees them unchanged.
TEST(CrossEntropy, WritesTheGradientOverLogitsNoOneElseHolds) {
  const std::int64_t rows = 32, classes = 2048;
  const std::size_t logits_bytes = static_cast<std::size_t>(rows * classes) * sizeof(float);
  std::vector<std::int64_t> y(rows);
  for (std::int64_t i = 0; i < rows; ++i) y[static_cast<std::size_t>(i)] = (i * 7) % classes;
  const auto backward_peak = [&](bool keep_logits, std::vector<float>* kept_values) {
    Device device("cross entropy in place");
    const DeviceGuard on(device);
    Generator gen(6);
    Tensor w = Tensor::randn({rows, classes}, gen, 0.0f, 1.0f, device);
    w.set_requires_grad(true);
    const Tensor labels = Tensor::from_i64(y, Shape{rows}, device);
    Tensor logits = mul(w, 2.0f);
    const std::vector<float> before = logits.to_vector();
    Tensor loss = cross_entropy(logits, labels);
    if (!keep_logits) logits = Tensor();
    device.reset_peak();
    const std::size_t at_start = device.stats().current_bytes;
    loss.backward();
    if (kept_values != nullptr) {
      *kept_values = logits.to_vector();
      EXPECT_EQ(*kept_values, before) << "logits someone holds are not overwritten";
    }
    // The same gradient either way: 2 (softmax - one-hot) / rows.
    const std::vector<float> g = w.grad().to_vector();
    double sum = 0;
    for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(2.0 * w.to_vector()[j]);
    EXPECT_NEAR(g[1], 2.0 * std::exp(2.0 * w.to_vector()[1]) / sum / rows, 1e-7);
    return device.stats().peak_bytes - at_start;
  };
  std::vector<float> kept;
  const std::size_t in_place = backward_peak(false, nullptr);
  const std::size_t copied = backward_peak(true, &kept);
  EXPECT_LE(in_place + logits_bytes, copied) << in_place << " against " << copied;
}

TEST(Concat, RejectsMismatchedExtents) {
  try {
    concat({Tensor::zeros({2, 3}), Tensor::zeros({3, 3})}, 1);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("outside dimension 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(narrow(Tensor::zeros({2, 3}), 1, 2, 2), std::out_of_range);
}

}  // namespace
}  // namespace hpm
