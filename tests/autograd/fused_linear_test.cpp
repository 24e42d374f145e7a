// The products fused with the op before them (autograd/ops/fused_linear.cpp) and a Linear's
// parameter gradients: each fusion equal to its composition bit for bit, in f32 and under bf16
// autocast, with the passes it saves counted by the dispatch; and the gradients handed to a bf16
// product in bf16 (node.h's Bf16Grad) equal to the f32 ones that product would round.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// The fusions on for one test, whatever HPM_BF16_FUSIONS says (these tests count their passes).
class FusionsOn {
 public:
  FusionsOn() : previous_(autograd::bf16_fusions()) { autograd::set_bf16_fusions(true); }
  ~FusionsOn() { autograd::set_bf16_fusions(previous_); }
  FusionsOn(const FusionsOn&) = delete;
  FusionsOn& operator=(const FusionsOn&) = delete;

 private:
  bool previous_;
};

// actual[k] and expected[k] (F32) hold the same shapes and bits.
void expect_same_bits(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected,
                      const std::vector<std::string>& names) {
  ASSERT_EQ(actual.size(), expected.size());
  ASSERT_EQ(actual.size(), names.size());
  for (std::size_t k = 0; k < actual.size(); ++k) {
    ASSERT_EQ(actual[k].dtype(), DType::F32) << names[k];
    testing::expect_same_bits(actual[k], expected[k], names[k]);
  }
}

// F32, and BF16 where this CPU runs bf16 products (autocast to bf16 needs it).
std::vector<autograd::Precision> precisions_here() {
  std::vector<autograd::Precision> p{autograd::Precision::F32};
  if (kernels::native_bf16()) p.push_back(autograd::Precision::BF16);
  return p;
}

// A Linear's weight and bias gradients come from one product whose epilogue sums the output
// gradient's rows (linear_param_grads_), written fresh the first time and added into the weight's
// gradient the second; under bf16 autocast both from the rounded g and x.
TEST(Linear, BackwardGivesWeightAndBiasGradientsFromOneProduct) {
  const FusionsOn fusions;
  for (const autograd::Precision precision : precisions_here()) {
    SCOPED_TRACE(autograd::precision_name(precision));
    const bool bf16 = precision == autograd::Precision::BF16;
    Generator gen(11);
    Tensor x = Tensor::randn({13, 8}, gen), w = Tensor::randn({5, 8}, gen);
    Tensor b = Tensor::randn({5}, gen), r = Tensor::randn({13, 5}, gen);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    // The operands as the product sees them.
    const Tensor xp = bf16 ? kernels::to_f32(kernels::to_bf16(x)) : x;
    const Tensor rp = bf16 ? kernels::to_f32(kernels::to_bf16(r)) : r;
    for (int pass = 1; pass <= 2; ++pass) {
      const auto products = dispatch_count(DeviceType::kCpu, Op::kLinearParamGrads);
      {
        autograd::AutocastScope scope(precision);
        sum(mul(linear(x, w, b), r)).backward();
      }
      EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kLinearParamGrads) - products, 1u);
      for (std::int64_t o = 0; o < 5; ++o) {
        double db = 0.0;
        for (std::int64_t n = 0; n < 13; ++n) db += rp.data<float>()[n * 5 + o];
        EXPECT_NEAR(b.grad().data<float>()[o], pass * db, 1e-4) << "db " << o;
        for (std::int64_t i = 0; i < 8; ++i) {
          double dw = 0.0;
          for (std::int64_t n = 0; n < 13; ++n) {
            dw += static_cast<double>(rp.data<float>()[n * 5 + o]) * xp.data<float>()[n * 8 + i];
          }
          EXPECT_NEAR(w.grad().data<float>()[o * 8 + i], pass * dw, 1e-4) << "dw " << o << "," << i;
        }
      }
    }
  }
}

// The widenings (to_f32) of a fused product's backward against its composition's: under bf16
// autocast the Linear's input gradient is bf16 (linear_bf16), which the composition's engine
// widens once for the rule before it (a norm, GELU or attention), and the fused rule reads as it
// is; none in f32.
std::uint64_t bf16_composition_widenings(autograd::Precision precision, int fused) {
  return precision == autograd::Precision::BF16 && fused == 0 ? 1u : 0u;
}

