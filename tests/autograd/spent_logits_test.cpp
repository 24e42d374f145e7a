// cross_entropy over spent logits (logits_spent: nothing reads them after the loss): the forward
// writes their gradient over them (kernels::cross_entropy_with_gradient_) and the backward only
// scales it. The losses, predictions and gradients are those of the separate passes, bit for bit
// where the upstream gradient is 1, in f32 and under bf16 autocast; and the logits stay as they
// are wherever anything else could still read them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/same_bits.h"
#include "hpm/autograd/autocast.h"
#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/ops.h"
#include "hpm/tensor/backend.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

using testing::expect_same_bits;

// Each pair the same bits.
void expect_same_bits_each(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                           const std::vector<const char*>& names) {
  for (std::size_t i = 0; i < got.size(); ++i) expect_same_bits(got[i], want[i], names[i]);
}

// A classifier's logits (10, 40) from x (10, 16) and w (40, 16), labels with an ignored row.
struct Classifier {
  Tensor x, w, labels;
  Classifier() {
    Generator gen(31);
    x = Tensor::randn({10, 16}, gen);
    w = Tensor::randn({40, 16}, gen);
    std::vector<std::int64_t> y;
    for (int i = 0; i < 10; ++i) y.push_back((i * 7) % 40);
    y[3] = -100;
    labels = Tensor::from_i64(y, Shape{10});
  }
};

struct Outcome {
  Tensor loss, predicted, dx, dw;
  std::uint64_t fused = 0, separate = 0;  // the ops each path dispatched
};

// The loss of linear(x, w) (times `factor` when not 1) and its gradients; the logits' handle
// dropped before backward, as a training step drops its outputs. With bf16_head, the logits are
// those of a GPT's head under bf16 autocast: layer_norm_linear's product writing them in bf16.
Outcome run(const Classifier& c, bool spent, float factor = 1.0f, float smoothing = 0.1f,
            bool bf16_head = false) {
  Tensor x = c.x.clone(), w = c.w.clone();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const auto fused0 = dispatch_count(DeviceType::kCpu, Op::kCrossEntropyWithGradient);
  const auto separate0 = dispatch_count(DeviceType::kCpu, Op::kCrossEntropyBackward) +
                         dispatch_count(DeviceType::kCpu, Op::kCrossEntropyBackwardBf16);
  Outcome o;
  Tensor logits = bf16_head ? layer_norm_linear(x, Tensor::ones({16}), Tensor::zeros({16}), 1e-5f,
                                                w, Tensor(), DType::BF16)
                            : linear(x, w, Tensor());
  EXPECT_EQ(logits.dtype(), bf16_head ? DType::BF16 : DType::F32);
  o.loss = cross_entropy(logits, c.labels, smoothing, -100, &o.predicted, spent);
  logits = Tensor();
  (factor == 1.0f ? o.loss : mul(o.loss, factor)).backward();
  o.dx = x.grad();
  o.dw = w.grad();
  o.fused = dispatch_count(DeviceType::kCpu, Op::kCrossEntropyWithGradient) - fused0;
  o.separate = dispatch_count(DeviceType::kCpu, Op::kCrossEntropyBackward) +
               dispatch_count(DeviceType::kCpu, Op::kCrossEntropyBackwardBf16) - separate0;
  return o;
}

TEST(SpentLogits, GiveTheSeparatePassesLossesAndGradientsBitForBit) {
  const Classifier c;
  for (const float smoothing : {0.0f, 0.1f}) {
    const Outcome separate = run(c, false, 1.0f, smoothing), fused = run(c, true, 1.0f, smoothing);
    EXPECT_EQ(separate.fused, 0u);
    EXPECT_EQ(separate.separate, 1u);
    EXPECT_EQ(fused.fused, 1u);  // one pass over the logits, and no backward pass over them
    EXPECT_EQ(fused.separate, 0u);
    expect_same_bits_each({fused.loss, fused.dx, fused.dw},
                          {separate.loss, separate.dx, separate.dw}, {"loss", "dx", "dw"});
    EXPECT_EQ(fused.predicted.to_vector_i64(), separate.predicted.to_vector_i64());
  }
}

