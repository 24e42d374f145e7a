// The replica step's precision: forward and backward under its autocast scope, and a model's
// outputs in bf16 only for an objective that reads them so (autograd::Bf16OutputsScope).
#include "hpm/distribute/replica_step.h"

#include <gtest/gtest.h>

#include "common/models.h"
#include "hpm/autograd/autocast.h"
#include "hpm/nn/gpt.h"
#include "hpm/nn/objective.h"
#include "hpm/tensor/backend.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::distribute {
namespace {

using autograd::AutocastScope;
using autograd::Precision;

// A language modelling objective, recording the dtype of the logits it was handed.
class RecordingObjective : public nn::LanguageModelling {
 public:
  explicit RecordingObjective(bool reads_bf16) : reads_bf16_(reads_bf16) {}
  nn::ObjectiveResult compute(const Tensor& outputs, const nn::Batch& batch) const override {
    seen = outputs.dtype();
    return LanguageModelling::compute(outputs, batch);
  }
  bool reads_bf16_outputs() const override { return reads_bf16_; }
  bool spends_outputs() const override { return true; }  // it reads nothing after its base
  mutable DType seen = DType::I64;

 private:
  bool reads_bf16_;
};

// A GPT's logits are bf16 (the classifier's product writes them so, as under torch.autocast)
// only in a training step under bf16 with the fusions on, whose objective reads them as they
// are: f32 for any other objective (distillation's losses), outside a step (evaluation,
// sampling), in f32 and with the fusions off.
TEST(ReplicaStep, GptLogitsAreBf16OnlyForAnObjectiveThatReadsThem) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  nn::GPTConfig c = testing::tiny_gpt_config();
  manual_seed(14);
  nn::GPT model(c);
  const nn::Batch batch = testing::token_batch(4, 8, c.vocab_size, 7);
  const auto step = [&](bool reads_bf16, Precision p) {
    const RecordingObjective objective(reads_bf16);
    ReplicaStepOptions o;
    o.precision = p;
    model.zero_grad();
    const auto r = replica_step(model, objective, batch, o);
    EXPECT_TRUE(r.finite);
    return objective.seen;
  };
  const bool fusions = autograd::bf16_fusions();
  autograd::set_bf16_fusions(true);
  EXPECT_EQ(step(true, Precision::BF16), DType::BF16);
  EXPECT_EQ(step(false, Precision::BF16), DType::F32);
  EXPECT_EQ(step(true, Precision::F32), DType::F32);
  autograd::set_bf16_fusions(false);
  EXPECT_EQ(step(true, Precision::BF16), DType::F32);
  autograd::set_bf16_fusions(true);
  {
    AutocastScope bf16(Precision::BF16);
    EXPECT_EQ(model.forward(batch.inputs).dtype(), DType::F32);  // outside a step
  }
  autograd::set_bf16_fusions(fusions);
}

// A micro-batch whose targets are all ignored counts nothing: the step is the whole batch's, its
// loss finite and its gradients those of one micro-batch. Its own mean (0/0) stopped the run.
TEST(ReplicaStep, AMicroBatchWithNothingCountedAddsNothing) {
  nn::GPTConfig c = testing::tiny_gpt_config();
  manual_seed(14);
  nn::GPT model(c);
  nn::Batch batch = testing::token_batch(4, 8, c.vocab_size, 7);
  std::int64_t* y = batch.targets.data<std::int64_t>();
  for (std::int64_t i = 2 * 8; i < 4 * 8; ++i) y[i] = -100;  // rows 2 and 3: nothing to learn
  const nn::LanguageModelling objective;
  const auto step = [&](int micro) {
    ReplicaStepOptions o;
    o.micro_batches = micro;
    model.zero_grad();
    const ReplicaStepResult r = replica_step(model, objective, batch, o);
    std::vector<float> grads;
    for (const auto& [name, p] : model.named_parameters()) {
      const std::vector<float> g = p.grad().to_vector();
      grads.insert(grads.end(), g.begin(), g.end());
    }
    return std::pair{r, grads};
  };
  const auto [whole, whole_grads] = step(1);
  const auto [halves, halves_grads] = step(2);
  ASSERT_TRUE(whole.finite);
  EXPECT_TRUE(halves.finite);
  EXPECT_NEAR(halves.metrics.mean("loss"), whole.metrics.mean("loss"), 1e-6);
  EXPECT_EQ(halves.metrics.count("loss"), 16.0);
  ASSERT_EQ(halves_grads.size(), whole_grads.size());
  for (std::size_t i = 0; i < whole_grads.size(); ++i)
    EXPECT_NEAR(halves_grads[i], whole_grads[i], 1e-5f + 1e-4f * std::abs(whole_grads[i])) << i;
}

