// bf16 autocast (autograd/autocast.h) on the seeds' models: the scope's rules, and gradients of a
// GPT within bf16's tolerance of f32's.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "common/attention.h"
#include "common/models.h"
#include "hpm/autograd/autocast.h"
#include "hpm/autograd/ops.h"
#include "hpm/nn/gpt.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/objective.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

using autograd::AutocastScope;
using autograd::Precision;

#define SKIP_WITHOUT_NATIVE_BF16() \
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16"

TEST(Autocast, ScopesNestPerThread) {
  SKIP_WITHOUT_NATIVE_BF16();
  EXPECT_EQ(autograd::autocast_precision(), Precision::F32);
  {
    AutocastScope bf16(Precision::BF16);
    EXPECT_EQ(autograd::autocast_precision(), Precision::BF16);
    std::thread([] { EXPECT_EQ(autograd::autocast_precision(), Precision::F32); }).join();
    {
      AutocastScope f32(Precision::F32);
      EXPECT_EQ(autograd::autocast_precision(), Precision::F32);
    }
    EXPECT_EQ(autograd::autocast_precision(), Precision::BF16);
  }
  EXPECT_EQ(autograd::autocast_precision(), Precision::F32);
}

TEST(Autocast, NamesPrecisionsAndRefusesOthers) {
  EXPECT_EQ(autograd::parse_precision("bf16"), Precision::BF16);
  EXPECT_STREQ(autograd::precision_name(Precision::F32), "f32");
  try {
    autograd::parse_precision("fp16");
    FAIL() << "fp16 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "precision must be \"f32\" or \"bf16\", got \"fp16\"");
  }
}

// Where bf16 is not native the scope refuses, naming the instruction set; where it is, it opens.
TEST(Autocast, Bf16OnlyWhereNative) {
  if (kernels::native_bf16()) {
    EXPECT_NO_THROW(AutocastScope(Precision::BF16));
    return;
  }
  try {
    AutocastScope bf16(Precision::BF16);
    FAIL() << "bf16 accepted without AVX512_BF16";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("AVX512_BF16"), std::string::npos) << e.what();
  }
}

// A Linear under bf16: outputs f32, equal to the product of the rounded operands.
TEST(Autocast, LinearComputesOnRoundedOperands) {
  SKIP_WITHOUT_NATIVE_BF16();
  Generator gen(1);
  const Tensor x = Tensor::randn({5, 7}, gen), w = Tensor::randn({3, 7}, gen);
  const Tensor b = Tensor::randn({3}, gen);
  Tensor y;
  {
    AutocastScope bf16(Precision::BF16);
    y = linear(x, w, b);
  }
  ASSERT_EQ(y.dtype(), DType::F32);
  const Tensor want = kernels::linear(kernels::to_f32(kernels::to_bf16(x)),
                                      kernels::to_f32(kernels::to_bf16(w)), b);
  const auto got = y.to_vector(), exp = want.to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], exp[i], 1e-5f) << i;
}

// A convolution runs in bf16 only where each output sums at least 32 products: a 3x3 over one
// channel (9) computes exactly what f32 does, a 3x3 over 4 channels (36) on rounded operands.
TEST(Autocast, ConvolutionsInBf16OnlyWhereTheyPay) {
  SKIP_WITHOUT_NATIVE_BF16();
  Generator gen(2);
  kernels::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  for (const std::int64_t channels : {1, 4}) {
    const Tensor x = Tensor::randn({2, channels, 6, 6}, gen);
    const Tensor w = Tensor::randn({8, channels, 3, 3}, gen), b = Tensor::randn({8}, gen);
    Tensor y;
    {
      AutocastScope bf16(Precision::BF16);
      y = conv2d(x, w, b, p);
    }
    const auto got = y.to_vector();
    if (channels == 1) {
      EXPECT_EQ(got, kernels::conv2d_forward(x, w, b, p).to_vector());
      continue;
    }
    const auto rounded = [](const Tensor& t) { return kernels::to_f32(kernels::to_bf16(t)); };
    const auto want = kernels::conv2d_forward(rounded(x), rounded(w), b, p).to_vector();
    const auto exact = kernels::conv2d_forward(x, w, b, p).to_vector();
    EXPECT_NE(got, exact) << "36 products per output: bf16";
    EXPECT_EQ(got, rounded(y).to_vector()) << "the output is rounded to bf16";
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-4f + std::ldexp(std::fabs(want[i]), -8)) << i;
  }
}