// gelu_linear is linear(gelu(x)) bit for bit, values and gradients, in f32 and under bf16
// autocast, where its forward reads x once (one unary_bf16, no unary, no to_bf16 of activations).
TEST(GeluLinear, EqualsTheCompositionBitForBit) {
  const FusionsOn fusions;
  for (const autograd::Precision precision : precisions_here()) {
    SCOPED_TRACE(autograd::precision_name(precision));
    Generator gen(5);
    const Tensor x0 = Tensor::randn({9, 16}, gen), w0 = Tensor::randn({6, 16}, gen);
    const Tensor b0 = Tensor::randn({6}, gen), r = Tensor::randn({9, 6}, gen);
    Tensor grads[2][3], outs[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = x0.clone(), w = w0.clone(), b = b0.clone();
      for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
      autograd::AutocastScope scope(precision);
      const auto unary = dispatch_count(DeviceType::kCpu, Op::kUnary);
      const auto fused_unary = dispatch_count(DeviceType::kCpu, Op::kUnaryBf16);
      const auto rounds = dispatch_count(DeviceType::kCpu, Op::kToBf16);
      outs[fused] = fused ? gelu_linear(x, w, b) : linear(gelu(x), w, b);
      if (fused && precision == autograd::Precision::BF16) {
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kUnary) - unary, 0u);
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kUnaryBf16) - fused_unary, 1u);
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kToBf16) - rounds, 1u);  // the weight
      }
      const auto widenings = dispatch_count(DeviceType::kCpu, Op::kToF32);
      sum(mul(outs[fused], r)).backward();
      // The GELU's backward reads the kept bf16 input and the product's bf16 input gradient
      // themselves: no widening pass, where the composition's engine widens that gradient once for
      // GELU's rule.
      EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kToF32) - widenings,
                bf16_composition_widenings(precision, fused));
      grads[fused][0] = x.grad();
      grads[fused][1] = w.grad();
      grads[fused][2] = b.grad();
    }
    expect_same_bits({outs[1], grads[1][0], grads[1][1], grads[1][2]},
                     {outs[0], grads[0][0], grads[0][1], grads[0][2]},
                     {"output", "dx", "dW", "db"});
  }
}

// With a residual, gelu_linear is add(residual, linear(gelu(x))) bit for bit, values and the four
// gradients, in f32 and under bf16 autocast, where the product adds the residual (no add op).
TEST(GeluLinear, WithAResidualEqualsTheSumBitForBit) {
  const FusionsOn fusions;
  for (const autograd::Precision precision : precisions_here()) {
    SCOPED_TRACE(autograd::precision_name(precision));
    Generator gen(6);
    const Tensor x0 = Tensor::randn({9, 16}, gen), w0 = Tensor::randn({6, 16}, gen);
    const Tensor b0 = Tensor::randn({6}, gen), h0 = Tensor::randn({9, 6}, gen);
    const Tensor r = Tensor::randn({9, 6}, gen);
    std::vector<Tensor> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = x0.clone(), w = w0.clone(), b = b0.clone(), h = h0.clone();
      for (Tensor* t : {&x, &w, &b, &h}) t->set_requires_grad(true);
      autograd::AutocastScope scope(precision);
      const auto adds = dispatch_count(DeviceType::kCpu, Op::kBinary);
      const Tensor y = fused ? gelu_linear(x, w, b, h) : add(h, gelu_linear(x, w, b));
      if (fused && precision == autograd::Precision::BF16) {
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kBinary) - adds, 0u) << "an add op ran";
      }
      sum(mul(y, r)).backward();
      results[fused] = {y, x.grad(), w.grad(), b.grad(), h.grad()};
    }
    expect_same_bits(results[1], results[0], {"output", "dx", "dW", "db", "dresidual"});
  }
}