// A language modelling objective that keeps a handle on the outputs it gets: its cross-entropy
// must leave them as they are (the separate forward and backward passes).
class KeepingObjective : public nn::LanguageModelling {
 public:
  nn::ObjectiveResult compute(const Tensor& outputs, const nn::Batch& batch) const override {
    kept = outputs;
    return LanguageModelling::compute(outputs, batch);
  }
  bool reads_bf16_outputs() const override { return true; }
  bool spends_outputs() const override { return true; }  // wrongly: its handle must protect them
  mutable Tensor kept;
};

// A training step's outputs are spent once its objective has the loss: a GPT's cross-entropy
// writes the logits' gradient in its forward (one kernel over them, none in backward), with the
// gradients of the separate passes, bit for bit, in f32 and in bf16.
TEST(ReplicaStep, SpendsTheLogitsOnTheirLossWithTheSameGradients) {
  nn::GPTConfig c = testing::tiny_gpt_config();
  const nn::Batch batch = testing::token_batch(4, 8, c.vocab_size, 7);
  const bool fusions = autograd::bf16_fusions();
  autograd::set_bf16_fusions(true);
  for (const Precision p : {Precision::F32, Precision::BF16}) {
    if (p == Precision::BF16 && !kernels::native_bf16()) continue;
    SCOPED_TRACE(p == Precision::BF16 ? "bf16" : "f32");
    std::vector<float> grads[2];
    for (const bool keep : {false, true}) {
      manual_seed(14);
      nn::GPT model(c);
      const nn::LanguageModelling spends;
      const KeepingObjective keeps;
      ReplicaStepOptions o;
      o.precision = p;
      const auto fused0 = dispatch_count(DeviceType::kCpu, Op::kCrossEntropyWithGradient);
      const ReplicaStepResult r =
          replica_step(model, keep ? static_cast<const nn::Objective&>(keeps) : spends, batch, o);
      EXPECT_TRUE(r.finite);
      EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kCrossEntropyWithGradient) - fused0,
                keep ? 0u : 1u);
      for (const auto& [name, param] : model.named_parameters()) {
        const std::vector<float> g = param.grad().to_vector();
        grads[keep].insert(grads[keep].end(), g.begin(), g.end());
      }
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (std::size_t i = 0; i < grads[0].size(); ++i) ASSERT_EQ(grads[0][i], grads[1][i]) << i;
  }
  autograd::set_bf16_fusions(fusions);
}

// A subclass of a spending objective that reads the outputs after its base's loss (a term of its
// own on the logits) finds them as they were: it spends nothing unless it says so.
class ReadingAfterObjective : public nn::LanguageModelling {
 public:
  nn::ObjectiveResult compute(const Tensor& outputs, const nn::Batch& batch) const override {
    before = outputs.to(Device::cpu()).to_vector();
    nn::ObjectiveResult r = LanguageModelling::compute(outputs, batch);
    after = outputs.to(Device::cpu()).to_vector();
    return r;
  }
  mutable std::vector<float> before, after;
};

TEST(ReplicaStep, LeavesTheOutputsToASubclassThatReadsThemAfterItsBase) {
  nn::GPTConfig c = testing::tiny_gpt_config();
  manual_seed(14);
  nn::GPT model(c);
  const ReadingAfterObjective objective;
  EXPECT_FALSE(objective.spends_outputs());
  EXPECT_TRUE(nn::LanguageModelling().spends_outputs());
  const auto fused0 = dispatch_count(DeviceType::kCpu, Op::kCrossEntropyWithGradient);
  EXPECT_TRUE(
      replica_step(model, objective, testing::token_batch(4, 8, c.vocab_size, 7), {}).finite);
  EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kCrossEntropyWithGradient) - fused0, 0u);
  ASSERT_FALSE(objective.before.empty());
  EXPECT_EQ(objective.after, objective.before);
}

}  // namespace
}  // namespace hpm::distribute