// The fused Conv2d + ReLU + MaxPool2d 2x2/2 has no conversion passes to pay for, so it takes bf16
// even over one input channel, where the convolution alone stays f32.
TEST(Autocast, FusedConvReluPoolInBf16AtAnySize) {
  SKIP_WITHOUT_NATIVE_BF16();
  Generator gen(3);
  kernels::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const Tensor x = Tensor::randn({2, 1, 8, 8}, gen);
  const Tensor w = Tensor::randn({16, 1, 3, 3}, gen), b = Tensor::randn({16}, gen);
  const kernels::Pool2dParams pool;
  Tensor y;
  {
    AutocastScope bf16(Precision::BF16);
    y = conv2d_relu_max_pool2d(x, w, b, p, pool);
  }
  const auto rounded = [](const Tensor& t) { return kernels::to_f32(kernels::to_bf16(t)); };
  Tensor argmax;
  kernels::Conv2dParams relu = p;
  relu.relu = true;
  const auto exact =
      kernels::max_pool2d_forward(kernels::conv2d_forward(x, w, b, relu), pool, argmax).to_vector();
  const auto got = y.to_vector();
  EXPECT_NE(got, exact) << "9 products per output, fused: bf16";
  EXPECT_EQ(got, rounded(y).to_vector()) << "the output is rounded to bf16";
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], exact[i], 2e-2f * (1.0f + std::fabs(exact[i]))) << i;
}

// ||got - want|| / ||want||, over all elements.
double normwise_error(const Tensor& got, const Tensor& want) {
  const auto g = got.to_vector(), w = want.to_vector();
  double diff2 = 0, norm2 = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    diff2 += std::pow(static_cast<double>(g[i]) - w[i], 2);
    norm2 += std::pow(static_cast<double>(w[i]), 2);
  }
  return std::sqrt(diff2 / norm2);
}

// Attention under bf16 (its products on bf16 operands, query blocks batched across heads)
// against the f32 fused op on the same bf16-rounded q, k, v: the probabilities, dO and dS are
// rounded for the products, so values and gradients agree to bf16's ~2^-9 carried through, and
// differ (the products did round). Shapes: a partial last block of 64 rows (150 and 100 queries),
// more keys than queries, and 20 heads of 150 keys: two chunks of heads (13 fit in 512 KiB).
TEST(Autocast, AttentionInBf16WithinToleranceOfF32) {
  SKIP_WITHOUT_NATIVE_BF16();
  Generator gen(7);
  struct Case {
    std::int64_t b, h, t, s;
    bool causal;
  };
  for (const Case c : {Case{2, 3, 150, 150, true}, Case{2, 3, 100, 130, false},
                       Case{4, 5, 150, 150, true}, Case{1, 2, 64, 64, true}}) {
    SCOPED_TRACE(std::to_string(c.b * c.h) + " heads, " + std::to_string(c.t) + " x " +
                 std::to_string(c.s) + (c.causal ? " causal" : ""));
    const auto rounded = [](const Tensor& t) { return kernels::to_f32(kernels::to_bf16(t)); };
    const Tensor q = rounded(Tensor::randn({c.b, c.h, c.t, 24}, gen));
    const Tensor k = rounded(Tensor::randn({c.b, c.h, c.s, 24}, gen));
    const Tensor v = rounded(Tensor::randn({c.b, c.h, c.s, 24}, gen));
    const Tensor g = Tensor::randn({c.b, c.h, c.t, 24}, gen);
    Tensor outs[2];
    std::vector<Tensor> grads[2];
    for (const Precision p : {Precision::F32, Precision::BF16}) {
      const int i = p == Precision::BF16;
      Tensor qq = q.clone().set_requires_grad(true), kk = k.clone().set_requires_grad(true),
             vv = v.clone().set_requires_grad(true);
      {
        AutocastScope scope(p);
        outs[i] = scaled_dot_product_attention(qq, kk, vv, c.causal);
        outs[i].backward(g);
      }
      grads[i] = {qq.grad(), kk.grad(), vv.grad()};
    }
    EXPECT_LT(normwise_error(outs[1], outs[0]), 1e-2) << "output";
    EXPECT_GT(normwise_error(outs[1], outs[0]), 0.0) << "output: the products did not round";
    const char* names[] = {"grad q", "grad k", "grad v"};
    for (int i = 0; i < 3; ++i)
      EXPECT_LT(normwise_error(grads[1][i], grads[0][i]), 2e-2) << names[i];
    if (c.causal) {  // query 0 sees key 0 alone: its output is v[0] exactly
      for (int e = 0; e < 24; ++e) EXPECT_EQ(outs[1].data<float>()[e], v.data<float>()[e]);
    }
  }
}