// layer_norm_linear is linear(layer_norm(x)) bit for bit, values and all five gradients, in f32
// and under bf16 autocast, where its forward reads x once (one layer_norm_forward_bf16, no
// layer_norm_forward, only the weight rounded by to_bf16).
TEST(LayerNormLinear, EqualsTheCompositionBitForBit) {
  const FusionsOn fusions;
  for (const autograd::Precision precision : precisions_here()) {
    SCOPED_TRACE(autograd::precision_name(precision));
    Generator gen(9);
    const Tensor x0 = Tensor::randn({7, 24}, gen), lw0 = Tensor::randn({24}, gen);
    const Tensor lb0 = Tensor::randn({24}, gen), w0 = Tensor::randn({10, 24}, gen);
    const Tensor b0 = Tensor::randn({10}, gen), r = Tensor::randn({7, 10}, gen);
    std::vector<Tensor> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = x0.clone(), lw = lw0.clone(), lb = lb0.clone(), w = w0.clone(), b = b0.clone();
      for (Tensor* t : {&x, &lw, &lb, &w, &b}) t->set_requires_grad(true);
      autograd::AutocastScope scope(precision);
      const auto norms = dispatch_count(DeviceType::kCpu, Op::kLayerNormForward);
      const auto rounds = dispatch_count(DeviceType::kCpu, Op::kToBf16);
      const Tensor y = fused ? layer_norm_linear(x, lw, lb, 1e-5f, w, b)
                             : linear(layer_norm(x, 24, lw, lb, 1e-5f), w, b);
      if (fused && precision == autograd::Precision::BF16) {
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kLayerNormForward) - norms, 0u);
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kToBf16) - rounds, 1u);  // the weight
      }
      const auto widenings = dispatch_count(DeviceType::kCpu, Op::kToF32);
      sum(mul(y, r)).backward();
      EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kToF32) - widenings,
                bf16_composition_widenings(precision, fused));
      results[fused] = {y, x.grad(), lw.grad(), lb.grad(), w.grad(), b.grad()};
    }
    expect_same_bits(results[1], results[0],
                     {"output", "dx", "d ln weight", "d ln bias", "dW", "db"});
  }
}

// residual_layer_norm_linear is layer_norm_linear(add(a, b)) bit for bit, the output, the sum and
// the gradients of a, b and the four parameters, in f32 and under bf16 autocast, where its forward
// is one add_layer_norm_forward_bf16 (no binary add, no layer_norm_forward_bf16); the sum feeds a
// second consumer (the residual stream's next step) whose gradient the norm's adds into.
TEST(ResidualLayerNormLinear, EqualsTheCompositionBitForBit) {
  const FusionsOn fusions;
  for (const autograd::Precision precision : precisions_here()) {
    SCOPED_TRACE(autograd::precision_name(precision));
    Generator gen(21);
    const Tensor a0 = Tensor::randn({7, 24}, gen), b0 = Tensor::randn({7, 24}, gen);
    const Tensor lw0 = Tensor::randn({24}, gen), lb0 = Tensor::randn({24}, gen);
    const Tensor w0 = Tensor::randn({10, 24}, gen), bias0 = Tensor::randn({10}, gen);
    const Tensor r = Tensor::randn({7, 10}, gen), rs = Tensor::randn({7, 24}, gen);
    std::vector<Tensor> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor a = a0.clone(), b = b0.clone(), lw = lw0.clone(), lb = lb0.clone();
      Tensor w = w0.clone(), bias = bias0.clone();
      for (Tensor* t : {&a, &b, &lw, &lb, &w, &bias}) t->set_requires_grad(true);
      autograd::AutocastScope scope(precision);
      const auto adds = dispatch_count(DeviceType::kCpu, Op::kBinary);
      const auto norms = dispatch_count(DeviceType::kCpu, Op::kLayerNormForwardBf16);
      const auto fused_norms = dispatch_count(DeviceType::kCpu, Op::kAddLayerNormForwardBf16);
      Tensor stream;  // the residual stream's sum
      const Tensor y = fused ? residual_layer_norm_linear(a, b, stream, lw, lb, 1e-5f, w, bias)
                             : layer_norm_linear(stream = add(a, b), lw, lb, 1e-5f, w, bias);
      if (fused && precision == autograd::Precision::BF16) {
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kBinary) - adds, 0u);
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kLayerNormForwardBf16) - norms, 0u);
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kAddLayerNormForwardBf16) - fused_norms, 1u);
      }
      (sum(mul(y, r)) + sum(mul(stream, rs))).backward();
      results[fused] = {y,         stream.detach(), a.grad(), b.grad(),
                        lw.grad(), lb.grad(),       w.grad(), bias.grad()};
    }
    expect_same_bits(results[1], results[0],
                     {"output", "sum", "da", "db", "d ln weight", "d ln bias", "dW", "d bias"});
  }
}

