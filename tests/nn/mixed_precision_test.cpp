// bf16 autocast (autograd/autocast.h) on the seeds' models: the scope's rules, and gradients of a
// GPT within bf16's tolerance of f32's.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "common/models.h"
#include "hpm/autograd/autocast.h"
#include "hpm/autograd/ops.h"
#include "hpm/nn/gpt.h"
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

// Every parameter gradient of a GPT under bf16 within 2e-2 (normwise relative) of f32's: bf16
// keeps 8 bits, so each rounded operand is off by up to 2^-9 relative, and a gradient sums many.
TEST(Autocast, GptGradientsWithinBf16ToleranceOfF32) {
  SKIP_WITHOUT_NATIVE_BF16();
  nn::GPTConfig c = testing::tiny_gpt_config();
  c.n_embd = 64;
  c.n_head = 4;
  c.block_size = 16;
  manual_seed(11);
  nn::GPT model(c);
  const nn::Batch batch = testing::token_batch(8, 16, c.vocab_size, 5);
  const nn::LanguageModelling objective;
  const auto gradients = [&](Precision p) {
    model.zero_grad();
    AutocastScope scope(p);
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
    EXPECT_LE(std::sqrt(diff2), 2e-2 * std::sqrt(norm2)) << names[i].first;
    any_different |= diff2 > 0;
  }
  EXPECT_TRUE(any_different) << "bf16 computed exactly what f32 did: the products did not round";
}

}  // namespace
}  // namespace hpm