// Under bf16 the packed op rounds q, k and v while it splits them, as the composed ops round the
// split heads: the same bf16 kernels on the same bits, values and gradients equal.
TEST(Autocast, PackedAttentionInBf16EqualsTheComposedOps) {
  SKIP_WITHOUT_NATIVE_BF16();
  Generator gen(8);
  const Tensor qkv = Tensor::randn({2, 150, 3 * 3 * 24}, gen);
  const Tensor g = Tensor::randn({2, 150, 3 * 24}, gen);
  Tensor outs[2], grads[2];
  for (int packed = 0; packed < 2; ++packed) {
    Tensor x = qkv.clone().set_requires_grad(true);
    {
      AutocastScope scope(Precision::BF16);
      outs[packed] =
          packed ? packed_self_attention(x, 3) : test::composed_packed_attention(x, 3, true);
      outs[packed].backward(g);
    }
    grads[packed] = x.grad();
  }
  EXPECT_EQ(outs[1].to_vector(), outs[0].to_vector());
  EXPECT_EQ(grads[1].to_vector(), grads[0].to_vector());
}

// Every parameter gradient of `model` on `batch` under bf16 within `tolerance` (normwise
// relative) of f32's, and not equal (the products did round).
void expect_bf16_gradients_near_f32(nn::Module& model, const nn::Objective& objective,
                                    const nn::Batch& batch, double tolerance) {
  const auto gradients = [&](Precision p) {
    model.zero_grad();
    AutocastScope scope(p);
    const autograd::Bf16OutputsScope outputs(objective.reads_bf16_outputs());  // as a step does
    objective.compute(model.forward(batch.inputs), batch).loss.backward();
    std::vector<std::vector<float>> g;
    for (const auto& [name, t] : model.named_parameters()) g.push_back(t.grad().to_vector());
    return g;
  };
  const auto f32 = gradients(Precision::F32), bf16 = gradients(Precision::BF16);
  const auto names = model.named_parameters();
  bool any_different = false;
  for (std::size_t i = 0; i < f32.size(); ++i) {
    double diff2 = 0, norm2 = 0;
    for (std::size_t j = 0; j < f32[i].size(); ++j) {
      diff2 += std::pow(static_cast<double>(bf16[i][j]) - f32[i][j], 2);
      norm2 += std::pow(static_cast<double>(f32[i][j]), 2);
    }
    EXPECT_LE(std::sqrt(diff2), tolerance * std::sqrt(norm2)) << names[i].first;
    any_different |= diff2 > 0;
  }
  EXPECT_TRUE(any_different) << "bf16 computed exactly what f32 did: the products did not round";
}

// bf16 keeps 8 bits, so each rounded operand is off by up to 2^-9 relative; a GPT's smooth
// functions (GELU, softmax, layer norm) carry that into its gradients at ~1e-2.
TEST(Autocast, GptGradientsWithinBf16ToleranceOfF32) {
  SKIP_WITHOUT_NATIVE_BF16();
  nn::GPTConfig c = testing::tiny_gpt_config();
  c.n_embd = 64;
  c.n_head = 4;
  c.block_size = 16;
  manual_seed(11);
  nn::GPT model(c);
  expect_bf16_gradients_near_f32(model, nn::LanguageModelling(),
                                 testing::token_batch(8, 16, c.vocab_size, 5), 2e-2);
}