// packed_self_attention_linear is the projection of packed_self_attention's merged heads bit for
// bit, values and the gradients of qkv, W and b, in f32 and under bf16 autocast, where its
// forward runs attention over the packed qkv with its output merged and rounded
// (packed_attention_forward_bf16: no merge_heads; to_bf16 rounds only the weight and this F32
// qkv, which a GPT's bf16 qkv product leaves nothing to round) and its backward widens nothing.
TEST(PackedSelfAttentionLinear, EqualsTheCompositionBitForBit) {
  const FusionsOn fusions;
  for (const autograd::Precision precision : precisions_here()) {
    SCOPED_TRACE(autograd::precision_name(precision));
    Generator gen(13);
    const std::int64_t b = 2, t = 9, heads = 2, e = 32;  // head size 16
    const Tensor qkv0 = Tensor::randn({b, t, 3 * e}, gen), w0 = Tensor::randn({e, e}, gen);
    const Tensor b0 = Tensor::randn({e}, gen), r = Tensor::randn({b, t, e}, gen);
    std::vector<Tensor> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor qkv = qkv0.clone(), w = w0.clone(), bias = b0.clone();
      for (Tensor* p : {&qkv, &w, &bias}) p->set_requires_grad(true);
      autograd::AutocastScope scope(precision);
      const auto merges = dispatch_count(DeviceType::kCpu, Op::kMergeHeads);
      const auto rounds = dispatch_count(DeviceType::kCpu, Op::kToBf16);
      Tensor y;
      if (fused) {
        y = packed_self_attention_linear(qkv, heads, true, w, bias);
      } else {
        const Tensor merged = packed_self_attention(qkv, heads, true);
        y = reshape(linear(reshape(merged, {b * t, e}), w, bias), {b, t, e});
      }
      if (fused && precision == autograd::Precision::BF16) {
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kMergeHeads) - merges, 0u);
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kToBf16) - rounds, 2u);  // qkv, weight
      }
      const auto widenings = dispatch_count(DeviceType::kCpu, Op::kToF32);
      sum(mul(y, r)).backward();
      EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kToF32) - widenings,
                bf16_composition_widenings(precision, fused));
      results[fused] = {y, qkv.grad(), w.grad(), bias.grad()};
    }
    expect_same_bits(results[1], results[0], {"output", "dqkv", "dW", "db"});
  }
}