// An upstream gradient other than 1 scales the gradient in the backward (scale_by_): the
// separate passes' values to rounding (they scale by grad / count, these by 1 / count, then grad).
TEST(SpentLogits, ScaleTheirGradientByTheUpstreamOne) {
  const Classifier c;
  const Outcome separate = run(c, false, 2.5f), fused = run(c, true, 2.5f);
  EXPECT_EQ(fused.fused, 1u);
  for (const auto& [got, want] : {std::pair{fused.dx, separate.dx}, {fused.dw, separate.dw}}) {
    const std::vector<float> g = got.to_vector(), e = want.to_vector();
    ASSERT_EQ(g.size(), e.size());
    for (std::size_t i = 0; i < e.size(); ++i)
      EXPECT_NEAR(g[i], e[i], 1e-6f * (1.0f + std::abs(e[i]))) << i;
  }
}

// Under bf16 autocast the classifier's product writes bf16 logits and takes their gradient in
// bf16: written over them in the forward, the same bits as cross_entropy_backward_bf16's.
TEST(SpentLogits, UnderBf16AutocastHandTheProductTheSameBf16Gradient) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "bf16 autocast needs AVX512_BF16";
  const bool fusions = autograd::bf16_fusions();
  autograd::set_bf16_fusions(true);
  const Classifier c;
  Outcome outcomes[2];
  for (const bool spent : {false, true}) {
    const autograd::AutocastScope bf16(autograd::Precision::BF16);
    const autograd::Bf16OutputsScope outputs(true);
    outcomes[spent] = run(c, spent, 1.0f, 0.1f, /*bf16_head=*/true);
  }
  autograd::set_bf16_fusions(fusions);
  EXPECT_EQ(outcomes[1].fused, 1u);
  EXPECT_EQ(outcomes[1].separate, 0u);
  expect_same_bits_each({outcomes[1].loss, outcomes[1].dx, outcomes[1].dw},
                        {outcomes[0].loss, outcomes[0].dx, outcomes[0].dw}, {"loss", "dx", "dw"});
}

// Logits anything else could read keep their values: another handle, a view of their memory, no
// gradient wanted (grad mode off, or logits that do not require one), or no word that they are
// spent.
TEST(SpentLogits, AreLeftAsTheyAreWhereAnythingElseCouldReadThem) {
  const Classifier c;
  Generator gen(5);
  const auto untouched = [&](auto&& make, bool spent, const char* what) {
    SCOPED_TRACE(what);
    const auto fused0 = dispatch_count(DeviceType::kCpu, Op::kCrossEntropyWithGradient);
    Tensor logits, keep;
    make(logits, keep);
    const std::vector<float> before = logits.to_vector();
    cross_entropy(logits, c.labels, 0.0f, -100, nullptr, spent);
    EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kCrossEntropyWithGradient) - fused0, 0u);
    EXPECT_EQ(logits.to_vector(), before);
  };
  const auto leaf = [&](Tensor& logits, Tensor&) {
    logits = Tensor::randn({10, 40}, gen);
    logits.set_requires_grad(true);
  };
  untouched(leaf, false, "not spent");
  untouched(
      [&](Tensor& logits, Tensor& keep) {
        leaf(logits, keep);
        keep = logits;
      },
      true, "another handle");
  untouched(
      [&](Tensor& logits, Tensor& keep) {
        leaf(keep, keep);
        logits = reshape(keep, {10, 40});
      },
      true, "a view");
  untouched(
      [&](Tensor& logits, Tensor&) {
        logits = Tensor::randn({10, 40}, gen);
      },
      true, "no gradient wanted");
  const autograd::NoGradGuard no_grad;
  untouched(leaf, true, "grad mode off");
}

// The gradient is scaled in place and no logits remain to recompute it from: a second backward
// through the loss is the engine's error, not a twice-scaled gradient.
TEST(SpentLogits, RefuseASecondBackward) {
  const Classifier c;
  Tensor w = c.w.clone();
  w.set_requires_grad(true);
  const Tensor loss = cross_entropy(linear(c.x, w, Tensor()), c.labels, 0.0f, -100, nullptr, true);
  loss.backward();
  EXPECT_THROW(loss.backward(), std::logic_error);
}

// The scope a training step opens around its objective.
TEST(SpentLogits, OutputsSpentScopeNestsAndRestores) {
  EXPECT_FALSE(outputs_spent());
  {
    const OutputsSpentScope spent(true);
    EXPECT_TRUE(outputs_spent());
    {
      const OutputsSpentScope not_here(false);
      EXPECT_FALSE(outputs_spent());
    }
    EXPECT_TRUE(outputs_spent());
  }
  EXPECT_FALSE(outputs_spent());
}

}  // namespace
}  // namespace hpm