// The cnn of ../shared/peers/README.md (convolutions on oneDNN's bf16 primitives, a bf16 head),
// on 8 x 8 images. Its ReLUs and max pools choose: a rounding of 2^-9 moves a pooling window's
// maximum, or a unit across zero, wherever two candidates are that close, and each such flip
// sends a whole gradient term elsewhere. Measured here: weight gradients 5-8% (normwise) from
// f32's, at 32 rows and at 512 alike, where the kernels themselves hold 1e-4 of f32 on the same
// rounded operands (Bf16.ConvolutionEqualsF32ConvolutionOfRoundedOperands). The loss moves by
// far less.
TEST(Autocast, CnnGradientsWithinBf16ToleranceOfF32) {
  SKIP_WITHOUT_NATIVE_BF16();
  manual_seed(12);
  nn::Sequential cnn({std::make_shared<nn::Conv2d>(nn::Conv2dOptions{1, 32, 3, 1, 1}),
                      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
                      std::make_shared<nn::Conv2d>(nn::Conv2dOptions{32, 64, 3, 1, 1}),
                      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
                      std::make_shared<nn::Flatten>(),
                      std::make_shared<nn::Linear>(64 * 2 * 2, 128), std::make_shared<nn::ReLU>(),
                      std::make_shared<nn::Linear>(128, 4)});
  const nn::Batch batch = testing::image_batch(32, 3);
  expect_bf16_gradients_near_f32(cnn, nn::Classification(), batch, 0.15);
  const auto loss = [&](Precision p) {
    AutocastScope scope(p);
    return nn::Classification().compute(cnn.forward(batch.inputs), batch).loss.item();
  };
  EXPECT_NEAR(loss(Precision::BF16), loss(Precision::F32), 5e-3 * loss(Precision::F32));
}

// What forward keeps for backward (the activations; Device accounting counts the real bytes): in
// bf16 the products' inputs, GELU's and layer norm's inputs and attention's q, k, v and output
// are bf16 copies, so a GPT holds about half the bytes, as the issue asks (at most 0.55x; 0.51
// here, the rest f32 statistics, logits and the cross-entropy's).
TEST(Autocast, GptKeepsAboutHalfTheActivationBytes) {
  SKIP_WITHOUT_NATIVE_BF16();
  nn::GPTConfig c = testing::tiny_gpt_config();
  c.n_embd = 64;
  c.n_head = 4;
  c.block_size = 32;
  c.n_layer = 4;
  // Kernels allocate next to their inputs: the model and the batch live on the measured Device.
  Device device("activations");
  DeviceGuard on(device);
  manual_seed(13);
  nn::GPT model(c);
  const nn::Batch batch = testing::token_batch(8, 32, c.vocab_size, 6);
  Tensor x = Tensor::empty(batch.inputs.shape(), DType::I64, device);
  x.copy_(batch.inputs);
  Tensor y = Tensor::empty(batch.targets.shape(), DType::I64, device);
  y.copy_(batch.targets);
  const auto held = [&](Precision p) {
    const std::size_t before = device.stats().current_bytes;
    AutocastScope scope(p);
    Tensor loss = nn::LanguageModelling().compute(model.forward(x), {x, y}).loss;
    const std::size_t kept = device.stats().current_bytes - before;
    loss.backward();
    model.zero_grad();
    return static_cast<double>(kept);
  };
  const double f32 = held(Precision::F32), bf16 = held(Precision::BF16);
  EXPECT_LE(bf16, 0.55 * f32) << "f32 " << f32 << " bytes, bf16 " << bf16;
  EXPECT_GE(bf16, 0.4 * f32) << "f32 " << f32 << " bytes, bf16 " << bf16;
}

}  // namespace
}  // namespace hpm
