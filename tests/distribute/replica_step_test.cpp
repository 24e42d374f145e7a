// The replica step's precision: forward and backward under its autocast scope, and a model's
// outputs in bf16 only for an objective that reads them so (autograd::Bf16OutputsScope).
#include "hpm/distribute/replica_step.h"

#include <gtest/gtest.h>

#include "common/models.h"
#include "hpm/autograd/autocast.h"
#include "hpm/nn/gpt.h"
#include "hpm/nn/objective.h"
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

}  // namespace
}  // namespace hpm::distribute