// Where gelu_linear's input comes from a bf16 product (through a reshape, as in a GPT's MLP), its
// gradient goes back in bf16 (one unary_backward_bf16, no to_bf16 of it in the product's rule):
// the same bits as the f32 gradient the product would round. Where that input also feeds an f32
// op, the engine widens the bf16 gradient before the sum.
TEST(GeluLinear, HandsABf16ProductItsGradientInBf16) {
  const FusionsOn fusions;
  if (!kernels::native_bf16()) GTEST_SKIP() << "bf16 autocast needs AVX512_BF16";
  Generator gen(21);
  const Tensor h0 = Tensor::randn({6, 12}, gen), w10 = Tensor::randn({16, 12}, gen);
  const Tensor b10 = Tensor::randn({16}, gen), w20 = Tensor::randn({5, 16}, gen);
  const Tensor b20 = Tensor::randn({5}, gen), r = Tensor::randn({2, 3, 5}, gen);
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "the product's output also summed" : "the product's output used once");
    std::vector<Tensor> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor h = h0.clone(), w1 = w10.clone(), b1 = b10.clone(), w2 = w20.clone(), b2 = b20.clone();
      for (Tensor* t : {&h, &w1, &b1, &w2, &b2}) t->set_requires_grad(true);
      autograd::AutocastScope scope(autograd::Precision::BF16);
      const Tensor a = reshape(linear(h, w1, b1), {2, 3, 16});
      const Tensor rows = reshape(a, {6, 16});
      const Tensor y = fused ? gelu_linear(rows, w2, b2) : linear(gelu(rows), w2, b2);
      Tensor loss = sum(mul(reshape(y, {2, 3, 5}), r));
      if (shared) loss = add(loss, sum(a));
      const auto emitted = dispatch_count(DeviceType::kCpu, Op::kUnaryBackwardBf16);
      loss.backward();
      if (fused) {
        EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kUnaryBackwardBf16) - emitted, 1u);
      }
      results[fused] = {y, h.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()};
    }
    const char* names[] = {"output", "dh", "dW1", "db1", "dW2", "db2"};
    for (std::size_t k = 0; k < results[0].size(); ++k) {
      const Tensor& a = results[1][k];
      const Tensor& e = results[0][k];
      ASSERT_EQ(a.shape(), e.shape()) << names[k];
      ASSERT_EQ(a.dtype(), DType::F32) << names[k];
      float scale = 0.0f;
      for (std::int64_t i = 0; i < e.numel(); ++i)
        scale = std::max(scale, std::fabs(e.data<float>()[i]));
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        if (shared) {  // rounded before the sum there, after it here: within bf16's rounding
          ASSERT_NEAR(a.data<float>()[i], e.data<float>()[i], 2e-2f * scale)
              << names[k] << " element " << i;
        } else {
          ASSERT_EQ(a.data<float>()[i], e.data<float>()[i]) << names[k] << " element " << i;
        }
      }
    }
  }
}

// Under bf16 autocast a classifier's cross-entropy hands its product the logits' gradient in
// bf16 (cross_entropy_backward_bf16): the same bits as the f32 gradient the product would round,
// here the path where a multiplication by one (a rule that takes f32 only) stands between them.
TEST(CrossEntropy, HandsABf16ClassifierItsGradientInBf16) {
  const FusionsOn fusions;
  if (!kernels::native_bf16()) GTEST_SKIP() << "bf16 autocast needs AVX512_BF16";
  Generator gen(8);
  const Tensor x0 = Tensor::randn({2, 5, 16}, gen), w0 = Tensor::randn({40, 16}, gen);
  std::vector<std::int64_t> y;
  for (int i = 0; i < 10; ++i) y.push_back((i * 7) % 40);
  y[3] = -100;
  const Tensor labels = Tensor::from_i64(y, Shape{10});
  Tensor grads[2];
  for (int direct = 0; direct < 2; ++direct) {
    Tensor x = x0.clone(), w = w0.clone();
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    autograd::AutocastScope scope(autograd::Precision::BF16);
    Tensor logits = reshape(linear(reshape(x, {10, 16}), w, Tensor()), {2, 5, 40});
    if (!direct) logits = mul(logits, 1.0f);
    const auto emitted = dispatch_count(DeviceType::kCpu, Op::kCrossEntropyBackwardBf16);
    cross_entropy(reshape(logits, {10, 40}), labels, 0.1f).backward();
    EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kCrossEntropyBackwardBf16) - emitted,
              direct ? 1u : 0u);
    grads[direct] = w.grad();
  }
  expect_same_bits({grads[1]}, {grads[0]}, {"dW"});
}

