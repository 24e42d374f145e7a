// nn::LanguageModelling with label smoothing: the loss is the smoothed cross-entropy over the
// counted tokens (ignored positions excluded), as Classification smooths per row; evaluation
// measures without the smoothing.
#include "hpm/nn/objective.h"

#include <gtest/gtest.h>

#include <vector>

#include "hpm/tensor/random.h"

namespace hpm::nn {
namespace {

TEST(LanguageModelling, LabelSmoothingSmoothsTheTrainingLossNotTheEvaluation) {
  Generator gen(7);
  const Tensor logits = Tensor::randn({2, 3, 5}, gen);
  const std::vector<std::int64_t> next = {1, 4, -100, 0, 2, 3};
  const Batch batch{Tensor::zeros({2, 3}, DType::I64), Tensor::from_i64(next, {2, 3})};
  const LanguageModelling plain, smoothed(-100, 0.1f);

  const ObjectiveResult s = smoothed.compute(logits, batch);
  EXPECT_FLOAT_EQ(s.loss.item(), cross_entropy(logits, batch.targets, 0.1f, -100).item());
  EXPECT_NE(s.loss.item(), plain.compute(logits, batch).loss.item());
  EXPECT_EQ(smoothed.weight(batch), 5.0) << "the ignored position is not a unit";
  EXPECT_EQ(s.metrics.count("token_accuracy"), 5.0);

  // Evaluation: the same objective without the smoothing.
  EXPECT_EQ(plain.evaluation(), &plain);
  const Objective* eval = smoothed.evaluation();
  ASSERT_NE(eval, nullptr);
  EXPECT_NE(eval, &smoothed);
  EXPECT_EQ(eval->compute(logits, batch).loss.item(), plain.compute(logits, batch).loss.item());
  EXPECT_EQ(eval->name(), "language_modelling");
}

}  // namespace
}  // namespace hpm::nn