// Where packed_self_attention_linear's qkv comes from a bf16 product (through a reshape, as in a
// GPT's block), qkv's gradient goes back in bf16 (packed_attention_backward's): the same bits as
// the f32 one the product would round (here behind a multiplication by one, which takes f32 only).
TEST(PackedSelfAttentionLinear, HandsABf16ProductItsGradientInBf16) {
  const FusionsOn fusions;
  if (!kernels::native_bf16()) GTEST_SKIP() << "bf16 autocast needs AVX512_BF16";
  Generator gen(17);
  const Tensor h0 = Tensor::randn({12, 8}, gen), wq0 = Tensor::randn({48, 8}, gen);
  const Tensor wp0 = Tensor::randn({16, 16}, gen), r = Tensor::randn({2, 6, 16}, gen);
  std::vector<Tensor> results[2];
  for (int direct = 0; direct < 2; ++direct) {
    Tensor h = h0.clone(), wq = wq0.clone(), wp = wp0.clone();
    for (Tensor* t : {&h, &wq, &wp}) t->set_requires_grad(true);
    autograd::AutocastScope scope(autograd::Precision::BF16);
    Tensor qkv = reshape(linear(h, wq, Tensor()), {2, 6, 48});
    if (!direct) qkv = mul(qkv, 1.0f);
    // The qkv product takes its gradient in bf16 when nothing but a reshape stands between
    // (packed_attention_backward then writes it in bf16), not behind the multiplication.
    EXPECT_EQ(autograd::bf16_gradient_taken(qkv), direct == 1);
    sum(mul(packed_self_attention_linear(qkv, 2, true, wp, Tensor()), r)).backward();
    results[direct] = {h.grad(), wq.grad(), wp.grad()};
  }
  expect_same_bits(results[1], results[0], {"dh", "dWqkv", "dWproj"});
}

// The largest |a - b| over the largest |b|: two F32 tensors of one shape.
float relative_difference(const Tensor& a, const Tensor& b) {
  float diff = 0.0f, scale = 0.0f;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
    scale = std::max(scale, std::fabs(b.data<float>()[i]));
  }
  return diff / scale;
}

// A norm's product writing its output in bf16 for the GELU after it (the GPT's fc): the forward is
// the F32 output rounded, then GELU and the next product on it, bit for bit; no F32 tensor of the
// product's output (one to_bf16, the weight's, per product), and the gradients those of the F32
// output within bf16's rounding (the GELU's output gradient is rounded too, as autocast rounds it).
TEST(GeluLinear, ReadsANormsBf16OutputWhereAutocastRoundsIt) {
  const FusionsOn fusions;
  if (!kernels::native_bf16()) GTEST_SKIP() << "bf16 autocast needs AVX512_BF16";
  Generator gen(23);
  const Tensor x0 = Tensor::randn({9, 16}, gen), lw = Tensor::randn({16}, gen);
  const Tensor lb = Tensor::randn({16}, gen), w10 = Tensor::randn({32, 16}, gen);
  const Tensor b1 = Tensor::randn({32}, gen), w20 = Tensor::randn({8, 32}, gen);
  const Tensor b2 = Tensor::randn({8}, gen), r = Tensor::randn({9, 8}, gen);
  std::vector<Tensor> results[2];
  for (const DType out : {DType::F32, DType::BF16}) {
    Tensor x = x0.clone(), w1 = w10.clone(), w2 = w20.clone();
    for (Tensor* t : {&x, &w1, &w2}) t->set_requires_grad(true);
    autograd::AutocastScope scope(autograd::Precision::BF16);
    const auto rounds = dispatch_count(DeviceType::kCpu, Op::kToBf16);
    const Tensor f = layer_norm_linear(x, lw, lb, 1e-5f, w1, b1, out);
    const Tensor y = gelu_linear(f, w2, b2);
    EXPECT_EQ(f.dtype(), out);
    if (out == DType::BF16) {
      EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kToBf16) - rounds, 2u);  // w1, w2
      Tensor mean, rstd;
      const Tensor f32 =
          kernels::linear(kernels::layer_norm_forward_bf16(x0, 16, lw, lb, 1e-5f, mean, rstd),
                          kernels::to_bf16(w10), b1);
      const Tensor want =
          kernels::linear(kernels::unary_bf16(kernels::UnaryOp::Gelu, kernels::to_bf16(f32)),
                          kernels::to_bf16(w20), b2);
      expect_same_bits({y}, {want}, {"output"});
    }
    sum(mul(y, r)).backward();
    results[out == DType::BF16] = {y, x.grad(), w1.grad(), w2.grad()};
  }
  const std::vector<std::string> names{"output", "dx", "dW1", "dW2"};
  for (std::size_t k = 0; k < names.size(); ++k) {
    EXPECT_LT(relative_difference(results[1][k], results[0][k]), 2e-2f) << names[k];
  }
}

// The qkv product writing bf16 for the packed attention: its heads were rounded on the split
// anyway, so the output and every gradient are the F32 output's, bit for bit.
TEST(PackedSelfAttentionLinear, ReadsANormsBf16OutputBitForBit) {
  const FusionsOn fusions;
  if (!kernels::native_bf16()) GTEST_SKIP() << "bf16 autocast needs AVX512_BF16";
  Generator gen(25);
  const std::int64_t b = 2, t = 7, e = 32;  // two heads of 16
  const Tensor x0 = Tensor::randn({b * t, e}, gen), lw = Tensor::randn({e}, gen);
  const Tensor lb = Tensor::randn({e}, gen), wq0 = Tensor::randn({3 * e, e}, gen);
  const Tensor bq = Tensor::randn({3 * e}, gen), wp0 = Tensor::randn({e, e}, gen);
  const Tensor r = Tensor::randn({b, t, e}, gen);
  std::vector<Tensor> results[2];
  for (const DType out : {DType::F32, DType::BF16}) {
    Tensor x = x0.clone(), wq = wq0.clone(), wp = wp0.clone();
    for (Tensor* p : {&x, &wq, &wp}) p->set_requires_grad(true);
    autograd::AutocastScope scope(autograd::Precision::BF16);
    const Tensor qkv = layer_norm_linear(x, lw, lb, 1e-5f, wq, bq, out);
    EXPECT_EQ(qkv.dtype(), out);
    const Tensor y =
        packed_self_attention_linear(reshape(qkv, {b, t, 3 * e}), 2, true, wp, Tensor());
    sum(mul(y, r)).backward();
    results[out == DType::BF16] = {y, x.grad(), wq.grad(), wp.grad()};
  }
  expect_same_bits(results[1], results[0], {"output", "dx", "dWqkv", "dWproj"});
}

TEST(GeluLinear, TakesABf16InputOnlyUnderTheFusions) {
  Generator gen(24);
  const Tensor x = kernels::to_bf16(Tensor::randn({3, 4}, gen)), w = Tensor::randn({2, 4}, gen);
  EXPECT_THROW(gelu_linear(x, w, Tensor()), std::invalid_argument);
  const Tensor qkv = kernels::to_bf16(Tensor::randn({1, 3, 12}, gen));
  EXPECT_THROW(packed_self_attention_linear(qkv, 2, true, Tensor::randn({4, 4}, gen), Tensor()),
               std::invalid_argument);
}

// With the fusions off (HPM_BF16_FUSIONS=0, for an A/B or a fallback) the GPT's fused calls run
// the compositions: no fused op dispatched, no gradient handed on in bf16, the same values.
TEST(GeluLinear, TheSwitchRunsTheComposition) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "bf16 autocast needs AVX512_BF16";
  const FusionsOn restored;  // at the end, whatever the loop leaves
  Generator gen(4);
  const Tensor h0 = Tensor::randn({6, 12}, gen), w10 = Tensor::randn({16, 12}, gen);
  const Tensor w20 = Tensor::randn({5, 16}, gen), r = Tensor::randn({6, 5}, gen);
  std::vector<Tensor> results[2];
  for (int on = 0; on < 2; ++on) {
    autograd::set_bf16_fusions(on == 1);
    Tensor h = h0.clone(), w1 = w10.clone(), w2 = w20.clone();
    for (Tensor* t : {&h, &w1, &w2}) t->set_requires_grad(true);
    autograd::AutocastScope scope(autograd::Precision::BF16);
    const auto fused = dispatch_count(DeviceType::kCpu, Op::kUnaryBf16) +
                       dispatch_count(DeviceType::kCpu, Op::kUnaryBackwardBf16);
    const Tensor y = gelu_linear(linear(h, w1, Tensor()), w2, Tensor());
    sum(mul(y, r)).backward();
    EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kUnaryBf16) +
                  dispatch_count(DeviceType::kCpu, Op::kUnaryBackwardBf16) - fused,
              on == 1 ? 2u : 0u);
    results[on] = {y, h.grad(), w1.grad(), w2.grad()};
  }
  expect_same_bits(results[0], results[1], {"output", "dh", "dW1", "dW2"});
}

}  // namespace
}  // namespace hpm
